"""Live plots of one answer from engine timestamps: tokens/s over time, tokens per target call, acceptance by depth,
and the chain theory curve beside the measured mean.

Steps only append to buffers; the panel pushes them to curves created once (setData) once per frame, and only while
the plots are visible, so a fast engine never makes the GUI redraw per step.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtWidgets import QVBoxLayout, QWidget

from core.events import StepEvent

pg.setConfigOptions(antialias=True, background="w", foreground="#333333")

SPEC_COLOUR = "#1a56db"
BASE_COLOUR = "#757575"
BAR_COLOUR = "#1e8e3e"
THEORY_COLOUR = "#e65100"
LEGEND_BRUSH = (255, 255, 255, 225)  # legends stay readable over curves
NARROW = 760  # below this width the plots stack in one column instead of being clipped


class PlotGrid(pg.GraphicsLayoutWidget):
    """A grid of plots that stacks them in one column when the panel is narrow (pyqtgraph does not shrink them)."""

    def __init__(self) -> None:
        self.plots: list[pg.PlotItem] = []  # set before the base class, whose constructor already resizes
        self._columns = 0
        super().__init__()

    def add(self, title: str) -> pg.PlotItem:
        plot = pg.PlotItem(title=title)
        for axis in ("left", "bottom"):
            plot.getAxis(axis).enableAutoSIPrefix(False)  # "(x0.001)" beside a unit only confuses
        self.plots.append(plot)
        self._arrange(force=True)
        return plot

    def _arrange(self, force: bool = False) -> None:
        columns = 1 if 0 < self.width() < NARROW else 2
        if columns == self._columns and not force:
            return
        self._columns = columns
        for plot in self.plots:
            if plot in self.ci.items:
                self.ci.removeItem(plot)
        for i, plot in enumerate(self.plots):
            self.ci.addItem(plot, row=i // columns, col=i % columns)

    def set_colours(self, background: str, ink: str) -> None:
        """Background, axes and titles in the window's theme."""
        self.setBackground(background)
        for plot in self.plots:
            for axis in ("left", "bottom"):
                plot.getAxis(axis).setPen(ink)
                plot.getAxis(axis).setTextPen(ink)
            plot.setTitle(plot.titleLabel.text, color=ink)

    def resizeEvent(self, event) -> None:
        if self.plots:
            self._arrange()
        super().resizeEvent(event)


def expected_tokens_per_call(b: np.ndarray | float, g: int) -> np.ndarray | float:
    """(1 - b^(g+1)) / (1 - b): mean tokens per target call of a g-token chain with i.i.d. acceptance rate b."""
    b = np.asarray(b, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(np.isclose(b, 1.0), g + 1.0, (1.0 - b ** (g + 1)) / (1.0 - b))
    return out if out.ndim else float(out)


class Series:
    """A growable (x, y) buffer: appends are amortised O(1), views are handed to setData."""

    def __init__(self, capacity: int = 256) -> None:
        self._xy = np.zeros((2, capacity))
        self.n = 0

    def append(self, x: float, y: float) -> None:
        if self.n == self._xy.shape[1]:
            self._xy = np.concatenate([self._xy, np.zeros_like(self._xy)], axis=1)
        self._xy[:, self.n] = (x, y)
        self.n += 1

    def clear(self) -> None:
        self.n = 0

    @property
    def x(self) -> np.ndarray:
        return self._xy[0, : self.n]

    @property
    def y(self) -> np.ndarray:
        return self._xy[1, : self.n]


class PlotsWidget(QWidget):
    """Four plots of the current answer; when racing, the baseline's speed shares the tokens/s axes."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.graphics = PlotGrid()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.graphics)

        self.speed_plot = self.graphics.add("tokens/s over time (engine clock)")
        self.speed_plot.setLabel("bottom", "seconds since the prompt")
        self.speed_plot.setLabel("left", "tokens/s")
        self.speed_plot.showGrid(x=True, y=True, alpha=0.25)
        self.speed_plot.addLegend(offset=(-10, 10), brush=LEGEND_BRUSH)
        self.spec_curve = self.speed_plot.plot(pen=pg.mkPen(SPEC_COLOUR, width=2.5), name="speculative")
        self.base_curve = self.speed_plot.plot(pen=pg.mkPen(BASE_COLOUR, width=2, style=pg.QtCore.Qt.DashLine),
                                               name="baseline")

        self.hist_plot = self.graphics.add("tokens per target call")
        self.hist_plot.setLabel("bottom", "tokens emitted by one target call")
        self.hist_plot.setLabel("left", "calls")
        self.hist_bars = pg.BarGraphItem(x=[], height=[], width=0.7, brush=SPEC_COLOUR)
        self.hist_plot.addItem(self.hist_bars)

        self.depth_plot = self.graphics.add("acceptance rate by depth")
        self.depth_plot.setLabel("bottom", "depth in the draft tree")
        self.depth_plot.setLabel("left", "accepted / tested")
        self.depth_plot.setYRange(0, 1.05)
        self.depth_bars = pg.BarGraphItem(x=[], height=[], width=0.7, brush=BAR_COLOUR)
        self.depth_plot.addItem(self.depth_bars)

        self.theory_plot = self.graphics.add("theory vs measured")
        self.theory_plot.setLabel("bottom", "acceptance rate b")
        self.theory_plot.setLabel("left", "tokens per call")
        self.theory_plot.setXRange(0, 1)
        self.theory_plot.addLegend(offset=(10, 10), brush=LEGEND_BRUSH)
        self.theory_curve = self.theory_plot.plot(pen=pg.mkPen(THEORY_COLOUR, width=2), name="(1-b^(g+1))/(1-b)")
        self.measured_point = self.theory_plot.plot(pen=None, symbol="o", symbolSize=11, symbolBrush=SPEC_COLOUR,
                                                    name="measured")

        self.spec = Series()
        self.base = Series()
        self.calls: dict[int, int] = {}
        self.depth_rates: tuple[float, ...] = ()
        self.max_depth = 0
        self.accept_rate: float | None = None
        self.tokens_per_call = 0.0
        self._dirty = False

    def reset(self, keep_baseline: bool = False) -> None:
        """Clear the speculative data (and the baseline's unless ``keep_baseline``)."""
        self.spec.clear()
        if not keep_baseline:
            self.base.clear()
        self.calls, self.depth_rates, self.max_depth = {}, (), 0
        self.accept_rate, self.tokens_per_call = None, 0.0
        self._dirty = True

    def add_step(self, event: StepEvent) -> None:
        """Buffer one step of the speculative (or only) run."""
        stats = event.stats
        if stats.new_tokens >= 2:  # a rate needs two tokens; before that it is only the time to the first one
            self.spec.append(event.timestamp, stats.tokens_per_second)
        n = len(event.tokens)
        self.calls[n] = self.calls.get(n, 0) + 1
        self.depth_rates = stats.acceptance_by_depth
        self.max_depth = max([self.max_depth] + [node.depth for node in event.nodes])
        tested = sum(stats.attempted_by_depth)
        self.accept_rate = sum(stats.accepted_by_depth) / tested if tested else None
        self.tokens_per_call = stats.tokens_per_call
        self._dirty = True

    def add_baseline_step(self, event: StepEvent) -> None:
        """Buffer one step of the baseline run being raced against."""
        if event.stats.new_tokens >= 2:
            self.base.append(event.timestamp, event.stats.tokens_per_second)
        self._dirty = True

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self.refresh()

    def refresh(self) -> None:
        """Push buffered data to the plots (once per frame while visible; cheap when nothing changed)."""
        if not self._dirty or not self.isVisible():
            return
        self._dirty = False
        self.spec_curve.setData(self.spec.x, self.spec.y)
        self.base_curve.setData(self.base.x, self.base.y)
        sizes = sorted(self.calls)
        self.hist_bars.setOpts(x=sizes, height=[self.calls[s] for s in sizes])
        self.hist_plot.getAxis("bottom").setTicks([[(s, str(s)) for s in range(1, max(sizes, default=1) + 1)]])
        depths = list(range(1, len(self.depth_rates) + 1))
        self.depth_bars.setOpts(x=depths, height=list(self.depth_rates))
        self.depth_plot.getAxis("bottom").setTicks([[(d, str(d)) for d in depths]])
        g = self.max_depth
        self.theory_plot.setTitle(f"theory (chain of g = {g}) vs measured" if g else "theory vs measured")
        if g:
            b = np.linspace(0.0, 0.99, 100)
            self.theory_curve.setData(b, expected_tokens_per_call(b, g))
        else:
            self.theory_curve.setData([], [])
        if self.accept_rate is not None:
            self.measured_point.setData([self.accept_rate], [self.tokens_per_call])
        else:
            self.measured_point.setData([], [])
