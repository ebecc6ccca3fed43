"""Loading a model pair off the GUI thread, with progress, cancellation and errors as signals.

``load_backends`` is the one place that knows how a :class:`PairChoice` becomes two backends: it calls
``core.models.load_pair`` / ``load_custom_pair`` and, while that module is not installed, builds the tiny pair itself.
"""
from __future__ import annotations

import threading
import traceback
from pathlib import Path
from typing import Callable

from PySide6.QtCore import QObject, Signal

from app.settings import CUSTOM_PAIR, PairChoice

Progress = Callable[..., None]


class ModelLoadError(RuntimeError):
    """The pair could not be loaded; the message says which model and why."""


class LoadCancelled(Exception):
    """Raised inside the progress callback to abandon a load (the window is closing or another pair was chosen)."""


def _models():
    try:
        from core import models
    except ImportError:
        return None
    return models


def load_backends(choice: PairChoice, progress: Progress) -> tuple[object, object]:
    """(target, draft) backends for ``choice``; ``progress(fraction, message)`` is called as the load advances."""
    if choice.name == CUSTOM_PAIR:
        for role, path in (("target", choice.target_path), ("draft", choice.draft_path)):
            if not Path(path).exists():
                raise ModelLoadError(f"the {role} model {path!r} does not exist: choose an existing GGUF file or "
                                     "model folder in Settings")
    models = _models()
    if models is None:
        if choice.name != "tiny":
            raise ModelLoadError("core.models is not installed, so only the tiny pair can be loaded")
        from core.tiny import tiny_pair

        progress(0.0, "building the tiny model pair")
        pair = tiny_pair(device=choice.device)
        progress(1.0, "tiny model pair ready")
        return pair
    if choice.name == CUSTOM_PAIR:
        return models.load_custom_pair(choice.target_path, choice.draft_path, backend=choice.backend,
                                       device=choice.device, progress=progress)
    return models.load_pair(choice.name, backend=choice.backend, device=choice.device, progress=progress)


def as_fraction(args: tuple) -> tuple[float | None, str]:
    """Read a progress report: numbers give the fraction (``f`` or ``done, total``), a string the message."""
    numbers = [a for a in args if isinstance(a, (int, float)) and not isinstance(a, bool)]
    message = next((a for a in args if isinstance(a, str)), "")
    if len(numbers) >= 2 and numbers[1]:
        return max(0.0, min(1.0, numbers[0] / numbers[1])), message
    if numbers:
        return max(0.0, min(1.0, float(numbers[0]))), message
    return None, message


class ModelLoader(QObject):
    """Loads one pair on a QThread (start it with app.worker.start_worker); every payload reaches the GUI queued."""

    progress = Signal(object, str)  # fraction in [0, 1] or None (unknown), message
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

    def _report(self, *args) -> None:
        if self._cancel.is_set():
            raise LoadCancelled()
        fraction, message = as_fraction(args)
        self.progress.emit(fraction, message)

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
