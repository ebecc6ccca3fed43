"""Where served requests decode: one thread, one request at a time, in the order they came.

The models belong to one engine thread (llama.cpp's OpenMP pool belongs to the thread that calls it; two callers slow
both): ``speclens serve`` runs its jobs on a :class:`JobThread`; the window hands them to its own engine thread, where
the chat's answers queue the same way (app.serve_host).
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Callable, Protocol, TypeVar

T = TypeVar("T")


class Executor(Protocol):
    def submit(self, fn: Callable[[], T]) -> Future:
        """Run ``fn()`` after the jobs submitted before it; the future holds its result or exception."""


class JobThread:
    """A thread running submitted jobs one after another."""

    def __init__(self, name: str = "speclens-serve-engine") -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], T]) -> Future:
        future: Future = Future()
        self._jobs.put((fn, future))
        return future

    def close(self) -> None:
        """Finish the jobs already submitted, then end the thread."""
        self._jobs.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (item := self._jobs.get()) is not None:
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:   # handed to whoever waits on the future
                future.set_exception(exc)
