"""A SpecLens server running beside other work in one process (the window's Serve switch, the fast-apply bench,
tests): uvicorn on its own thread, requests decoding on the executor given (the window's engine thread) or on a
:class:`JobThread` of its own."""
from __future__ import annotations

import socket
import threading
import time

import uvicorn

from core.serve.executor import Executor, JobThread
from core.serve.http import create_app
from core.serve.job import ServedModels

START_TIMEOUT_S = 30.0


def check_bindable(host: str, port: int) -> None:
    """OSError (the port is in use, or not ours to take) before a server tries to listen there."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, port))


class ServerThread:
    """``start()`` listens on ``host:port`` (port 0: a free one) and returns once it does; ``stop()`` ends it."""

    def __init__(self, models: ServedModels, host: str = "127.0.0.1", port: int = 0,
                 executor: Executor | None = None, **options) -> None:
        self._own = executor is None
        self.executor = executor if executor is not None else JobThread()
        self.app = create_app(models, self.executor, **options)
        self.host = host
        self._config = uvicorn.Config(self.app, host=host, port=port, log_level="warning")
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        servers = getattr(self._server, "servers", None) or []
        sockets = [s for server in servers for s in server.sockets]
        return sockets[0].getsockname()[1] if sockets else self._config.port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def queue(self):
        return self.app.state.queue

    def start(self) -> "ServerThread":
        if self._config.port:
            check_bindable(self.host, self._config.port)
        self._server = uvicorn.Server(self._config)
        self._thread = threading.Thread(target=self._serve, name="speclens-serve-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive():
                raise OSError(f"could not listen on {self.host}:{self._config.port} (is the port in use?)")
            if time.monotonic() > deadline:
                self.stop()
                raise OSError(f"the server on {self.host}:{self._config.port} did not start")
            time.sleep(0.01)
        return self

    def _serve(self) -> None:
        try:
            self._server.run()
        except SystemExit:   # uvicorn exits this way when it cannot listen; start() reports it
            pass

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            if self._thread is not None:
                self._thread.join(10)
            self._server = None
        if self._own:
            self.executor.close()

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
