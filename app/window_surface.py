"""The chat window as a place to decode, for ``speclens bench --surface window``: what the live view costs.

Each decode goes through the real main window (offscreen unless a display is set): a conversation holding the
prompt's earlier turns is opened, the last question is sent as a user would, and the session's answer — streamed,
rendered, drawn in the tree view and saved to a throwaway history — is returned when it ends. The window decodes
with the benchmark's own strategy object and sampling, and the bare engine it is compared with, like everything else
the bench computes (``call``), decodes on the same engine thread (app.worker: where decoding runs changes
llama.cpp's speed), so the only difference is the window.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Callable, TypeVar

from app.worker import on_engine_thread
from core.engine import SpeculativeEngine
from core.events import GenerationResult

WINDOW_SIZE = (1440, 900)
T = TypeVar("T")


def wait_for(signals: tuple, done) -> None:
    """Run the event loop until one of ``signals`` fires and ``done()`` holds. Woken by the signals, never by a
    polling timer: a GUI thread that wakes often takes the CPU from the decoding threads, which is measured."""
    from PySide6.QtCore import QEventLoop

    loop = QEventLoop()
    for signal in signals:
        signal.connect(loop.quit)
    while not done():
        loop.exec()
    for signal in signals:
        signal.disconnect(loop.quit)


class WindowSurface:
    name = "window"

    def __init__(self, target, draft) -> None:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
        from app.chat.history import HistoryStore
        from app.main import HISTORY_FILE, create_app, open_window
        from app.settings import AppSettings

        self.app = create_app()
        self._folder = tempfile.TemporaryDirectory(prefix="speclens-bench-window-")
        settings = AppSettings(pair="default", backend="llama.cpp", strategy="baseline")
        self.window = open_window(settings, HistoryStore(Path(self._folder.name) / HISTORY_FILE),
                                  load=lambda choice, progress: (target, draft), persist=False)
        self.window.resize(*WINDOW_SIZE)
        wait_for((self.window.session.warm,), lambda: self.window.session.is_warm)

    def engine_surface(self) -> "EngineThreadSurface":
        """The bare engine to compare the window with."""
        return EngineThreadSurface()

    def call(self, fn: Callable[[], T]) -> T:
        return on_engine_thread(fn)

    def close(self) -> None:
        """Close the window and drop its throwaway history. An open window outlives the run otherwise: in a process
        that goes on (the app's tests), it keeps the next ``app.exec()`` from returning."""
        self.window.close()
        self._folder.cleanup()

    def decode(self, engine: SpeculativeEngine, messages: list[dict], prompt_ids: list[int],
               max_new_tokens: int) -> GenerationResult:
        session = self.window.session
        sampling = engine.sampling
        session.settings = replace(session.settings, max_new_tokens=max_new_tokens,
                                   temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                                   min_p=sampling.min_p,
                                   seed=-1 if sampling.seed is None else sampling.seed)
        session.strategy = engine.strategy
        system = "\n".join(m["content"] for m in messages if m["role"] == "system")
        earlier = [m for m in messages[:-1] if m["role"] != "system"]
        self._open_conversation(system, earlier)
        results: list = []

        def done(message, result) -> None:
            results.append(result)

        session.answer_finished.connect(done)
        if not self.window.send(messages[-1]["content"]):
            raise RuntimeError("the window did not accept the prompt")
        wait_for((session.answer_finished,), lambda: bool(results))
        session.answer_finished.disconnect(done)
        if results[0] is None:
            raise RuntimeError("the window's answer failed")
        return results[0]

    def _open_conversation(self, system: str, earlier: list[dict]) -> None:
        from app.chat.history import Message

        session = self.window.session
        store = session.store
        cid = store.create_conversation("bench", system)
        for m in earlier:
            store.add_message(cid, Message(m["role"], m["content"]))
        session.open_conversation(cid)
        self.window.system_edit.setText(system)


class EngineThreadSurface:
    """The bare engine, run on the app's engine thread while the GUI thread only waits for it (in an event loop)."""

    name = "engine"

    def decode(self, engine: SpeculativeEngine, messages: list[dict], prompt_ids: list[int],
               max_new_tokens: int) -> GenerationResult:
        return on_engine_thread(lambda: engine.generate(prompt_ids, max_new_tokens))
