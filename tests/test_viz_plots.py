"""Plots, the planner view and the panel receive a real run's data (from engine timestamps)."""
from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtGui import QColor, QPalette

from app.viz.panel import VizPanel
from app.viz.planner_view import PlannerView
from app.viz.plots import PlotsWidget, expected_tokens_per_call
from app.viz.scenes import record
from core import sequoia
from core.auto.calibrate import profile_latencies
from core.auto.plan import Plan, best_plan
from core.drafting import Baseline, Chain
from core.sampling import SamplingParams
from core.tiny import tiny_pair

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(noise=0.1)


@pytest.fixture(scope="module")
def runs(pair):
    return record(pair, Baseline(), GREEDY, 40), record(pair, Chain(4), GREEDY, 40)


def test_theory_curve():
    assert expected_tokens_per_call(0.0, 4) == pytest.approx(1.0)
    assert expected_tokens_per_call(0.5, 2) == pytest.approx(1.75)
    assert expected_tokens_per_call(1.0, 4) == pytest.approx(5.0)
    b = np.array([0.2, 0.9])
    assert np.allclose(expected_tokens_per_call(b, 3), [1 + 0.2 + 0.04 + 0.008, 1 + 0.9 + 0.81 + 0.729])


def test_plots_receive_the_runs_data_when_visible(qtbot, runs):
    baseline, spec = runs
    plots = PlotsWidget()
    qtbot.addWidget(plots)
    for e in spec.steps:
        plots.add_step(e)
    for e in baseline.steps:
        plots.add_baseline_step(e)
    plots.refresh()
    assert plots.spec_curve.getData()[0] is None      # hidden: no redrawing
    plots.show()                                      # shown: the buffers reach the curves
    qtbot.waitUntil(lambda: plots.spec_curve.getData()[0] is not None, timeout=2000)
    rated = [e for e in spec.steps if e.stats.new_tokens >= 2]
    x, y = plots.spec_curve.getData()
    assert np.allclose(x, [e.timestamp for e in rated])
    assert np.allclose(y, [e.stats.tokens_per_second for e in rated])
    bx, by = plots.base_curve.getData()
    assert len(bx) == sum(1 for e in baseline.steps if e.stats.new_tokens >= 2)
    sizes = {}
    for e in spec.steps:
        sizes[len(e.tokens)] = sizes.get(len(e.tokens), 0) + 1
    assert list(plots.hist_bars.opts["x"]) == sorted(sizes)
    assert list(plots.hist_bars.opts["height"]) == [sizes[k] for k in sorted(sizes)]
    final = spec.stats
    assert list(plots.depth_bars.opts["height"]) == pytest.approx(list(final.acceptance_by_depth))
    px, py = plots.measured_point.getData()
    assert px[0] == pytest.approx(sum(final.accepted_by_depth) / sum(final.attempted_by_depth))
    assert py[0] == pytest.approx(final.tokens_per_call)
    tx, ty = plots.theory_curve.getData()
    assert np.allclose(ty, expected_tokens_per_call(tx, 4))
    plots.reset()
    plots.refresh()
    cleared = plots.spec_curve.getData()[0]
    assert (cleared is None or len(cleared) == 0) and len(plots.hist_bars.opts["x"]) == 0


def test_planner_view_shows_a_real_dp_table(qtbot, pair):
    target, draft = pair
    prompt = target.apply_chat_template([{"role": "user", "content": "hi"}])
    latencies = profile_latencies(target, draft, prompt, verify_sizes=(1, 2, 4, 8), draft_sizes=(1, 2, 4), repeats=1)
    table = sequoia.solve(sequoia.PAPER_ACCEPTANCE, 16, 4)
    plan = best_plan(table, latencies)
    view = PlannerView()
    qtbot.addWidget(view)
    event = Plan({}, latencies, sequoia.PAPER_ACCEPTANCE, plan).to_event().with_realised(0.8)
    view.show_plan(event)
    plan_table = Plan({}, latencies, sequoia.PAPER_ACCEPTANCE, plan).table()
    assert len(view.dp_curves) == len(plan_table.value) - 1
    for d, curve in enumerate(view.dp_curves, start=1):
        assert np.allclose(curve.getData()[1], plan_table.value[d][1:])
    sx, sy = view.dp_plan.getData()
    assert (sx[0], sy[0]) == (plan.budget, pytest.approx(plan.expected_tokens))
    assert list(view.speed_bars.opts["height"]) == pytest.approx([plan.speedup, 0.8])
    lx, ly = view.lat_curve.getData()
    assert list(lx) == [1, 2, 4, 8] and ly[0] == pytest.approx(1.0)
    assert f"{plan.speedup:.2f}\u00d7" in view.summary.text() and "0.80\u00d7" in view.summary.text()


def test_panel_takes_a_whole_answer(qtbot, runs):
    _, spec = runs
    panel = VizPanel()
    qtbot.addWidget(panel)
    panel.show()
    panel.on_generation_started("Chain(4)")
    assert "generating" in panel.summary.text()
    panel.on_steps(spec.steps[:3])
    panel.on_steps(spec.steps[3:])
    panel.on_finished(spec)
    assert panel.tree.events == list(spec.steps)
    assert panel.tree.view.event is spec.steps[-1] and panel.tree.view.event.shape == Chain(4).parents
    assert f"{spec.stats.tokens_per_second:.1f} tok/s" in panel.summary.text()
    assert f"{spec.stats.new_tokens} tokens in {spec.stats.target_calls} target calls" in panel.summary.text()
    panel.on_generation_started("Chain(4)")                 # the next answer starts clean
    assert panel.tree.events == [] and panel.plots.spec.n == 0


def test_panel_follows_the_window_theme(qtbot):
    panel = VizPanel()
    qtbot.addWidget(panel)
    light_background = panel.tree.view.backgroundBrush().color().name()
    dark = QPalette()
    for role, colour in ((QPalette.ColorRole.Window, "#1c1f24"), (QPalette.ColorRole.Base, "#23272e"),
                         (QPalette.ColorRole.Text, "#e6e8eb")):
        dark.setColor(role, QColor(colour))
    panel.setPalette(dark)
    assert light_background != "#23272e"
    assert panel.tree.view.backgroundBrush().color().name() == "#23272e"
    assert panel.plots.graphics.backgroundBrush().color().name() == "#23272e"
