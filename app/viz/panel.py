"""The right-hand live panel of the main window: the draft tree with its timeline, the plots, and the planner.

The window calls ``on_generation_started``, ``on_steps`` (once per frame) and ``on_finished``; the planned tree shape
and Auto's plan arrive inside the steps (StepEvent.shape, StepEvent.plan).
"""
from __future__ import annotations

from typing import Sequence

from PySide6.QtCore import QEvent
from PySide6.QtWidgets import QLabel, QTabWidget, QVBoxLayout, QWidget

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


class VizPanel(QWidget):
    """Receives the engine's events for the answer being generated, a frame at a time, and shows them live.

    Every step is kept (the slider replays any of them); each frame draws only what is visible: the newest tree if
    the Tree tab shows, the plots if the Plots tab shows, the plan when one arrives.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.summary = QLabel(stats_line(None))
        self.summary.setWordWrap(True)
        self.tree = TreeReplay()
        self.plots = PlotsWidget()
        self.planner = PlannerView()
        self.tabs = QTabWidget()
        self.tabs.addTab(self.tree, "Tree")
        self.tabs.addTab(self.plots, "Plots")
        self.tabs.addTab(self.planner, "Planner")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.summary)
        layout.addWidget(self.tabs, 1)
        self.label = ""
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

    def on_generation_started(self, strategy_label: str) -> None:
        """A new answer starts: clear the previous one's data."""
        self.label = strategy_label
        self.tree.reset()
        self.plots.reset()
        self.summary.setText(f"{strategy_label}: generating\u2026")

    def on_steps(self, events: Sequence[StepEvent]) -> None:
        """The steps of the current answer since the last frame."""
        if not events:
            return
        for event in events:
            self.plots.add_step(event)
            if event.plan is not None:
                self.set_plan(event.plan)
        self.tree.add_steps(events)
        self.plots.refresh()
        self.summary.setText(stats_line(events[-1]))

    def on_finished(self, result: GenerationResult) -> None:
        """The answer ended (EOS, limit, cancel)."""
        self.tree.view.finish_animation()  # the answer's last tree stays settled, whenever the window is looked at
        self.plots.refresh()
        self.summary.setText(stats_line(None, result))
