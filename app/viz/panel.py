"""The right-hand live panel of the main window: the draft tree with its timeline, the plots, and the planner.

The window calls ``on_generation_started``, ``on_steps`` (once per frame) and ``on_finished``; the planned tree shape
and Auto's plan arrive inside the steps (StepEvent.shape, StepEvent.plan).
"""
from __future__ import annotations

import time
from typing import Sequence

from PySide6.QtCore import QEvent
from PySide6.QtWidgets import QLabel, QTabWidget, QVBoxLayout, QWidget

from app.viz.learn_view import LearnView
from app.viz.planner_view import PlannerView
from app.viz.plots import PlotsWidget
from app.viz.tree_view import BACKGROUND as TREE_BACKGROUND
from app.viz.tree_view import CAPTION_COLOUR, TreeReplay
from core.events import GenerationResult, PlanEvent, StepEvent


def stats_line(event: StepEvent | None, result: GenerationResult | None = None) -> str:
    """The one-line summary above the tabs, from engine timestamps only."""
    stats = result.stats if result is not None else event.stats if event is not None else None
    if stats is None:
        return "Live view: waiting for an answer."
    ttft = f"{stats.time_to_first_token * 1000:.0f} ms" if stats.time_to_first_token is not None else "-"
    line = (f"{stats.tokens_per_second:.1f} tok/s \u00b7 first token {ttft} \u00b7 {stats.new_tokens} tokens in "
            f"{stats.target_calls} target calls ({stats.tokens_per_call:.2f} per call)")
    if stats.drafted:
        line += f" \u00b7 drafted {stats.drafted}, accepted {stats.accepted} ({stats.accepted / stats.drafted:.0%})"
    if result is not None:
        line += f" \u00b7 stopped: {result.stop_reason.value}"
    return line


DRAW_INTERVAL_S = 0.5    # live drawing at most twice a second: a viewer cannot read trees faster, and on a
                         # 2-core machine every millisecond the GUI draws is taken from the decode (at four draws
                         # a second the panel alone took 4.5% of a core, shown against hidden)


class VizPanel(QWidget):
    """Receives the engine's events for the answer being generated, a frame at a time, and shows them live.

    Every step is kept (the slider replays any of them); the drawing is bounded: at most every DRAW_INTERVAL_S, and
    only what is visible: the newest tree if the Tree tab shows, the plots if the Plots tab shows.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.summary = QLabel(stats_line(None))
        self.summary.setWordWrap(True)
        self.tree = TreeReplay()
        self.plots = PlotsWidget()
        self.planner = PlannerView()
        self.learn = LearnView()
        self.tabs = QTabWidget()
        self.tabs.addTab(self.tree, "Tree")
        self.tabs.addTab(self.plots, "Plots")
        self.tabs.addTab(self.planner, "Planner")
        self.tabs.addTab(self.learn, "Learn")
        self.tree.slider.valueChanged.connect(self._explain_step)  # Learn explains the step the replay shows
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.summary)
        layout.addWidget(self.tabs, 1)
        self.label = ""
        self._drawn_at = 0.0
        self._undrawn: list[StepEvent] = []
        self._follow_palette()

    def changeEvent(self, event) -> None:
        if event.type() == QEvent.Type.PaletteChange:  # the window switched theme
            self._follow_palette()
        super().changeEvent(event)

    def _follow_palette(self) -> None:
        palette = self.palette()
        if palette.window().color().lightness() < 128:
            tree_bg = plot_bg = palette.base().color().name()
            caption = plot_ink = palette.text().color().name()
        else:
            tree_bg, caption, plot_bg, plot_ink = TREE_BACKGROUND, CAPTION_COLOUR, "w", "#333333"
        self.tree.view.set_colours(tree_bg, caption)
        for grid in (self.plots.graphics, self.planner.graphics):
            grid.set_colours(plot_bg, plot_ink)

    def set_plan(self, plan: PlanEvent) -> None:
        """Show what the planner measured and chose."""
        self.planner.show_plan(plan)
        self.learn.set_plan(plan)

    def _explain_step(self, i: int) -> None:
        if i < len(self.learn.events):
            self.learn.show_index(i)

    def on_generation_started(self, strategy_label: str) -> None:
        """A new answer starts: clear the previous one's data."""
        self.label = strategy_label
        self._undrawn = []
        self.tree.reset()
        self.plots.reset()
        self.learn.reset()
        self.summary.setText(f"{strategy_label}: generating\u2026")

    def on_steps(self, events: Sequence[StepEvent]) -> None:
        """The steps of the current answer since the last frame."""
        for event in events:
            self.plots.add_step(event)
            if event.plan is not None:
                self.set_plan(event.plan)
        self._undrawn.extend(events)
        now = time.monotonic()
        if self._undrawn and now - self._drawn_at >= DRAW_INTERVAL_S:
            self._draw()
            self._drawn_at = now

    def _draw(self) -> None:
        self.tree.add_steps(self._undrawn)
        self.learn.add_steps(self._undrawn)
        self.plots.refresh()
        self.summary.setText(stats_line(self._undrawn[-1]))
        self._undrawn = []

    def on_finished(self, result: GenerationResult) -> None:
        """The answer ended (EOS, limit, cancel)."""
        if self._undrawn:
            self._draw()
        self.tree.view.finish_animation()  # the answer's last tree stays settled, whenever the window is looked at
        self.plots.refresh()
        self.summary.setText(stats_line(None, result))
