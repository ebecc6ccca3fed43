"""The window's Serve switch, headless: SpecLens's OpenAI-compatible server on the models the chat loaded.

Served requests decode on the app's one engine thread (app.worker), queued with the chat's own answers, so the two
never touch a model at once; what they decode reaches the GUI thread as immutable data at frame rate (``frame``), as
the chat's own answers do, and each finished request is kept (``served``) so that the window can list, open and
replay it. Nothing of a served request goes into the chat history unless the user keeps it.
"""
from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future
from typing import Callable

from PySide6.QtCore import QObject, Qt, QTimer, Signal, Slot

from app.worker import FRAME_HZ, engine_thread
from core.auto import Auto
from core.serve.background import ServerThread
from core.serve.job import Observer, ServedModels, ServedRecord

RECENT = 50   # served requests the window keeps to list and replay


class _OnEngineThread(QObject):
    """Lives on the engine thread and runs the jobs posted to it, in the order they came."""

    @Slot(object)
    def run(self, item) -> None:   # a slot of this object: queued calls run on the thread it lives on
        fn, future = item
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn())
        except BaseException as exc:   # handed to the request's handler
            future.set_exception(exc)


class EngineThreadExecutor(QObject):
    """core.serve.executor.Executor on the app's engine thread: callable from any thread (the HTTP server's)."""

    _post = Signal(object)

    def __init__(self) -> None:
        super().__init__()
        self._runner = _OnEngineThread()
        self._runner.moveToThread(engine_thread())
        self._post.connect(self._runner.run, Qt.ConnectionType.QueuedConnection)

    def submit(self, fn: Callable) -> Future:
        future: Future = Future()
        self._post.emit((fn, future))
        return future


class ServeMonitor(QObject, Observer):
    """What the engine thread reports of served requests, handed to the GUI thread: ``started`` (client, strategy),
    ``frame`` (the StepEvents since the last frame, at most FRAME_HZ a second), ``served`` (a ServedRecord)."""

    started_request = Signal(str, str)
    frame = Signal(tuple)
    served = Signal(object)
    queue_changed = Signal(int, int)       # waiting, running

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._lock = threading.Lock()
        self._steps: list = []
        self.records: deque[ServedRecord] = deque(maxlen=RECENT)
        self._timer = QTimer(self)
        self._timer.setInterval(round(1000 / FRAME_HZ))
        self._timer.timeout.connect(self._drain)
        self._timer.start()
        self.served.connect(self._keep, Qt.ConnectionType.QueuedConnection)

    # -- on the engine thread ------------------------------------------------------------------------------------
    def started(self, client, request, strategy) -> None:
        self.started_request.emit(client, strategy)

    def step(self, event) -> None:
        with self._lock:
            self._steps.append(event)

    def finished(self, record: ServedRecord) -> None:
        # the last steps go before the end, in order (both signals queue to the GUI thread)
        with self._lock:
            steps, self._steps = self._steps, []
        if steps:
            self.frame.emit(tuple(steps))
        self.served.emit(record)

    # -- on the GUI thread ---------------------------------------------------------------------------------------
    def _keep(self, record: ServedRecord) -> None:
        self.records.append(record)

    def _drain(self) -> None:
        with self._lock:
            steps, self._steps = self._steps, []
        if steps:
            self.frame.emit(tuple(steps))


class ServeHost(QObject):
    """Starts and stops the server on the chat's models; ``running``, ``url``."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.monitor = ServeMonitor(self)
        self.executor = EngineThreadExecutor()
        self.server: ServerThread | None = None

    @property
    def running(self) -> bool:
        return self.server is not None

    @property
    def url(self) -> str:
        return f"{self.server.url}/v1" if self.server is not None else ""

    def start(self, backends: tuple, name: str, port: int) -> None:
        """Serve ``backends`` as model ``name`` on loopback ``port``; OSError when the port cannot be used."""
        target, draft = backends
        models = ServedModels(target, draft, Auto(), name)
        server = ServerThread(models, port=port, executor=self.executor, observer=self.monitor)
        server.queue.listeners.append(lambda waiting, running: self.monitor.queue_changed.emit(waiting, running))
        server.start()
        self.server = server

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
