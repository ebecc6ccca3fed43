"""The draft tree view: boxes and colours match a StepEvent, planned slots, explanations, the timeline slider."""
from __future__ import annotations

import pytest
from PySide6.QtCore import QPointF
from PySide6.QtGui import QColor

from app.viz import tree_layout as tl
from app.viz.scenes import record, telling_step
from app.viz.tree_view import BOX_H, LEVEL_H, SLOT_W, STYLES, TreeReplay, TreeView
from core.drafting import Chain, Tree
from core.events import Fate, GenerationStats, NodeInfo, Origin, StepEvent
from core.sampling import SamplingParams
from core.tiny import tiny_pair

SHAPE = (-1, -1, -1, 0, 0, 1, 3, 3, 6)


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(noise=0.3)


@pytest.fixture(scope="module")
def sampled_run(pair):
    return record(pair, Tree(SHAPE, name="shape"), SamplingParams(temperature=0.8, seed=3), 60)


def node(i, parent, depth, fate, text="x", p=0.3, q=0.5, a=0.6):
    tested = fate != Fate.NOT_REACHED
    return NodeInfo(i, 40 + i, text, parent, depth, q, p if tested else None, fate, a if tested else None, "draft")


def event(nodes, path, extra_origin=Origin.CORRECTION, margins=(), shape=None, specials=None):
    tokens = tuple(40 + j for j in path) + (99,)
    origins = (Origin.DRAFT,) * len(path) + (extra_origin,)
    texts = tuple("x" for _ in path) + ("\n",)
    return StepEvent(step=0, nodes=tuple(nodes), accepted_path=tuple(path), tokens=tokens, origins=origins,
                     token_texts=texts, specials=specials or ("",) * len(tokens), text="", spans=(),
                     margins=margins, draft_seconds=0.0, verify_seconds=0.0, timestamp=0.1, stats=GenerationStats(),
                     greedy=bool(margins), shape=shape)


def expected_kinds(e: StepEvent, planned: int = 0) -> dict[str, int]:
    kinds = {tl.ROOT: 1}
    for n in e.nodes:
        kinds[n.fate.value] = kinds.get(n.fate.value, 0) + 1
    if e.origins and e.origins[-1] != Origin.DRAFT:
        kinds[e.origins[-1].value] = 1
    if planned:
        kinds[tl.PLANNED] = planned
    return kinds


def pixel_at(view: TreeView, key: str) -> QColor:
    """The rendered colour inside the top-left of a box, away from its border and text."""
    item = view.item(key)
    point = view.mapFromScene(item.pos() + QPointF(-item.width / 2 + 8, -BOX_H / 2 + 5))
    return view.viewport().grab().toImage().pixelColor(point)


def blended(fill: str, opacity: float, background: str = "#fafafa") -> tuple[int, int, int]:
    f, b = QColor(fill), QColor(background)
    return tuple(round(opacity * x + (1 - opacity) * y) for x, y in
                 ((f.red(), b.red()), (f.green(), b.green()), (f.blue(), b.blue())))


def test_visible_token_makes_whitespace_and_controls_visible():
    assert tl.visible_token("a b\n\t") == "a\u2423b\u23ce\u21e5"
    assert tl.visible_token("") == "\u2205"
    assert tl.visible_token("\x01") == "\\x01"
    long = tl.visible_token("abcdefghijklmnopqrstuvwxyz")
    assert len(long) == tl.MAX_LABEL and long.endswith("\u2026")


def test_boxes_and_colours_match_a_real_step(qtbot, sampled_run):
    steps = sampled_run.steps
    e = next(s for s in steps if any(n.fate == Fate.REJECTED for n in s.nodes) and s.accepted_path)
    view = TreeView()
    qtbot.addWidget(view)
    view.resize(900, 500)
    view.show()
    view.show_step(e, animate=False)
    assert view.items_by_kind() == expected_kinds(e)
    keys = {b.key: b for b in view.boxes}
    slot_of = tl.match_planned_slots(e.nodes, e.shape)   # the step's planned shape places the boxes
    for n in e.nodes:
        box = keys[f"s{slot_of[n.index]}"]
        assert box.kind == n.fate.value
        assert box.on_path == (n.index in e.accepted_path)
        item = view.item(box.key)
        style = STYLES[n.fate.value]
        assert item.opacity() == pytest.approx(style.opacity)
        got = pixel_at(view, box.key)
        want = blended(style.fill, style.opacity)
        assert max(abs(a - b) for a, b in zip((got.red(), got.green(), got.blue()), want)) <= 6, (n.fate, got.name())
        assert item.toolTip() == tl.explain_node(n, e)   # hover shows why
    extra = view.item("extra")
    assert extra.box.kind == e.origins[-1].value
    assert extra.box.parent_key == f"s{slot_of[e.accepted_path[-1]]}"
    assert extra.label.startswith("\u2605")


def test_planned_but_undrafted_slots_are_drawn_faintly(qtbot):
    shape = (-1, -1, 0, 0, 1, 2)
    nodes = [node(0, -1, 1, Fate.ACCEPTED), node(1, -1, 1, Fate.NOT_REACHED), node(2, 0, 2, Fate.REJECTED)]
    e = event(nodes, [0], shape=shape)
    view = TreeView()
    qtbot.addWidget(view)
    view.show_step(e, animate=False)
    assert view.items_by_kind() == expected_kinds(e, planned=3)
    boxes = {b.key: b for b in view.boxes}
    assert {k for k, b in boxes.items() if b.kind == tl.PLANNED} == {"s3", "s4", "s5"}
    assert boxes["s5"].parent_key == "s2" and boxes["s4"].parent_key == "s1"
    faint = view.item("s3")
    assert faint.style.dashed and faint.opacity() < 1.0 and QColor(faint.style.fill).alpha() == 0


def test_a_tree_that_does_not_fit_the_plan_is_drawn_without_it():
    nodes = [node(0, -1, 1, Fate.ACCEPTED), node(1, 0, 2, Fate.ACCEPTED), node(2, 1, 3, Fate.REJECTED)]
    boxes = tl.layout_step(event(nodes, [0, 1], shape=(-1, -1)))   # a chain of 3 cannot fill a width-2 level
    assert not any(b.kind == tl.PLANNED for b in boxes)
    assert [b.key for b in boxes if b.kind != tl.ROOT] == ["n0", "n1", "n2", "extra"]


def test_match_planned_slots_follows_the_drafters_order():
    shape = (-1, -1, 0, 0, 1, 2)
    nodes = [node(0, -1, 1, Fate.ACCEPTED), node(1, -1, 1, Fate.REJECTED), node(2, 0, 2, Fate.REJECTED),
             node(3, 1, 2, Fate.NOT_REACHED)]
    assert tl.match_planned_slots(nodes, shape) == {0: 0, 1: 1, 2: 2, 3: 4}


def test_explanations_say_why():
    first = node(0, -1, 1, Fate.REJECTED, p=0.2, q=0.5, a=0.4)
    later = node(1, -1, 1, Fate.ACCEPTED, p=0.2, q=0.5, a=0.1)
    e = event([first, later], [1])
    text = tl.explain_node(first, e)
    assert "rejected with probability 0.6000" in text and "min(1, p/q) = 0.4000" in text
    assert "residual left by earlier rejected siblings" not in text
    assert "residual left by earlier rejected siblings" in tl.explain_node(later, e)
    greedy = event([first, later], [1], margins=(0.5, 0.2))
    assert "argmax" in tl.explain_node(first, greedy)
    assert "correction" in tl.explain_extra(e) and "bonus" in tl.explain_extra(event([], [], Origin.BONUS))


def test_kept_slots_keep_their_item_and_the_change_is_animated(qtbot, pair):
    run = record(pair, Chain(3), SamplingParams(temperature=0.0), 30)
    view = TreeView()
    qtbot.addWidget(view)
    view.show()
    assert run.steps[0].shape == Chain(3).parents
    view.show_step(run.steps[0], animate=False)
    first = view.item("s1")
    view.show_step(run.steps[1], animate=True)
    assert view.item("s1") is first                     # same box updated in place, not torn down and redrawn
    assert view._anim.state() == view._anim.State.Running
    qtbot.waitUntil(lambda: view._anim.state() != view._anim.State.Running, timeout=2000)
    for box in view.boxes:
        assert view.item(box.key).pos() == QPointF(box.x * SLOT_W, box.depth * LEVEL_H)


def test_slider_replays_step_n_and_stops_following(qtbot, sampled_run):
    steps = sampled_run.steps
    replay = TreeReplay()
    qtbot.addWidget(replay)
    replay.show()
    replay.reset()
    replay.add_steps(steps[:3])                           # a frame of three steps: only the newest is drawn
    assert replay.view.event is steps[2]
    for e in steps[3:-1]:
        replay.add_steps([e])
    assert replay.view.event is steps[-2]                 # live: follows the newest step
    n = 3
    replay.slider.setValue(n)
    assert replay.view.event is steps[n]
    assert replay.step_label.text() == f"step {n + 1}/{len(steps) - 1}"
    assert f"step {steps[n].step + 1}:" in replay.caption.text()
    replay.add_steps([steps[-1]])                        # a new step arrives while replaying: stay on step n
    assert replay.view.event is steps[n]
    assert replay.slider.maximum() == len(steps) - 1
    replay.slider.setValue(len(steps) - 1)
    replay.add_steps([steps[0]])                         # back at the end: follow again
    assert replay.view.event is steps[0]
    with pytest.raises(IndexError, match="does not exist"):
        replay.show_index(len(steps) + 5)


def test_the_screenshot_shows_the_most_telling_step():
    plain = event([node(0, -1, 1, Fate.ACCEPTED), node(1, 0, 2, Fate.ACCEPTED)], [0, 1], Origin.BONUS)
    mixed = event([node(0, -1, 1, Fate.ACCEPTED), node(1, 0, 2, Fate.REJECTED)], [0])
    longer = event([node(0, -1, 1, Fate.ACCEPTED), node(1, 0, 2, Fate.ACCEPTED), node(2, 1, 3, Fate.REJECTED)],
                   [0, 1])
    assert telling_step((plain, mixed, longer)) == 2
    assert telling_step((plain, mixed)) == 1      # a step that rejected something beats a clean sweep


def test_a_hidden_tree_draws_nothing_until_shown(qtbot, sampled_run):
    replay = TreeReplay()
    qtbot.addWidget(replay)
    replay.reset()
    replay.add_steps(sampled_run.steps[:5])
    assert replay.view.event is None                      # hidden: no drawing work per frame
    replay.show()
    qtbot.waitUntil(lambda: replay.view.event is sampled_run.steps[4], timeout=2000)


def test_a_control_token_is_a_marked_box_not_its_name():
    e = event([node(0, -1, 1, Fate.ACCEPTED)], [0], Origin.BONUS, specials=("", "<|im_end|>"))
    extra = next(b for b in tl.layout_step(e) if b.key == "extra")
    assert extra.label == f"{tl.END_MARK} end" and "<|" not in extra.label
    assert "end" in tl.explain_extra(e) and "<|im_end|>" not in extra.label


def test_a_box_that_shrinks_then_leaves_is_gone_from_the_scene(qtbot):
    # A box reused for a shorter label shrinks; if the scene learnt of the change only after it (its index keyed by
    # the new, smaller rectangle), the box's old area kept a pointer to it, and once the box left, the next paint
    # there called into a deleted item. The window crashed so on memory drafts, whose labels are long.
    from PySide6.QtWidgets import QApplication

    view = TreeView()
    qtbot.addWidget(view)
    view.resize(700, 300)
    view.show()
    wide = event([node(0, -1, 1, Fate.ACCEPTED, text="w" * 60), node(1, 0, 2, Fate.REJECTED, text="v" * 60)], [0])
    narrow = event([node(0, -1, 1, Fate.ACCEPTED, text="n"), node(1, 0, 2, Fate.REJECTED, text="m")], [0])
    root_only = event([], [])
    for step in (wide, narrow, root_only, wide, root_only):
        view.show_step(step, animate=False)
        QApplication.processEvents()
        image = view.viewport().grab().toImage()
        assert not image.isNull()
    assert view.items_by_kind() == expected_kinds(root_only)
    assert len(view.scene().items()) == len(view._items) + len(view._edges) + len(view._depth_labels)


def test_depth_labels_stay_clear_of_long_token_boxes(qtbot):
    view = TreeView()
    qtbot.addWidget(view)
    view.resize(700, 300)
    view.show()
    view.show_step(event([node(0, -1, 1, Fate.ACCEPTED, text="demonstration" * 3)], [0]), animate=False)
    boxes = [item.sceneBoundingRect() for item in view._items.values()]
    assert max(box.width() for box in boxes) > SLOT_W      # the long token's box is wider than its slot
    for label in view._depth_labels:
        drawn = label.sceneBoundingRect()
        assert drawn.right() < min(box.left() for box in boxes)
        assert view.scene().sceneRect().contains(drawn)
    assert all(view.scene().sceneRect().contains(box) for box in boxes)
