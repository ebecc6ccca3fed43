"""What the Sequoia planner saw and chose: the acceptance vector, the DP's best value by tree size and depth, the
measured verify latencies, the chosen plan, and predicted against realised speedup.

The view draws a :class:`core.events.PlanEvent` (immutable: Auto sends a new one when it re-plans), so it depends
on no planner internals and never reads a plan the engine's thread may change.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from app.viz.plots import PlotGrid
from core.events import PlanEvent

DEPTH_COLOURS = ["#90caf9", "#64b5f6", "#42a5f5", "#1e88e5", "#1565c0", "#0d47a1", "#311b92", "#1a237e"]
PLAN_COLOUR = "#e65100"


def _shape_text(parents: Sequence[int]) -> str:
    widths: list[int] = []
    depths: list[int] = []
    for p in parents:
        depths.append(1 if p < 0 else depths[p] + 1)
    for level in range(1, max(depths, default=0) + 1):
        widths.append(depths.count(level))
    return " / ".join(str(w) for w in widths) or "nothing drafted"


class PlannerView(QWidget):
    """Four plots and a summary line; empty with an explanation until a snapshot arrives."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.summary = QLabel("No plan yet: choose Sequoia or Auto, or run `speclens plan`, to see what the "
                              "planner measured and chose.")
        self.summary.setWordWrap(True)
        self.summary.setTextFormat(Qt.RichText)
        self.graphics = PlotGrid()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.summary)
        layout.addWidget(self.graphics, 1)

        self.acc_plot = self.graphics.add("acceptance vector: a(i) = P(the i-th child is accepted)")
        self.acc_plot.setLabel("bottom", "rank of the drafted child")
        self.acc_plot.setLabel("left", "a(i)")
        self.acc_bars = pg.BarGraphItem(x=[], height=[], width=0.7, brush="#1e8e3e")
        self.acc_plot.addItem(self.acc_bars)

        self.dp_plot = self.graphics.add("DP: best tokens per call c(n, d)")
        self.dp_plot.setLabel("bottom", "tree size n (tokens per target call)")
        self.dp_plot.setLabel("left", "expected tokens per call")
        self.dp_plot.showGrid(x=True, y=True, alpha=0.25)
        self.dp_plot.setYRange(0, 1, padding=0)  # widened in show_snapshot; starts at 0 to leave room for the legend
        self.dp_legend = self.dp_plot.addLegend(offset=(-10, -10), colCount=3, brush=(255, 255, 255, 225))
        self.dp_curves: list[pg.PlotDataItem] = []
        self.dp_plan = self.dp_plot.plot(pen=None, symbol="star", symbolSize=18, symbolBrush=PLAN_COLOUR,
                                         name="chosen plan")

        self.lat_plot = self.graphics.add("measured verify latency")
        self.lat_plot.setLabel("bottom", "tokens in one target call")
        self.lat_plot.setLabel("left", "\u00d7 one plain decode")
        self.lat_plot.showGrid(x=True, y=True, alpha=0.25)
        self.lat_curve = self.lat_plot.plot(pen=pg.mkPen("#1a56db", width=2), symbol="o", symbolSize=7,
                                            symbolBrush="#1a56db")
        self.lat_ideal = self.lat_plot.plot(pen=pg.mkPen("#9e9e9e", width=1, style=Qt.DashLine))

        self.speed_plot = self.graphics.add("speedup over plain decoding")
        self.speed_plot.setLabel("left", "\u00d7 baseline tokens/s")
        self.speed_bars = pg.BarGraphItem(x=[], height=[], width=0.6, brushes=[])
        self.speed_plot.addItem(self.speed_bars)
        self.speed_plot.addLine(y=1.0, pen=pg.mkPen("#c62828", width=1, style=Qt.DashLine))
        self.speed_plot.getAxis("bottom").setTicks([[(0, "predicted"), (1, "realised")]])
        self.speed_plot.setXRange(-0.6, 1.6)
        self.speed_labels = [pg.TextItem(anchor=(0.5, 1.0), color="#222222") for _ in range(2)]
        for label in self.speed_labels:
            self.speed_plot.addItem(label)
        self.snapshot: PlanEvent | None = None

    def show_plan(self, snap: PlanEvent) -> None:
        """Draw a plan."""
        self.snapshot = snap
        a = snap.acceptance
        self.acc_bars.setOpts(x=list(range(1, len(a) + 1)), height=list(a))
        self.acc_plot.getAxis("bottom").setTicks([[(i, str(i)) for i in range(1, len(a) + 1)]])
        for curve in self.dp_curves:
            self.dp_plot.removeItem(curve)
            self.dp_legend.removeItem(curve)
        self.dp_curves = []
        max_n = len(snap.best_value[0]) - 1 if snap.best_value else 0
        ns = np.arange(1, max_n + 1)
        for d in range(1, len(snap.best_value)):
            colour = DEPTH_COLOURS[min(d - 1, len(DEPTH_COLOURS) - 1)]
            curve = self.dp_plot.plot(ns, np.asarray(snap.best_value[d][1:]), pen=pg.mkPen(colour, width=2),
                                      name=f"d \u2264 {d}")
            self.dp_curves.append(curve)
        self.dp_plan.setData([snap.plan_budget], [snap.predicted_tokens])
        top = max((max(row[1:], default=1.0) for row in snap.best_value), default=1.0)
        self.dp_plot.setYRange(0, top * 1.08, padding=0)
        self.dp_plan.setZValue(10)
        sizes = sorted(snap.verify_seconds)
        plain = snap.verify_seconds.get(1) or snap.verify_seconds[sizes[0]] / sizes[0]
        self.lat_curve.setData(sizes, [snap.verify_seconds[n] / plain for n in sizes])
        self.lat_ideal.setData([sizes[0], sizes[-1]], [1.0, 1.0])
        heights = [snap.predicted_speedup, snap.realised_speedup or 0.0]
        brushes = [pg.mkBrush(PLAN_COLOUR), pg.mkBrush("#1a56db" if snap.realised_speedup else "#eeeeee")]
        self.speed_bars.setOpts(x=[0, 1], height=heights, brushes=brushes)
        for i, (label, h) in enumerate(zip(self.speed_labels, heights)):
            label.setText(f"{h:.2f}\u00d7" if h else "not raced")
            label.setPos(i, h)
        self.speed_plot.setYRange(0, max(heights + [1.0]) * 1.18, padding=0)
        realised = (f"realised <b>{snap.realised_speedup:.2f}\u00d7</b>" if snap.realised_speedup is not None
                    else "realised: not raced yet (open Compare)")
        verdict = ("the draft model's tree does not pay here: it stays idle" if snap.plan_parents and
                   snap.predicted_speedup < 1.0 else "no draft-model tree: memory drafts only" if not snap.plan_parents
                   else "")
        self.summary.setText(
            f"<b>Plan</b>: {snap.plan_budget} tokens per call, depth {snap.plan_depth}, level widths "
            f"{_shape_text(snap.plan_parents)}; predicted {snap.predicted_tokens:.2f} tokens per call, "
            f"<b>{snap.predicted_speedup:.2f}\u00d7</b> predicted, {realised}."
            + (f" <i>{verdict}</i>" if verdict else "") + (f"<br>{snap.note}" if snap.note else ""))
