"""Runs engine work off the GUI thread and hands its output to the views at frame rate.

Every job runs on one engine thread, started on first use and kept for the life of the application (jobs queue on
it, so two never touch the same models at once). One thread, not one per job: llama.cpp parallelises with OpenMP,
whose pool of worker threads belongs to the thread that calls it; with a second pool alive (a fresh job thread
beside one that already decoded) libgomp has more threads than cores, and, as far as we can tell, its barriers
(hundreds per token) stop spinning and sleep. Measured on two cores with the default pair (greedy, 64 tokens, one
process per layout, 6 runs each, tools/thread_layouts.py): load and decode on one worker thread 12.99 tok/s median,
decode on a second thread 12.1, on a fresh thread per run 11.85 (Xeon); on a Zen 3 EPYC, 2 x 3 runs, all on the main
thread 16.8-18.6, all on a worker 17.3-19.3, on a worker after the main thread decoded 7.7-12.6. (libgomp's
documentation of GOMP_SPINCOUNT: with more OpenMP threads than CPUs a waiting thread spins 100 times, 1000 with
OMP_WAIT_POLICY=ACTIVE, where it would otherwise spin some 300,000 before sleeping.)
So whatever else computes in this process (the bench beside the window, the screenshots) does so on this thread too:
``on_engine_thread``.

A job pushes immutable items (StepEvents and other frozen data) into a buffer; the GUI thread
drains the buffer with a timer, at most ``FRAME_HZ`` times a second, and emits them as one ``frame``. So however fast
steps come, the views do a bounded amount of work per second, and no item is lost: every frame holds all the items
pushed since the last one, in order. On a 2-core machine any CPU the GUI takes is taken from the decode's threads
(measured: it is the CPU, not the GIL; pure Python beside a decode cost it no more than C code that releases the
GIL). So the frames are also paced by what they cost: the GUI thread's own CPU clock says how much it
worked since the last frame (rendering, layout, painting, everything), and the next frame waits until that is at most
``GUI_SHARE`` of a core (``frame_interval``). A fast machine streams at FRAME_HZ; a slow one at fewer frames, each
carrying more text, rather than a slower decode.

Cancellation is a threading.Event the job passes to the engine, which checks it between prefill chunks and steps.
"""
from __future__ import annotations

import atexit
import logging
import threading
import time
from typing import Any, Callable, TypeVar

from PySide6.QtCore import QCoreApplication, QEventLoop, QObject, Qt, QThread, QTimer, Signal

from core.backends.base import BackendError
from core.endpoints.client import EndpointError

log = logging.getLogger(__name__)

# the chat streams text at this rate; the live view draws less often (app.viz.panel). Five, not ten: on two cores
# each chat update (render the open block, lay out, paint) costs ~4 ms of GUI CPU, which the decode pays for;
# measured GUI CPU per second of decoding, default pair, Baseline: 7.4% at 10 Hz, 4.5% at 5 Hz
FRAME_HZ = 5
# while a job streams, the GUI thread takes at most this share of a core (beyond that, frames are spaced out), and a
# frame still comes at least every MAX_FRAME_S. Measured on two cores, default pair, Baseline: the GUI's work per
# chat frame, with the live panel's draws and all else it did between frames, is ~9 ms, so 3% paces it at ~3 a second
GUI_SHARE = 0.03
MAX_FRAME_S = 0.5
EXPECTED = (BackendError, EndpointError, ValueError, OSError, MemoryError)
Push = Callable[[Any], None]
Job = Callable[[Push, threading.Event], Any]   # job(push, cancel) -> result
T = TypeVar("T")


_engine_thread: QThread | None = None


def engine_thread() -> QThread:
    """The thread every engine job runs on (see the module docstring); stopped when the interpreter exits."""
    global _engine_thread
    if _engine_thread is None:
        _engine_thread = QThread()
        _engine_thread.setObjectName("speclens-engine")
        _engine_thread.start()
        atexit.register(_stop_engine_thread)
    return _engine_thread


def _stop_engine_thread() -> None:
    global _engine_thread
    if _engine_thread is not None:
        _engine_thread.quit()
        _engine_thread.wait()
        _engine_thread = None


class _Runner(QObject):
    """The part that lives in the engine thread while its job runs."""

    done = Signal(object)
    failed = Signal(str)

    def __init__(self, job: Job, push: Push, cancel: threading.Event) -> None:
        super().__init__()
        self._job, self._push, self._cancel = job, push, cancel
        self.ended = threading.Event()

    def run(self) -> None:
        try:
            self.done.emit(self._job(self._push, self._cancel))
        except EXPECTED as exc:   # bad input, a model that will not load: the message says it all
            log.warning("engine job stopped: %s", exc)
            self.failed.emit(_describe(exc))
        except Exception as exc:  # the GUI must survive any engine failure and show it as a dialog
            log.exception("engine job failed")
            self.failed.emit(_describe(exc))
        finally:
            # back to the GUI thread, which owns it and will delete it
            self.moveToThread(QCoreApplication.instance().thread())
            self.ended.set()


def on_engine_thread(fn: Callable[[], T]) -> T:
    """``fn()`` run as a job on the engine thread, the GUI thread waiting in a local event loop until it ends; its
    exception is raised here.

    For what measures outside the chat (the bench's window surface, the screenshots' recorded runs): computing on the
    GUI thread of a process whose engine thread has decoded leaves two OpenMP pools, and decoding slows by a third
    or more (the module docstring)."""
    out: list = []

    def job(push: Push, cancel: threading.Event) -> None:
        try:
            out.append((True, fn()))
        except BaseException as exc:   # handed back to the caller as it was raised
            out.append((False, exc))

    run = EngineRun(job)
    loop = QEventLoop()
    run.finished.connect(loop.quit)
    run.failed.connect(loop.quit)   # only if the job could not even start
    run.start()
    loop.exec()
    if not out:
        raise RuntimeError("the engine thread did not run the job")
    ok, value = out[0]
    if not ok:
        raise value
    return value


def frame_interval(gui_cpu_s: float, min_s: float) -> float:
    """Seconds to the next frame when the GUI thread worked ``gui_cpu_s`` of CPU since the last one: long enough
    that this work is GUI_SHARE of the time, but within [min_s, MAX_FRAME_S]."""
    return min(MAX_FRAME_S, max(min_s, gui_cpu_s / GUI_SHARE))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, MemoryError):
        return "Out of memory: close other programs, use a smaller model pair or a shorter context, and try again."
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class EngineRun(QObject):
    """One job on the engine thread, seen from the GUI thread: ``frame`` (a tuple of new items, at most FRAME_HZ times a
    second, fewer when frames cost the GUI more than GUI_SHARE of a core), then ``finished`` (the job's result) or
    ``failed`` (a message). Nothing is emitted after ``cancel`` except the end itself."""

    frame = Signal(tuple)
    finished = Signal(object)
    failed = Signal(str)
    _go = Signal()

    def __init__(self, job: Job, parent: QObject | None = None, frame_hz: int = FRAME_HZ) -> None:
        super().__init__(parent)
        self.cancel_event = threading.Event()
        self._lock = threading.Lock()
        self._items: list = []
        self._runner = _Runner(job, self._push, self.cancel_event)
        self._runner.moveToThread(engine_thread())
        # queued explicitly: PySide6 may otherwise call a Python slot in the emitting thread
        queued = Qt.ConnectionType.QueuedConnection
        self._go.connect(self._runner.run, queued)
        self._runner.done.connect(self._on_done, queued)
        self._runner.failed.connect(self._on_failed, queued)
        self._min_interval = 1 / frame_hz
        self._started = False
        self._gui_cpu = 0.0      # the GUI thread's CPU clock at the last frame
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self._frame)

    @property
    def running(self) -> bool:
        """Started (or queued behind another job) and not yet ended."""
        return self._started and not self._runner.ended.is_set()

    def _push(self, item) -> None:
        with self._lock:
            self._items.append(item)

    def start(self) -> None:
        self._started = True
        self._gui_cpu = time.thread_time()
        self._timer.start(int(self._min_interval * 1000))
        self._go.emit()

    def cancel(self) -> None:
        """Ask the job to stop at its next check (a prefill chunk or a step); what it made so far is kept."""
        self.cancel_event.set()

    def wait(self, timeout_ms: int = -1) -> bool:
        """Block until the job has ended (True) or ``timeout_ms`` passed (False); a job never started has ended."""
        if not self._started:
            return True
        return self._runner.ended.wait(timeout_ms / 1000 if timeout_ms >= 0 else None)

    def _frame(self) -> None:
        self._drain()
        if self._runner.ended.is_set():   # no next frame: _end drains what is left (a view's event loop may
            return                        # already have run it)
        now = time.thread_time()   # the GUI thread's CPU: this frame's work and all it did since the last one
        self._timer.start(round(frame_interval(now - self._gui_cpu, self._min_interval) * 1000))
        self._gui_cpu = now

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        if items:
            self.frame.emit(tuple(items))

    def _end(self) -> None:
        self._runner.ended.wait()    # its result is emitted last: the job is over but for returning
        self._timer.stop()
        self._drain()

    def _on_done(self, result) -> None:
        self._end()
        self.finished.emit(result)

    def _on_failed(self, message: str) -> None:
        self._end()
        self.failed.emit(message)
