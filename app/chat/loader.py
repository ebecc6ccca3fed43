"""Loading a model pair off the GUI thread (as an app.worker job), with progress and cancellation."""
from __future__ import annotations

from typing import Callable

from app.settings import CUSTOM_PAIR, PairChoice

Progress = Callable[[str, float], None]


class LoadCancelled(Exception):
    """Raised inside the progress callback to abandon a load (the window is closing or another pair was chosen)."""


def load_backends(choice: PairChoice, progress: Progress) -> tuple[object, object]:
    """(target, draft) backends for ``choice`` via core.models; ``progress(message, fraction)`` as the load advances."""
    from core import models

    if choice.name == CUSTOM_PAIR:
        return models.load_custom_pair(choice.target_path, choice.draft_path, backend=choice.backend,
                                       device=choice.device, progress=progress, context=choice.context)
    return models.load_pair(choice.name, backend=choice.backend, device=choice.device, progress=progress,
                            context=choice.context)


def load_job(choice: PairChoice, load: Callable[[PairChoice, Progress], tuple] | None = None):
    """A worker job that loads ``choice``, pushing ``(fraction, message)`` items, abandoned at the next progress
    report once cancelled."""
    load = load or load_backends

    def job(push, cancel):
        def report(message: str, fraction: float) -> None:
            if cancel.is_set():
                raise LoadCancelled("loading cancelled")
            push((float(fraction), str(message)))

        pair = load(choice, report)
        if cancel.is_set():
            raise LoadCancelled("loading cancelled")
        return tuple(pair)

    return job
