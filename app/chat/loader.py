"""Loading a model pair off the GUI thread, with progress, cancellation and errors as signals."""
from __future__ import annotations

import threading
import traceback
from typing import Callable

from PySide6.QtCore import QObject, Signal

from app.settings import CUSTOM_PAIR, PairChoice

Progress = Callable[[str, float], None]


class LoadCancelled(Exception):
    """Raised inside the progress callback to abandon a load (the window is closing or another pair was chosen)."""


def load_backends(choice: PairChoice, progress: Progress) -> tuple[object, object]:
    """(target, draft) backends for ``choice`` via core.models; ``progress(message, fraction)`` as the load advances."""
    from core import models

    if choice.name == CUSTOM_PAIR:
        return models.load_custom_pair(choice.target_path, choice.draft_path, backend=choice.backend,
                                       device=choice.device, progress=progress)
    return models.load_pair(choice.name, backend=choice.backend, device=choice.device, progress=progress)


class ModelLoader(QObject):
    """Loads one pair on a QThread (start it with app.worker.start_worker); every payload reaches the GUI queued."""

    progress = Signal(float, str)   # fraction in [0, 1], message
    finished = Signal(object)       # (choice, (target, draft))
    failed = Signal(str)            # also ends the thread after a cancel (the window knows it asked)

    def __init__(self, choice: PairChoice, load: Callable[[PairChoice, Progress], tuple] = load_backends) -> None:
        super().__init__()
        self.choice = choice
        self._load = load
        self._cancel = threading.Event()

    @property
    def is_cancelled(self) -> bool:
        return self._cancel.is_set()

    def cancel(self) -> None:
        """Abandon the load at its next progress report."""
        self._cancel.set()

    def _report(self, message: str, fraction: float) -> None:
        if self._cancel.is_set():
            raise LoadCancelled()
        self.progress.emit(float(fraction), str(message))

    def run(self) -> None:
        try:
            pair = self._load(self.choice, self._report)
            if self._cancel.is_set():
                raise LoadCancelled()
            self.finished.emit((self.choice, tuple(pair)))
        except LoadCancelled:
            self.failed.emit("loading cancelled")
        except Exception as exc:  # any load failure becomes a dialog, never a crash
            traceback.print_exc()
            self.failed.emit(f"Could not load the {self.choice.label} model pair: {exc}")
