"""The Learn tab (app/viz/learn_view.py): the formulas of a step with their numbers, for rule 3, SpecTr's K-SEQ and
greedy decoding, the chain formula and Sequoia's c(n, d); it follows the tree replay; the `learn` scene renders.
Also the tree view's source badges for trees that mix drafters."""
from __future__ import annotations

import pytest
from PySide6.QtGui import QImage

from app.screenshots import main
from app.viz import tree_layout as tl
from app.viz.learn_view import learn_html, verifier_of
from app.viz.panel import VizPanel
from app.viz.plots import expected_tokens_per_call
from app.viz.scenes import PANEL_SIZE, feed, record
from app.viz.tree_view import legend_html
from core.drafting import MultiDraft
from core.events import Fate, GenerationStats, NodeInfo, Origin, PlanEvent, StepEvent
from core.sampling import SamplingParams
from core.sequoia import PAPER_ACCEPTANCE, solve, tree_value
from core.tiny import tiny_pair

STATS = GenerationStats(new_tokens=12, target_calls=5, accepted=7, accepted_by_depth=(5, 2),
                        attempted_by_depth=(6, 4))


def _node(i, parent, depth, fate, p, q, a, source="draft", text="x"):
    return NodeInfo(i, 40 + i, text, parent, depth, q, p, fate, a, source)


def _event(nodes, path, strategy="Tree", origin=Origin.CORRECTION, greedy=False, shape=None):
    tokens = tuple(40 + j for j in path) + (99,)
    origins = (Origin.DRAFT,) * len(path) + (origin,)
    return StepEvent(step=3, nodes=tuple(nodes), accepted_path=tuple(path), tokens=tokens, origins=origins,
                     token_texts=("x",) * len(tokens), specials=("",) * len(tokens), text="", spans=(), margins=(),
                     draft_seconds=0.0, verify_seconds=0.0, timestamp=1.0, stats=STATS, strategy=strategy,
                     greedy=greedy, shape=shape)


def _plan(budget=5, depth=2, parents=(-1, -1, 0, 1)):
    table = solve(PAPER_ACCEPTANCE, 16, 3)
    return PlanEvent(acceptance=PAPER_ACCEPTANCE, best_value=table.value, verify_seconds={1: 0.01},
                     plan_budget=budget, plan_depth=depth, plan_parents=parents,
                     predicted_tokens=table.c(budget, depth), predicted_speedup=1.3)


def test_rule3_step_shows_ratio_residual_and_references() -> None:
    # the second sibling was tested against the residual: its probability is not min(1, p/q)
    nodes = [_node(0, -1, 1, Fate.REJECTED, 0.2, 0.5, 0.4), _node(1, -1, 1, Fate.ACCEPTED, 0.3, 0.6, 0.8),
             _node(2, 1, 2, Fate.REJECTED, 0.1, 0.4, 0.25)]
    page = learn_html(_event(nodes, [1]))
    assert verifier_of(_event(nodes, [1])) == "rule3"
    assert "min(1, p(x) / q(x))" in page and "Leviathan" in page and "SpecInfer" in page
    assert "0.400" in page and "0.500" in page          # min(1, 0.3/0.6) = 0.5 beside the 0.8 actually used
    assert page.count("\u2020") == 2                     # the mark on the residual test and its explanation
    assert "norm(max(p &minus; q, 0))" in page and "Correction" in page


def test_spectr_step_shows_rho_and_its_residual() -> None:
    nodes = [_node(0, -1, 1, Fate.REJECTED, 0.2, 0.5, 0.2), _node(1, -1, 1, Fate.ACCEPTED, 0.2, 0.5, 0.2)]
    event = _event(nodes, [1], strategy="MultiDraft(2x1, SpecTr)", origin=Origin.BONUS)
    page = learn_html(event)
    assert verifier_of(event) == "spectr"
    assert "&rho;" in page and "2.000" in page          # rho = p / (q a) = 0.2 / (0.5 * 0.2)
    assert "K-SEQ" in page and "Bonus" in page and "\u2020" not in page
    correction = learn_html(_event(nodes[:1], [], strategy="MultiDraft(2x1, SpecTr)"))
    assert "p<sub>res</sub>" in correction


def test_greedy_step_says_argmax() -> None:
    nodes = [_node(0, -1, 1, Fate.ACCEPTED, 0.7, 1.0, 1.0), _node(1, 0, 2, Fate.REJECTED, 0.2, 1.0, 0.0)]
    page = learn_html(_event(nodes, [0], greedy=True))
    assert "one-hot" in page and "argmax" in page and "1 (top-ranked)" in page


def test_chain_formula_uses_the_measured_rate_and_depth() -> None:
    nodes = [_node(0, -1, 1, Fate.ACCEPTED, 0.7, 0.6, 1.0), _node(1, 0, 2, Fate.REJECTED, 0.2, 0.4, 0.5)]
    page = learn_html(_event(nodes, [0]))
    b = 7 / 10
    assert f"b = {b:.2f}" in page and "g = 2" in page
    assert f"= {expected_tokens_per_call(b, 2):.2f}</b>" in page
    assert f"measured: {STATS.tokens_per_call:.2f}" in page


def test_dp_section_with_and_without_a_plan() -> None:
    nodes = [_node(0, -1, 1, Fate.ACCEPTED, 0.7, 0.6, 1.0), _node(1, -1, 1, Fate.NOT_REACHED, None, 0.3, None),
             _node(2, 0, 2, Fate.REJECTED, 0.2, 0.4, 0.5)]
    plan = _plan()
    page = learn_html(_event(nodes, [0], shape=plan.plan_parents), plan)
    assert f"c(5, 2) = {plan.predicted_tokens:.2f}" in page
    assert f"{tree_value([-1, -1, 0], PAPER_ACCEPTANCE):.2f}" in page and "3 of the plan's 4" in page
    assert "Sequoia" in page and "n = 16" in page
    assert "No plan is known" in learn_html(_event(nodes, [0]))


def test_plain_decoding_step() -> None:
    page = learn_html(_event([], []))
    assert "Nothing was drafted" in page and "Plain decoding" in page


@pytest.fixture(scope="module")
def spectr_run():
    return record(tiny_pair(noise=0.1), MultiDraft(3, 2, "spectr"), SamplingParams(temperature=0.8, seed=5), 30)


def test_panel_learn_tab_follows_the_replay(qtbot, spectr_run) -> None:
    panel = VizPanel()
    qtbot.addWidget(panel)
    panel.tabs.setCurrentWidget(panel.learn)
    panel.show()
    feed(panel, MultiDraft(3, 2, "spectr"), spectr_run)
    steps = spectr_run.steps
    assert f"Step {len(steps)} " in panel.learn.browser.toPlainText()
    panel.tree.slider.setValue(1)                       # as a user dragging the replay back
    assert "Step 2 " in panel.learn.browser.toPlainText()
    rhos = [n.p / (n.q * n.accept_prob) for e in steps for n in e.nodes
            if n.accept_prob is not None and 0 < n.accept_prob < 1]
    assert rhos and all(1 - 1e-9 <= r <= 3 + 1e-9 for r in rhos), "K-SEQ's divisor lies in [1, k]"


def test_mixed_sources_get_badges_and_a_legend() -> None:
    nodes = [_node(0, -1, 1, Fate.ACCEPTED, 0.7, 0.6, 1.0), _node(1, -1, 1, Fate.NOT_REACHED, None, 1.0, None,
                                                                  source="ngram")]
    boxes = {b.key: b for b in tl.layout_step(_event(nodes, [0]))}
    assert boxes["n0"].source == "draft" and boxes["n1"].source == "ngram" and boxes["root"].source == ""
    single = tl.layout_step(_event(nodes[:1], [0]))
    assert all(b.source == "" for b in single), "one drafter: no badge"
    legend = legend_html(tl.mixed_sources(nodes))
    assert tl.source_colour("ngram") in legend and "draft" in legend


def test_the_replay_legend_follows_the_shown_step_and_is_set_only_when_it_changes(qtbot, monkeypatch) -> None:
    from app.viz.tree_view import TreeReplay

    mixed = [_node(0, -1, 1, Fate.ACCEPTED, 0.7, 0.6, 1.0), _node(1, -1, 1, Fate.NOT_REACHED, None, 1.0, None,
                                                                   source="ngram")]
    replay = TreeReplay()
    qtbot.addWidget(replay)
    replay.show()
    sets = []
    set_text = replay.legend.setText
    monkeypatch.setattr(replay.legend, "setText", lambda text: (sets.append(text), set_text(text)))
    replay.add_steps([_event(mixed[:1], [0])])
    replay.add_steps([_event(mixed[:1], [0])])           # the same drafters again: the legend is not set again
    assert replay.legend.text() == legend_html(()) and sets == []
    replay.add_steps([_event(mixed, [0])])
    assert replay.legend.text() == legend_html(("draft", "ngram")) and len(sets) == 1
    replay.show_index(0, animate=False)                  # replaying a single-drafter step drops the badges
    assert replay.legend.text() == legend_html(()) and len(sets) == 2


def test_learn_scene_renders(qapp, data_dir, tmp_path) -> None:
    out = tmp_path / "shots"
    assert main(["--scene", "learn", "--out", str(out), "--pair", "tiny"]) == 0
    image = QImage(str(out / "learn.png"))
    assert (image.width(), image.height()) == PANEL_SIZE
    colours = {image.pixel(x, y) for x in range(0, PANEL_SIZE[0], 5) for y in range(0, PANEL_SIZE[1], 5)}
    assert len(colours) > 20
