"""Compare mode: one prompt decoded by Baseline, then by the chosen strategy, raced side by side.

The two runs go one after the other on the same thread helper as the chat (app.worker), then both recordings are
replayed on a shared clock at their engine timestamps, so the panes race as they would have run, and the verdict
(speedup, tokens/s, time to first token, greedy identity) and a "fastest" badge appear.
"""
from __future__ import annotations

import bisect
import html
import time
from typing import Callable, Sequence

import pyqtgraph as pg
from PySide6.QtCore import QTimer, Qt, Signal
from PySide6.QtWidgets import (QDialog, QFrame, QHBoxLayout, QLabel, QProgressBar, QPushButton, QTextEdit, QVBoxLayout,
                               QWidget)

from app.compare.race import RaceSummary, RunReplay, summarize
from app.viz.plots import BASE_COLOUR, LEGEND_BRUSH, SPEC_COLOUR
from app.chat.message_view import BUSY_REASON
from app.worker import EngineRun
from core.auto import Auto
from core.context import fit_chat
from core.drafting import Baseline
from core.engine import SpeculativeEngine
from core.events import GenerationResult, Origin, StopReason

REPLAY_HZ = 30
DRAFT_TINT = "#c8f0d2"
CLOCK_STYLE = ("QProgressBar { border: 1px solid #b0bec5; border-radius: 4px; text-align: center; color: #1a1a1a; }"
               "QProgressBar::chunk { background: #90caf9; border-radius: 3px; }")
BADGE_STYLE = "background:#1e8e3e; color:white; border-radius:8px; padding:2px 8px; font-weight:bold;"


def pieces_html(pieces: Sequence[tuple[str, Origin]]) -> str:
    """Answer text with accepted draft tokens tinted green, as in the chat."""
    out = []
    for text, origin in pieces:
        t = html.escape(text).replace("\n", "<br>")
        out.append(f"<span style='background:{DRAFT_TINT}'>{t}</span>" if origin == Origin.DRAFT else t)
    return "<span style='white-space:pre-wrap; font-family:\"DejaVu Sans Mono\"'>" + "".join(out) + "</span>"


class RacePane(QFrame):
    """One contestant: its name, a badge when it wins, the streaming answer and live numbers."""

    def __init__(self, title: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setFrameShape(QFrame.StyledPanel)
        self.title = QLabel(f"<b>{html.escape(title)}</b>")
        self.badge = QLabel("\u26a1 fastest")
        self.badge.setStyleSheet(BADGE_STYLE)
        keep = self.badge.sizePolicy()
        keep.setRetainSizeWhenHidden(True)  # both panes keep the same layout whoever wins
        self.badge.setSizePolicy(keep)
        self.badge.hide()
        self.clock_bar = QProgressBar()
        self.clock_bar.setRange(0, 1000)
        self.clock_bar.setValue(0)
        self.clock_bar.setTextVisible(True)
        self.clock_bar.setFormat("")
        self.clock_bar.setStyleSheet(CLOCK_STYLE)
        self.clock_bar.setToolTip("Elapsed time of this run; the bar's full length is the slower run's total")
        self.text = QTextEdit()
        self.text.setReadOnly(True)
        self.numbers = QLabel("waiting\u2026")
        self.numbers.setStyleSheet("font-family:'DejaVu Sans Mono'; font-size:9pt;")
        head = QHBoxLayout()
        head.addWidget(self.title)
        head.addStretch(1)
        head.addWidget(self.badge)
        layout = QVBoxLayout(self)
        layout.addLayout(head)
        layout.addWidget(self.text, 1)
        layout.addWidget(self.clock_bar)
        layout.addWidget(self.numbers)
        self._shown = -1

    def set_title(self, title: str) -> None:
        self.title.setText(f"<b>{html.escape(title)}</b>")

    def show_at(self, run: RunReplay, t: float, race_length: float) -> None:
        """Show what ``run`` had produced ``t`` seconds in; ``race_length`` is the slower run's duration."""
        elapsed = min(t, run.duration)
        self.clock_bar.setValue(int(1000 * elapsed / race_length) if race_length > 0 else 0)
        self.clock_bar.setFormat(f"{elapsed:.2f} s" + (" \u2014 finished" if t >= run.duration else ""))
        k = run.steps_at(t)
        if k != self._shown:
            self._shown = k
            self.text.setHtml(pieces_html(run.pieces_at(t)))
            self.text.verticalScrollBar().setValue(self.text.verticalScrollBar().maximum())
        stats = run.result.steps[k - 1].stats if k else None
        done = k == len(run.result.steps)
        if stats is None:
            self.numbers.setText("prefill\u2026")
            return
        ttft = stats.time_to_first_token or 0.0
        state = "done" if done else "running"
        self.numbers.setText(f"{stats.new_tokens} tokens \u00b7 "
                             f"{stats.tokens_per_second:6.1f} tok/s \u00b7 first token {ttft * 1000:.0f} ms \u00b7 "
                             f"{stats.tokens_per_call:.2f} tok/call \u00b7 {state}")

    def reset(self, title: str) -> None:
        self.set_title(title)
        self.badge.hide()
        self.text.clear()
        self.clock_bar.setValue(0)
        self.clock_bar.setFormat("")
        self.numbers.setText("waiting\u2026")
        self._shown = -1


class RaceSpeedPlot(pg.PlotWidget):
    """Both runs' tokens/s on one time axis, drawn up to the replay clock."""

    def __init__(self) -> None:
        super().__init__()
        self.setMinimumHeight(150)
        self.setMaximumHeight(200)
        self.setTitle("tokens/s over time (engine clock, shared by both runs)")
        self.setLabel("bottom", "seconds since the prompt")
        self.setLabel("left", "tokens/s")
        self.showGrid(x=True, y=True, alpha=0.25)
        self.legend = self.addLegend(offset=(-10, 10), brush=LEGEND_BRUSH)
        self.base_curve = self.plot(pen=pg.mkPen(BASE_COLOUR, width=2, style=Qt.DashLine), name="Baseline")
        self.other_curve = self.plot(pen=pg.mkPen(SPEC_COLOUR, width=2.5), name="speculative")
        self._series: list[tuple[list[float], list[float]]] = []

    def load(self, summary: RaceSummary) -> None:
        """Take both recordings (a rate needs two tokens, so earlier steps are left out)."""
        self._series = [([e.timestamp for e in run.result.steps if e.stats.new_tokens >= 2],
                         [e.stats.tokens_per_second for e in run.result.steps if e.stats.new_tokens >= 2])
                        for run in (summary.baseline, summary.other)]
        for curve, run in ((self.base_curve, summary.baseline), (self.other_curve, summary.other)):
            self.legend.removeItem(curve)
            self.legend.addItem(curve, run.label)
        end = max(summary.baseline.duration, summary.other.duration)
        top = max([y for _, ys in self._series for y in ys] + [1.0])
        self.setXRange(0, end, padding=0.02)
        self.setYRange(0, top * 1.1, padding=0)

    def show_until(self, t: float) -> None:
        for curve, (xs, ys) in zip((self.base_curve, self.other_curve), self._series):
            k = bisect.bisect_right(xs, t)
            curve.setData(xs[:k], ys[:k])


class CompareWidget(QWidget):
    """Race Baseline against a strategy on one prompt.

    ``make_engine(strategy)`` builds a SpeculativeEngine on the loaded models for that strategy; it is called on the
    worker thread, once per run. Call :meth:`start` with the prompt's token ids.
    """

    runsFinished = Signal(object)   # RaceSummary, once both runs are recorded (the replay then starts)
    raceFinished = Signal(object)   # RaceSummary, when the replay reaches the end
    failed = Signal(str)

    def __init__(self, make_engine: Callable[[object], object], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._make_engine = make_engine
        self.status = QLabel("Race plain decoding against the chosen strategy on the same prompt.")
        self.status.setWordWrap(True)
        self.verdict = QLabel("")
        self.verdict.setWordWrap(True)
        self.verdict.setTextFormat(Qt.RichText)
        self.verdict.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.verdict.setMinimumHeight(64)
        self.verdict.setAlignment(Qt.AlignTop | Qt.AlignLeft)
        self.replay_button = QPushButton("Replay race")
        self.replay_button.setEnabled(False)
        self.replay_button.setToolTip("Run the race again from the recordings")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.left = RacePane("Baseline")
        self.right = RacePane("Speculative")
        panes = QHBoxLayout()
        panes.addWidget(self.left, 1)
        panes.addWidget(self.right, 1)
        buttons = QHBoxLayout()
        buttons.addWidget(self.status, 1)
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.replay_button)
        layout = QVBoxLayout(self)
        layout.addLayout(buttons)
        layout.addLayout(panes, 1)
        self.speed_plot = RaceSpeedPlot()
        layout.addWidget(self.speed_plot)
        layout.addWidget(self.verdict)
        self.replay_button.clicked.connect(self.replay)
        self.stop_button.clicked.connect(self.stop)

        self.summary: RaceSummary | None = None
        self.clock = 0.0
        self.speed = 1.0
        self._timer = QTimer(self)
        self._timer.setInterval(int(1000 / REPLAY_HZ))
        self._timer.timeout.connect(self._tick)
        self._wall0 = 0.0
        self._run: EngineRun | None = None

    # -- running ---------------------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._run is not None

    def start(self, prompt_ids: Sequence[int], strategy, max_new_tokens: int = 128, endpoint=None,
              messages: Sequence[dict] = ()) -> None:
        """Decode ``prompt_ids`` with Baseline (or ``messages`` on ``endpoint``, a core.endpoints.client.EndpointRun:
        is SpecLens faster than the server the user already runs?), then with ``strategy``, then race the
        recordings."""
        if self.running:
            raise RuntimeError("a race is already running: stop it first")
        if isinstance(strategy, Baseline) and endpoint is None:
            raise ValueError("choose a speculative strategy to race against Baseline")
        if not prompt_ids:
            raise ValueError("the race needs a prompt: type one in the chat first")
        self._timer.stop()
        self.summary = None
        self.verdict.setText("")
        self.replay_button.setEnabled(False)
        reference = endpoint.endpoint.label if endpoint is not None else "Baseline"
        self.left.reset(reference)
        self.right.reset(strategy.label)
        prompt, make = list(prompt_ids), self._make_engine

        def local(s):
            def run(push, cancel):
                engine = make(s)
                for event in engine.stream(prompt, max_new_tokens, cancel):
                    push(event)
                return engine.last_result
            return run

        def remote(push, cancel):
            for event in endpoint.stream(messages, max_new_tokens, make(strategy).sampling, cancel):
                push(event)
            return endpoint.result.result

        contestants = [(reference, remote if endpoint is not None else local(Baseline())),
                       (strategy.label, local(strategy))]

        def job(push, cancel):
            # a 2-token decode with the contender first touches both models, so the reference does not pay the
            # one-off warm-up alone; then the two runs, one after the other
            make(strategy).generate(prompt, 2, cancel)
            results = []
            for label, run in contestants:
                result = run(lambda event: push((len(results) + 1, label, event.stats.new_tokens)), cancel)
                if result.stop_reason == StopReason.CANCELLED:
                    return None
                results.append((label, result))
            return results

        self._run = EngineRun(job, self)
        self._run.frame.connect(self._on_progress)
        self._run.finished.connect(self._on_runs_done)
        self._run.failed.connect(self._on_failed)
        self.stop_button.setEnabled(True)
        self.status.setText(f"Run 1 of 2: decoding with {reference} (runs go one after the other, then race on the "
                            "recorded timestamps)\u2026")
        self._run.start()

    def stop(self, wait: bool = False) -> None:
        """Cancel the run in progress (the race is then abandoned) or stop the replay; ``wait`` blocks until the
        worker thread has ended (the engine checks between steps), before closing."""
        if self._run is not None:
            self._run.cancel()
            if wait:
                self._run.wait()
        self._timer.stop()

    def closeEvent(self, event) -> None:
        self.stop(wait=True)
        super().closeEvent(event)

    def _on_progress(self, items: tuple) -> None:
        run, label, tokens = items[-1]
        self.status.setText(f"Run {run} of 2: {label}, {tokens} tokens so far\u2026")

    def _on_runs_done(self, results) -> None:
        self._run = None
        self.stop_button.setEnabled(False)
        if results is None:
            self.status.setText("Race stopped.")
            return
        (base_label, base), (other_label, other) = results
        self.show_results(base_label, base, other_label, other)

    def show_results(self, baseline_label: str, baseline: GenerationResult, other_label: str,
                     other: GenerationResult) -> None:
        """Race two recorded runs of one prompt (from :meth:`start`, or recorded elsewhere, e.g. for a screenshot)."""
        self.left.set_title(baseline_label)
        self.right.set_title(other_label)
        self.summary = summarize(baseline_label, baseline, other_label, other)
        self.speed_plot.load(self.summary)
        self.runsFinished.emit(self.summary)
        self.replay()

    def _on_failed(self, message: str) -> None:
        self._run = None
        self.stop_button.setEnabled(False)
        self.status.setText(f"The race failed: {message}")
        self.failed.emit(message)

    # -- replay ----------------------------------------------------------------------------------------------
    def replay(self) -> None:
        """Race the two recordings from t = 0 on a shared clock (``speed`` times real time)."""
        if self.summary is None:
            return
        self.status.setText("Racing the recorded runs on one clock\u2026")
        self.replay_button.setEnabled(False)
        self._wall0 = time.perf_counter()
        self.set_clock(0.0)
        self._timer.start()

    def set_clock(self, t: float) -> None:
        """Show both panes as they were ``t`` seconds after their prompts; the verdict appears at the end."""
        s = self.summary
        if s is None:
            return
        self.clock = t
        length = max(s.baseline.duration, s.other.duration)
        self.left.show_at(s.baseline, t, length)
        self.right.show_at(s.other, t, length)
        self.speed_plot.show_until(t)
        if t >= length:
            self._timer.stop()
            self._show_verdict()
        elif not self.left.badge.isHidden() or not self.right.badge.isHidden() or self.verdict.text():
            self.left.badge.hide()   # the clock went back before the finish: no winner yet
            self.right.badge.hide()
            self.verdict.setText("")

    def finish_replay(self) -> None:
        """Jump to the end of the race."""
        if self.summary is not None:
            self.set_clock(max(self.summary.baseline.duration, self.summary.other.duration))

    def _tick(self) -> None:
        self.set_clock((time.perf_counter() - self._wall0) * self.speed)

    def _show_verdict(self) -> None:
        s = self.summary
        winner = self.right if s.fastest == s.other.label else self.left
        winner.badge.show()
        b, o = s.baseline.result.stats, s.other.result.stats
        faster = s.speedup >= 1.0
        colour = "#1e8e3e" if faster else "#c62828"
        word = ("faster" if faster else "SLOWER: speculation does not pay for this prompt on this machine"
                if s.baseline.label == "Baseline" else f"SLOWER than {s.baseline.label} on this prompt")
        ttft_b = (b.time_to_first_token or 0) * 1000
        ttft_o = (o.time_to_first_token or 0) * 1000
        self.verdict.setText(
            f"<span style='font-size:13pt; color:{colour}'><b>{s.speedup:.2f}\u00d7</b> decode speed</span> "
            f"({word}) \u2014 {s.other.label} {o.tokens_per_second:.1f} tok/s vs {s.baseline.label} "
            f"{b.tokens_per_second:.1f} tok/s; whole answer {s.wall_speedup:.2f}\u00d7; first token "
            f"{ttft_o:.0f} ms vs {ttft_b:.0f} ms; {o.tokens_per_call:.2f} tokens per target call.<br>"
            f"{html.escape(s.identity_text())}")
        self.status.setText("Race finished. Replay it, or start another from the chat.")
        self.replay_button.setEnabled(True)
        self.raceFinished.emit(s)


class CompareDialog(QDialog):
    """A window around CompareWidget, for the main window's Compare action."""

    def __init__(self, make_engine: Callable[[object], object], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("SpecLens \u2014 race against plain decoding")
        self.resize(1100, 760)
        # modal: the race decodes on the window's own models, so the chat must not use them meanwhile
        self.setWindowModality(Qt.WindowModal)
        self.compare = CompareWidget(make_engine, self)
        layout = QVBoxLayout(self)
        layout.addWidget(self.compare)

    def closeEvent(self, event) -> None:
        self.compare.close()
        super().closeEvent(event)


def open_race(parent: QWidget, session, against_endpoint: bool = False) -> CompareDialog | None:
    """Open the race for a chat session: its loaded models, the strategy and sampling the chat uses, and the chat up
    to its last question, against plain decoding or (``against_endpoint``) against the server set in Settings. Says
    why in a dialog (and returns None) when it cannot race.

    Auto races with memory drafts from the chat itself only: its remembered answers include this very question's,
    which would make the race a replay rather than a decode.
    """
    def refuse(text: str) -> None:
        session.error.emit("Race", text)

    if session.backends is None or not session.is_warm:
        refuse("Wait for the models to load: the race decodes with the chat's model pair.")
        return None
    if session.busy:
        refuse(BUSY_REASON)
        return None
    messages = session.conv.messages if session.conv is not None else []
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=None)
    if last_user is None:
        refuse("Send a prompt first: the race decodes the chat's last question.")
        return None
    try:
        sampling = session.settings.sampling()
        strategy = session.settings.build_strategy()
    except ValueError as exc:
        refuse(f"Cannot race with these settings: {exc}")
        return None
    if isinstance(strategy, Baseline) and not against_endpoint:
        refuse("The strategy is Baseline: choose a speculative one in Settings to race it.")
        return None
    endpoint = None
    if against_endpoint:
        endpoint = _endpoint_run(session, refuse)
        if endpoint is None:
            return None
    if isinstance(strategy, Auto):
        strategy = Auto(use_memory=False)
    target, draft = session.backends
    chat = [{"role": m.role, "content": m.content} for m in messages[: last_user + 1]]
    try:
        fitted = fit_chat(session.conv.system_prompt, chat, target.apply_chat_template, target.context_length,
                          session.settings.max_new_tokens)
    except ValueError as exc:
        refuse(f"Cannot race this chat: {exc}")
        return None
    dialog = CompareDialog(lambda s: SpeculativeEngine(target, None if isinstance(s, Baseline) else draft, s,
                                                       sampling), parent)
    dialog.show()
    system = [{"role": "system", "content": session.conv.system_prompt}] if session.conv.system_prompt else []
    dialog.compare.start(fitted.prompt_ids, strategy, session.settings.max_new_tokens, endpoint,
                         system + chat[fitted.start:])
    return dialog


def _endpoint_run(session, refuse):
    """A run on the server set in Settings (which engine it is asked first), or None with the reason said."""
    from app.endpoint_chat import endpoint_of
    from core.endpoints.client import Endpoint, EndpointError, EndpointRun, probe

    endpoint = endpoint_of(session.settings)
    if not endpoint.url.strip():
        refuse("Set the other server's URL in Settings (Another server) to race it.")
        return None
    try:
        found = probe(endpoint)
    except EndpointError as exc:
        refuse(f"Cannot race the server: {exc}")
        return None
    model = endpoint.model if endpoint.model in found.models else found.models[0]
    target = session.backends[0]
    return EndpointRun.for_target(Endpoint(endpoint.url, endpoint.api_key, model), found.engine, target)
