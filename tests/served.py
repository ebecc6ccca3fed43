"""A SpecLens server on loopback for tests: the real app, uvicorn and engine thread, on a free port, in-process."""
from __future__ import annotations

from contextlib import contextmanager

from core.serve.background import ServerThread
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
    with ServerThread(models, **options) as server:
        yield server.url, server.app
