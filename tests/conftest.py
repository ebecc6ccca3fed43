"""Shared test setup (one torch thread for tiny models) and fixtures for the GUI tests.

Offscreen Qt, an isolated data folder, the tiny model pair, the real window.
"""
from __future__ import annotations

import os
import threading

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

# The tests' models are tiny: one thread computes them fastest, and several OpenMP threads spin against each other
# (20 ms instead of 1.3 ms per forward seen on a busy 2-core machine).
torch.set_num_threads(1)

GENERATION_TIMEOUT_MS = 60_000


@pytest.fixture(autouse=True)
def private_caches(tmp_path, monkeypatch):
    """Plans, re-quantised drafts and the memory of earlier texts in folders of the test's own: never the user's
    (planning a tiny llama.cpp pair re-quantises its draft, which left a file in the user's cache every run)."""
    monkeypatch.setattr("core.auto.cache.cache_dir", lambda: tmp_path / "plans")
    monkeypatch.setattr("core.quantize.cache_dir", lambda: tmp_path / "cache")
    monkeypatch.setenv("SPECLENS_MEMORY_DIR", str(tmp_path / "memory"))


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """A fresh SPECLENS_DATA_DIR (history and settings) for one test."""
    folder = tmp_path / "data"
    monkeypatch.setenv("SPECLENS_DATA_DIR", str(folder))
    return folder


@pytest.fixture
def compute_threads(monkeypatch):
    """The set of threads (idents) on which the tiny models compute, filled as they do. What measures in the app must
    compute on one thread: llama.cpp's OpenMP threads belong to the thread that calls it, and a second caller slows
    both (app.worker)."""
    from core.backends.hf import HFBackend

    seen: set[int] = set()

    def recorded(method):
        def computing(self, *args, **kwargs):
            seen.add(threading.get_ident())
            return method(self, *args, **kwargs)
        return computing

    for name in ("prefill", "forward_tree"):
        monkeypatch.setattr(HFBackend, name, recorded(getattr(HFBackend, name)))
    return seen


@pytest.fixture(scope="session")
def tiny_backends():
    """The tiny (target, draft) pair, built once per session; every generation re-prefills, so sharing is safe."""
    from core.tiny import tiny_pair

    return tiny_pair()


@pytest.fixture
def make_window(qtbot, data_dir, tiny_backends):
    """``make_window(load=None, wait=True, **settings)``: the real MainWindow over a ChatSession on the tiny pair,
    shown offscreen, models loaded and warm. ``load`` defaults to handing over the session's tiny pair; pass
    ``app.chat.loader.load_backends`` to go through core.models. Closed (cancel + wait) at teardown by qtbot."""
    from app.chat.history import HistoryStore
    from app.main import HISTORY_FILE, create_app, open_window
    from app.settings import AppSettings

    create_app()

    def make(load=None, wait=True, **overrides):
        # answers of 40 tokens, never fewer: how soon a random model would end one depends on the CPU's kernels
        values = dict(pair="tiny", backend="hf", strategy="chain", chain_k=4, temperature=0.0, max_new_tokens=40,
                      min_new_tokens=40)
        values.update(overrides)
        window = open_window(AppSettings(**values), HistoryStore(data_dir / HISTORY_FILE),
                             load=load or (lambda choice, progress: tiny_backends))
        qtbot.addWidget(window)
        if wait:
            qtbot.waitUntil(lambda: window.session.is_warm, timeout=GENERATION_TIMEOUT_MS)
        return window

    return make


@pytest.fixture
def ask(qtbot):
    """``ask(window, text)``: send ``text`` and return the GenerationResult of the whole streamed answer."""

    def run(window, text):
        with qtbot.waitSignal(window.session.answer_finished, timeout=GENERATION_TIMEOUT_MS) as blocker:
            assert window.send(text)
        assert blocker.args[1] is not None, "the generation failed"
        return blocker.args[1]

    return run


@pytest.fixture
def saved(qtbot):
    """``saved(window)``: wait until the window's history writes are in the file (they run on the writer thread) and
    the signals they sent are handled."""
    from PySide6.QtCore import QCoreApplication

    def wait(window):
        qtbot.waitUntil(lambda: window.session.writer.pending == 0, timeout=GENERATION_TIMEOUT_MS)
        QCoreApplication.processEvents()   # what the writer emitted before it went idle

    return wait
