"""The model pair a chat decodes with: loaded on a worker thread, then warmed up, with progress; headless.

Warming runs the strategy's ``bind`` (Auto measures or loads its plan) and both models at the batch sizes decoding
uses (core.warmup), so the first answer's first token comes as fast as a later one's. The chat session waits for
``warm`` before it sends.
"""
from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from app.chat.loader import load_job
from app.settings import AppSettings, SettingsError
from app.worker import EngineRun
from core.sampling import SamplingError
from core.warmup import warm

LOAD_SHARE = 0.7   # of the progress bar: loading, then warming


class ModelHost(QObject):
    """``load(settings)``, then ``loading`` progress, ``ready`` (models loaded) and ``warm`` (ready to answer),
    or ``failed``; ``error`` for a warm-up that went wrong (answers still work)."""

    loading = Signal(float, str)
    ready = Signal(str)
    failed = Signal(str)
    warm = Signal()
    error = Signal(str, str)

    def __init__(self, load=None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._load = load
        self.backends: tuple | None = None
        self.strategy = None
        self.is_warm = False
        self.loading_run: EngineRun | None = None
        self.warming_run: EngineRun | None = None
        self._closed = False

    @property
    def busy(self) -> bool:
        return self.loading_run is not None

    def load(self, settings: AppSettings) -> None:
        """Load the pair ``settings`` name (cancelling a load or warm-up in progress), then warm it up."""
        choice = settings.pair_choice()   # SettingsError: the caller says so
        self.cancel()
        self.backends, self.is_warm, self.strategy = None, False, None
        run = EngineRun(load_job(choice, self._load), self)
        run.frame.connect(lambda items: self._progress(items, 0.0, LOAD_SHARE))
        run.finished.connect(lambda pair, r=run: self._loaded(r, choice, pair, settings))
        run.failed.connect(lambda message, r=run: self._load_failed(r, choice, message))
        self.loading_run = run
        run.start()
        self.loading.emit(0.0, f"Loading {choice.label}")

    def warm_up(self, settings: AppSettings) -> None:
        """Build the strategy the settings ask for, bind it and run both models at the sizes it uses."""
        self.is_warm = False
        try:
            self.strategy = settings.build_strategy()
            sampling = settings.sampling()
        except (SettingsError, SamplingError) as exc:
            # the models are ready all the same: a send is refused with this reason until the settings are fixed
            self.error.emit("Settings", f"Cannot generate with these settings: {exc}")
            self.warming_run = None
            self._warmed(None)
            return
        target, draft, strategy = *self.backends, self.strategy
        run = EngineRun(lambda push, cancel: warm(target, draft, strategy, sampling,
                                                  lambda fraction, text: push((fraction, text)), cancel), self)
        run.frame.connect(lambda items: self._progress(items, LOAD_SHARE, 1.0))
        run.finished.connect(lambda _, r=run: self._warmed(r))
        run.failed.connect(lambda message, r=run: self._warm_failed(r, message))
        self.warming_run = run
        run.start()

    def cancel(self) -> None:
        for run in (self.loading_run, self.warming_run):
            if run is not None:
                run.cancel()

    def close(self, wait_ms: int) -> None:
        self._closed = True
        self.cancel()
        for run in (self.loading_run, self.warming_run):
            if run is not None:
                run.wait(wait_ms)

    def _progress(self, items: tuple, lo: float, hi: float) -> None:
        fraction, text = items[-1]
        self.loading.emit(lo + (hi - lo) * fraction, text)

    def _loaded(self, run: EngineRun, choice, pair, settings: AppSettings) -> None:
        if run is not self.loading_run or self._closed:
            return
        self.loading_run = None
        self.backends = tuple(pair)
        target, draft = self.backends
        self.ready.emit(f"{choice.label} ({target.name} + {draft.name})")
        self.warm_up(settings)

    def _load_failed(self, run: EngineRun, choice, message: str) -> None:
        if run is not self.loading_run or self._closed:
            return
        self.loading_run = None
        if not run.cancel_event.is_set():
            self.failed.emit(f"Could not load the {choice.label} model pair: {message}")

    def _warmed(self, run: EngineRun | None) -> None:
        if run is not self.warming_run or self._closed:
            return
        self.warming_run = None
        self.is_warm = True
        self.loading.emit(1.0, "Ready")
        self.warm.emit()

    def _warm_failed(self, run: EngineRun, message: str) -> None:
        if run is not self.warming_run or self._closed:
            return
        self.warming_run = None
        self.error.emit("Warm-up", f"Preparing {self.strategy.label} failed: {message}. Answers still work; the "
                                   "first one may start slower.")
        self.is_warm = True
        self.warm.emit()
