"""The draft tree of one verification step, drawn top-down as token boxes, animated from step to step.

Accepted path lit (green), rejected nodes red and dimmed, nodes the target never tested grey, the target's own
correction (orange) or bonus (blue) token marked with a star, and planned-but-undrafted slots as faint dashed boxes.
Hover a box for its explanation; a click puts it in the details line and emits ``nodeSelected``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from PySide6.QtCore import QEasingCurve, QPointF, QRectF, Qt, QVariantAnimation, Signal
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetricsF, QPainter, QPen
from PySide6.QtWidgets import (QGraphicsItem, QGraphicsLineItem, QGraphicsObject, QGraphicsScene, QGraphicsSimpleTextItem,
                               QGraphicsView, QHBoxLayout, QLabel, QSlider, QVBoxLayout, QWidget)

from app.viz import tree_layout as tl
from core.events import Origin, StepEvent


@dataclass(frozen=True)
class Style:
    fill: str
    border: str
    text: str
    opacity: float = 1.0
    dashed: bool = False
    marker: str = ""


STYLES = {
    tl.ROOT: Style("#37474f", "#263238", "#ffffff"),
    tl.ACCEPTED: Style("#c8f0d2", "#1e8e3e", "#0d3b1a"),
    tl.REJECTED: Style("#fbd5d5", "#c62828", "#6d1b1b", opacity=0.6),
    tl.NOT_REACHED: Style("#eceff1", "#b0bec5", "#78909c"),
    tl.CORRECTION: Style("#ffe0b2", "#e65100", "#5d2c00", marker="\u2605"),
    tl.BONUS: Style("#d0e2ff", "#1a56db", "#0b2a6b", marker="\u2605"),
    tl.PLANNED: Style("transparent", "#b0bec5", "#b0bec5", opacity=0.6, dashed=True),
}
LEGEND = [(tl.ACCEPTED, "accepted"), (tl.REJECTED, "rejected"), (tl.NOT_REACHED, "not reached"),
          (tl.CORRECTION, "\u2605 correction"), (tl.BONUS, "\u2605 bonus"), (tl.PLANNED, "planned, not drafted")]

BOX_H = 26.0
MIN_BOX_W = 34.0
SLOT_W = 74.0
LEVEL_H = 58.0
ANIMATION_MS = 260
CAPTION_H = 13.0
DROP = 10.0   # how far a box with new content drops in from
GAP = 8.0     # between the depth labels and the leftmost box
CAPTION_COLOUR = "#546e7a"
BACKGROUND = "#fafafa"


class NodeItem(QGraphicsObject):
    """One token box; its colours come from ``Style`` and its explanation is the tooltip."""

    def __init__(self, box: tl.Box, font: QFont, small: QFont, ink: str) -> None:
        super().__init__()
        self._font = font
        self._small = small
        self.ink = ink  # colour of the caption under the box
        self.setAcceptHoverEvents(True)
        self.setCursor(Qt.PointingHandCursor)
        # a box is drawn once into a pixmap and blitted on every later repaint of the view (antialiased rounded
        # rectangles cost about a millisecond each in the software renderer)
        self.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
        self.apply(box)

    def apply(self, box: tl.Box) -> None:
        # before the width changes: the scene must learn of a new size while it still knows the old one
        self.prepareGeometryChange()
        self.box = box
        self.style = STYLES[box.kind]
        label = f"{self.style.marker}{box.label}" if self.style.marker else box.label
        self.label = label
        width = QFontMetricsF(self._font).horizontalAdvance(label) + 14
        self.width = max(MIN_BOX_W, width)
        self.setToolTip(box.detail)
        self.setZValue(2 if box.on_path else 1)
        self.update()

    def boundingRect(self) -> QRectF:
        w = max(self.width, SLOT_W - 4)
        return QRectF(-w / 2 - 2, -BOX_H / 2 - 2, w + 4, BOX_H + CAPTION_H + 4)

    def paint(self, painter: QPainter, option, widget=None) -> None:
        s = self.style
        pen = QPen(QColor(s.border), 2.6 if self.box.on_path and self.box.kind != tl.ROOT else 1.4)
        if s.dashed:
            pen.setStyle(Qt.DashLine)
        painter.setRenderHint(QPainter.Antialiasing)
        painter.setPen(pen)
        painter.setBrush(QBrush(QColor(s.fill)))
        rect = QRectF(-self.width / 2, -BOX_H / 2, self.width, BOX_H)
        painter.drawRoundedRect(rect, 6, 6)
        if self.box.source:  # the drafter that proposed it, when the tree mixes several (tree_layout.SOURCE_COLOURS)
            painter.setPen(Qt.NoPen)
            painter.setBrush(QColor(tl.source_colour(self.box.source)))
            painter.drawRoundedRect(QRectF(-self.width / 2 + 2, -BOX_H / 2 + 3, 4, BOX_H - 6), 2, 2)
        painter.setFont(self._font)
        painter.setPen(QColor(s.text))
        painter.drawText(rect, Qt.AlignCenter, self.label)
        if self.box.caption:
            painter.setFont(self._small)
            painter.setPen(QColor(self.ink))
            below = QRectF(-(SLOT_W - 4) / 2, BOX_H / 2 + 1, SLOT_W - 4, CAPTION_H)
            painter.drawText(below, Qt.AlignHCenter | Qt.AlignTop, self.box.caption)


class TreeView(QGraphicsView):
    """Shows one StepEvent's tree; ``show_step`` animates to the next one."""

    nodeSelected = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        scene = QGraphicsScene(self)
        # boxes move, resize, come and go every step: a spatial index would be rebuilt as often as it is used
        scene.setItemIndexMethod(QGraphicsScene.ItemIndexMethod.NoIndex)
        self.setScene(scene)
        self.setRenderHint(QPainter.Antialiasing)
        self._ink = CAPTION_COLOUR
        self.setBackgroundBrush(QColor(BACKGROUND))
        self.setMinimumHeight(200)
        self._font = QFont("DejaVu Sans Mono", 10)
        self._small = QFont("DejaVu Sans", 7)
        self._depth_labels: list[QGraphicsSimpleTextItem] = []
        self._items: dict[str, NodeItem] = {}
        self._edges: dict[str, QGraphicsLineItem] = {}
        self._leaving: list[NodeItem] = []
        self._start: dict[str, QPointF] = {}
        self._goal: dict[str, QPointF] = {}
        self._fresh: set[str] = set()
        self._changed: set[str] = set()
        self.event: StepEvent | None = None
        self.boxes: list[tl.Box] = []
        self._anim = QVariantAnimation(self)
        self._anim.setDuration(ANIMATION_MS)
        self._anim.setStartValue(0.0)
        self._anim.setEndValue(1.0)
        self._anim.setEasingCurve(QEasingCurve.OutCubic)
        self._anim.valueChanged.connect(self._advance)
        self._anim.finished.connect(self._settle)

    # -- public -----------------------------------------------------------------------------------------------
    def show_step(self, event: StepEvent, animate: bool = True) -> None:
        """Draw ``event``'s tree; boxes that keep their slot glide to their new place, new ones grow in."""
        self._anim.stop()
        self._settle()
        self.event = event
        self.boxes = tl.layout_step(event)
        goal = {b.key: QPointF(b.x * SLOT_W, b.depth * LEVEL_H) for b in self.boxes}
        old = {k: item.pos() for k, item in self._items.items()}
        for key in [k for k in self._items if k not in goal]:
            self._leaving.append(self._items.pop(key))
        self._start, self._goal, self._fresh, self._changed = {}, goal, set(), set()
        for box in self.boxes:
            item = self._items.get(box.key)
            if item is None:
                item = NodeItem(box, self._font, self._small, self._ink)
                self.scene().addItem(item)
                self._items[box.key] = item
                self._fresh.add(box.key)
                origin = old.get(box.parent_key) if box.parent_key else None
                self._start[box.key] = origin if origin is not None else goal.get(box.parent_key, goal[box.key])
            else:
                changed = (item.box.label, item.box.kind, item.box.caption) != (box.label, box.kind, box.caption)
                item.apply(box)
                self._start[box.key] = old[box.key]
                if changed and old[box.key] == goal[box.key]:
                    # new content in the same place: drop it in from slightly above and fade it up
                    self._start[box.key] = goal[box.key] - QPointF(0.0, DROP)
                    self._changed.add(box.key)
        self._sync_edges()
        self._label_depths()
        self._fit()
        if animate and (self._fresh or self._leaving or any(self._start[k] != goal[k] for k in goal)):
            self._advance(0.0)
            self._anim.start()
        else:
            self._settle()

    def clear(self) -> None:
        """Forget the drawing (a new answer starts)."""
        self._anim.stop()
        self.scene().clear()
        self._items, self._edges, self._leaving, self._depth_labels = {}, {}, [], []
        self.event, self.boxes = None, []

    def item(self, key: str) -> NodeItem:
        """The box drawn for layout key ``key`` (tests and the details line use it)."""
        return self._items[key]

    def items_by_kind(self) -> dict[str, int]:
        """How many boxes of each kind are on screen."""
        counts: dict[str, int] = {}
        for item in self._items.values():
            counts[item.box.kind] = counts.get(item.box.kind, 0) + 1
        return counts

    def set_colours(self, background: str, ink: str) -> None:
        """Background and caption colours (the token boxes keep theirs: they read on light and dark alike)."""
        self._ink = ink
        self.setBackgroundBrush(QColor(background))
        for item in self._items.values():
            item.ink = ink
            item.update()
        for label in self._depth_labels:
            label.setBrush(QColor(ink))

    def finish_animation(self) -> None:
        """Jump to the end of the running animation (the answer ended, or a screenshot is due)."""
        if self._anim.state() == QVariantAnimation.Running:
            self._anim.stop()
        self._settle()

    # -- drawing ----------------------------------------------------------------------------------------------
    def _advance(self, t: float) -> None:
        t = float(t)
        for key, item in self._items.items():
            a, b = self._start.get(key, self._goal[key]), self._goal[key]
            item.setPos(a + (b - a) * t)
            target = item.style.opacity
            item.setOpacity(target * t if key in self._fresh else
                            target * (0.35 + 0.65 * t) if key in self._changed else target)
        for item in self._leaving:
            item.setOpacity(max(0.0, 1.0 - 2 * t) * item.style.opacity)
        self._place_edges()

    def _settle(self) -> None:
        for item in self._leaving:
            self.scene().removeItem(item)
        self._leaving = []
        for key, item in self._items.items():
            item.setPos(self._goal.get(key, item.pos()))
            item.setOpacity(item.style.opacity)
        self._fresh, self._changed = set(), set()
        self._place_edges()

    def _sync_edges(self) -> None:
        wanted = {b.key for b in self.boxes if b.parent_key is not None}
        for key in [k for k in self._edges if k not in wanted]:
            self.scene().removeItem(self._edges.pop(key))
        for box in self.boxes:
            if box.parent_key is None:
                continue
            edge = self._edges.get(box.key)
            if edge is None:
                edge = QGraphicsLineItem()
                edge.setZValue(0)
                self.scene().addItem(edge)
                self._edges[box.key] = edge
            style = STYLES[box.kind]
            pen = QPen(QColor(style.border), 2.4 if box.on_path else 1.0)
            if style.dashed or box.kind == tl.NOT_REACHED:
                pen.setStyle(Qt.DashLine)
            edge.setPen(pen)
            edge.setOpacity(style.opacity)

    def _edges_x(self) -> tuple[float, float]:
        """The left and right edges of the drawing's boxes and captions (a long token's box is wider than its slot)."""
        halves = [(b.x * SLOT_W, self._items[b.key].boundingRect().width() / 2) for b in self.boxes]
        return min(x - h for x, h in halves), max(x + h for x, h in halves)

    def _label_depths(self) -> None:
        for label in self._depth_labels:
            self.scene().removeItem(label)
        left, _ = self._edges_x()
        self._depth_labels = []
        for depth in sorted({b.depth for b in self.boxes if b.depth > 0}):
            label = QGraphicsSimpleTextItem(f"depth {depth}")
            label.setFont(self._small)
            label.setBrush(QColor(self._ink))
            size = label.boundingRect()
            label.setPos(left - GAP - size.width(), depth * LEVEL_H - size.height() / 2)
            self.scene().addItem(label)
            self._depth_labels.append(label)

    def _place_edges(self) -> None:
        for box in self.boxes:
            edge = self._edges.get(box.key)
            if edge is None:
                continue
            parent_item = self._items[box.parent_key]
            child, parent = self._items[box.key].pos(), parent_item.pos()
            below = BOX_H / 2 + (CAPTION_H if parent_item.box.caption else 0.0)  # start under the parent's caption
            edge.setLine(parent.x(), parent.y() + below, child.x(), child.y() - BOX_H / 2)

    def _fit(self) -> None:
        left, right = self._edges_x()
        labels = max((label.boundingRect().width() for label in self._depth_labels), default=0.0) + 2 * GAP
        ys = [b.depth * LEVEL_H for b in self.boxes]
        rect = QRectF(left - labels, min(ys) - LEVEL_H / 2, right - left + labels + 2 * GAP,
                      max(ys) - min(ys) + LEVEL_H + CAPTION_H)
        self.scene().setSceneRect(rect)
        self.resetTransform()
        view = self.viewport().rect()
        # shrink wide trees to fit; enlarge small ones a little, no more, so boxes stay like text
        scale = min(1.5, view.width() / rect.width(), view.height() / rect.height()) if view.width() > 0 else 1.0
        self.scale(scale, scale)
        self.centerOn(rect.center())

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if self.boxes:
            self._fit()

    def mousePressEvent(self, event) -> None:
        item = self.itemAt(event.position().toPoint())
        while item is not None and not isinstance(item, NodeItem):
            item = item.parentItem()
        if isinstance(item, NodeItem):
            self.nodeSelected.emit(item.box.detail)
        super().mousePressEvent(event)


def legend_html(sources: Sequence[str] = ()) -> str:
    """The colour key under the tree, as rich text; ``sources``: the drafters of a mixed tree, by badge colour."""
    cells = []
    for kind, name in LEGEND:
        s = STYLES[kind]
        border = "dashed" if s.dashed else "solid"
        cells.append(f"<span style='background:{s.fill}; color:{s.text}; border:1px {border} {s.border};'>"
                     f"&nbsp;{name}&nbsp;</span>")
    cells += [f"<span style='color:{tl.source_colour(src)};'>\u258c</span>{src}" for src in sources]
    return "&nbsp;&nbsp;".join(cells)


class TreeReplay(QWidget):
    """The tree view with a timeline slider over the answer's steps, a step caption, a legend and a details line.

    While the slider sits at the last step it follows new steps live; moved back, it replays that step and stays.
    Live steps arrive a frame at a time: only the newest of a frame is drawn, without animation (an animation runs
    at 60 redraws a second, which a decode on the same two cores would pay for), and only while the view is visible;
    a hidden view draws the newest step when it is shown. The slider replays with animation.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.view = TreeView(self)
        self.caption = QLabel("No answer yet: send a prompt to see its draft trees.")
        self.caption.setWordWrap(True)
        self.slider = QSlider(Qt.Horizontal)
        self.slider.setEnabled(False)
        self.slider.setToolTip("Replay any step of the answer")
        self.step_label = QLabel("step -/-")
        self.legend = QLabel(legend_html())
        self.legend.setTextFormat(Qt.RichText)
        self.legend.setWordWrap(True)
        self.details = QLabel("Hover or click a token box for q, p and why it was kept or not.")
        self.details.setWordWrap(True)
        self.details.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.details.setStyleSheet("font-family: 'DejaVu Sans Mono'; font-size: 9pt;")
        self.details.setMinimumHeight(54)
        self.details.setAlignment(Qt.AlignTop | Qt.AlignLeft)
        row = QHBoxLayout()
        row.addWidget(self.slider, 1)
        row.addWidget(self.step_label)
        layout = QVBoxLayout(self)
        layout.addWidget(self.caption)
        layout.addWidget(self.view, 1)
        layout.addLayout(row)
        layout.addWidget(self.legend)
        layout.addWidget(self.details)
        self.events: list[StepEvent] = []
        self._stale = False          # a step arrived while hidden: draw it when shown
        self.slider.valueChanged.connect(self._on_slider)
        self.view.nodeSelected.connect(self.details.setText)

    def reset(self) -> None:
        """A new answer: forget past steps."""
        self.events = []
        self._stale = False
        self.view.clear()
        self.slider.blockSignals(True)
        self.slider.setRange(0, 0)
        self.slider.setEnabled(False)
        self.slider.blockSignals(False)
        self.step_label.setText("step -/-")

    def add_steps(self, events: Sequence[StepEvent]) -> None:
        """Record live steps (a frame's worth); show the newest if the slider follows and the view is visible."""
        if not events:
            return
        following = not self.events or self.slider.value() == len(self.events) - 1
        self.events.extend(events)
        self.slider.blockSignals(True)
        self.slider.setRange(0, len(self.events) - 1)
        self.slider.setEnabled(len(self.events) > 1)
        if following:
            self.slider.setValue(len(self.events) - 1)
        self.slider.blockSignals(False)
        if not following:
            self._update_label(self.slider.value())
        elif self.isVisible():
            self.show_index(len(self.events) - 1, animate=False)
        else:
            self._stale = True

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if self._stale and self.events:
            self.show_index(self.slider.value(), animate=False)

    def show_index(self, i: int, animate: bool = True) -> None:
        """Draw step ``i`` of the answer (0-based)."""
        if not 0 <= i < len(self.events):
            raise IndexError(f"step {i} does not exist: the answer has {len(self.events)} steps")
        self._stale = False
        self.view.show_step(self.events[i], animate)
        legend = legend_html(tl.mixed_sources(self.events[i].nodes))
        if legend != self.legend.text():  # a rich-text label lays itself out again on every setText
            self.legend.setText(legend)
        if self.slider.value() != i:
            self.slider.blockSignals(True)
            self.slider.setValue(i)
            self.slider.blockSignals(False)
        self._update_label(i)

    def _on_slider(self, value: int) -> None:
        if self.events:
            self.show_index(value)

    def _update_label(self, i: int) -> None:
        e = self.events[i]
        self.step_label.setText(f"step {i + 1}/{len(self.events)}")
        kept = sum(1 for n in e.nodes if n.fate.value == tl.ACCEPTED)
        extra = e.origins[-1].value if e.origins and e.origins[-1] != Origin.DRAFT else ""
        self.caption.setText(
            f"{e.strategy or 'step'} \u2014 step {e.step + 1}: drafted {len(e.nodes)}, accepted {kept}"
            + (f", + 1 {extra} token" if extra else "")
            + f" \u2192 {len(e.tokens)} token{'s' if len(e.tokens) != 1 else ''} this target call"
            + (f" \u2014 {e.note}" if e.note else ""))
