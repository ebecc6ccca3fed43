"""A SpecLens server on loopback for tests: the real app, uvicorn and engine thread, on a free port, in-process."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import uvicorn

from core.endpoints.llama_server import free_port
from core.serve.executor import JobThread
from core.serve.http import create_app
from core.serve.job import Observer, ServedModels


class Recorder(Observer):
    """Everything the server reports about the requests it decodes, in order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, object]] = []
        self.records = []
        self.steps = 0

    def started(self, client, request, strategy) -> None:
        self.log.append(("started", request))

    def step(self, event) -> None:
        self.steps += 1

    def finished(self, record) -> None:
        self.log.append(("finished", record.request))
        self.records.append(record)


@contextmanager
def serving(models: ServedModels, **options):
    """``(base_url, app)`` of a server decoding ``models`` until the block ends."""
    engine = JobThread()
    app = create_app(models, engine, **options)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(10)
        engine.close()
