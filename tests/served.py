"""A SpecLens server on loopback for tests: the real app, uvicorn and engine thread, on a free port, in-process."""
from __future__ import annotations

import threading
from contextlib import contextmanager

from core.serve.background import ServerThread
from core.serve.job import Observer, ServedModels


class Recorder(Observer):
    """Everything the server reports about the requests it decodes, in order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, object]] = []
        self.records = []
        self.steps = 0
        self._changed = threading.Condition()

    def started(self, client, request, strategy) -> None:
        self._logged(("started", request))

    def step(self, event) -> None:
        self.steps += 1

    def finished(self, record) -> None:
        self.records.append(record)
        self._logged(("finished", record.request))

    def _logged(self, entry: tuple[str, object]) -> None:
        with self._changed:
            self.log.append(entry)
            self._changed.notify_all()

    def settled(self, timeout: float = 60.0) -> None:
        """Until every request started has finished: a client has its answer just before the server reports the
        end, so a test that counts what follows must not start counting in between."""
        self.wait_until(lambda: sum(k == "started" for k, _ in self.log) == sum(k == "finished" for k, _ in self.log),
                        timeout)

    def wait_until(self, condition, timeout: float = 60.0) -> None:
        """Until ``condition()`` holds of what was reported (checked at each report)."""
        with self._changed:
            self._changed.wait_for(condition, timeout)


@contextmanager
def serving(models: ServedModels, **options):
    """``(base_url, app)`` of a server decoding ``models`` until the block ends."""
    with ServerThread(models, **options) as server:
        yield server.url, server.app
