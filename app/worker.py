"""Runs the engine off the GUI thread and hands every StepEvent over as a queued Qt signal.

Payloads are the engine's frozen dataclasses (never live tensors). Cancellation is a threading.Event the engine
checks between steps, so Stop takes effect within one step.
"""
from __future__ import annotations

import threading
import traceback
from typing import Callable, Sequence

from PySide6.QtCore import QObject, QThread, Signal


class EngineWorker(QObject):
    """One generation: ``run`` on a QThread; ``step``, ``finished`` and ``failed`` reach the GUI thread queued."""

    started = Signal(str)       # strategy label
    step = Signal(object)       # core.events.StepEvent
    finished = Signal(object)   # core.events.GenerationResult
    failed = Signal(str)        # a human-readable message; never shown in the token stream

    def __init__(self, make_engine: Callable[[], object], prompt_ids: Sequence[int], max_new_tokens: int) -> None:
        super().__init__()
        self._make_engine = make_engine
        self._prompt = list(prompt_ids)
        self._max_new = max_new_tokens
        self.cancel_event = threading.Event()

    def cancel(self) -> None:
        """Ask the engine to stop after the current step; the text so far is kept."""
        self.cancel_event.set()

    def run(self) -> None:
        try:
            engine = self._make_engine()
            self.started.emit(engine.strategy.label)
            for event in engine.stream(self._prompt, self._max_new, cancel=self.cancel_event):
                self.step.emit(event)
            self.finished.emit(engine.last_result)
        except Exception as exc:  # the GUI must survive any engine failure and show it as a dialog
            traceback.print_exc()
            self.failed.emit(f"{type(exc).__name__}: {exc}")


def start_worker(worker: EngineWorker, parent: QObject | None = None) -> QThread:
    """Move ``worker`` to a new QThread, start it, and clean both up when the run ends."""
    thread = QThread(parent)
    worker.moveToThread(thread)
    thread.started.connect(worker.run)
    worker.finished.connect(thread.quit)
    worker.failed.connect(thread.quit)
    thread.finished.connect(worker.deleteLater)
    thread.finished.connect(thread.deleteLater)
    thread.start()
    return thread
