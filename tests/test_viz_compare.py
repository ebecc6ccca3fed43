"""Compare mode: the race on a shared clock, the verdict, greedy identity and a forced divergence."""
from __future__ import annotations

import pytest

from app.compare.compare_widget import CompareWidget
from app.compare.race import RunReplay, summarize
from app.viz.scenes import record
from core.divergence import NEAR_TIE
from core.drafting import Baseline, Chain
from core.engine import SpeculativeEngine
from core.sampling import SamplingParams
from core.tiny import tiny_pair

GREEDY = SamplingParams(temperature=0.0)
MAX_NEW = 40


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(noise=0.1)   # float64: tree and plain evaluation agree exactly, so greedy runs must be identical


@pytest.fixture(scope="module")
def prompt(pair):
    return pair[0].apply_chat_template([{"role": "user", "content": "Tell me about trees."}])


def engines_for(pair, wrong_pair=None):
    def make(strategy):
        target, draft = pair if isinstance(strategy, Baseline) or wrong_pair is None else wrong_pair
        return SpeculativeEngine(target, None if isinstance(strategy, Baseline) else draft, strategy, GREEDY)
    return make


def race(qtbot, make_engine, prompt):
    widget = CompareWidget(make_engine)
    qtbot.addWidget(widget)
    widget.show()
    with qtbot.waitSignal(widget.runsFinished, timeout=120_000) as done:
        widget.start(prompt, Chain(3), MAX_NEW)
    widget.finish_replay()
    return widget, done.args[0]


def test_greedy_race_is_identical_and_names_the_fastest(qtbot, pair, prompt):
    widget, summary = race(qtbot, engines_for(pair), prompt)
    base, other = summary.baseline.result, summary.other.result
    assert base.tokens == other.tokens and len(base.tokens) == MAX_NEW
    assert summary.comparison.identical
    assert "identical" in widget.verdict.text()
    expected = base.stats.tokens_per_second and other.stats.tokens_per_second / base.stats.tokens_per_second
    assert summary.speedup == pytest.approx(expected)
    assert f"{summary.speedup:.2f}\u00d7" in widget.verdict.text()
    badges = [not widget.left.badge.isHidden(), not widget.right.badge.isHidden()]
    assert badges == ([False, True] if summary.speedup > 1 else [True, False])
    assert widget.replay_button.isEnabled() and not widget.running


def test_forced_divergence_is_found_and_explained(qtbot, pair, prompt):
    wrong = tiny_pair(seed=5, noise=0.1)        # the speculative run deliberately uses another target
    widget, summary = race(qtbot, engines_for(pair, wrong), prompt)
    a, b = summary.baseline.result.tokens, summary.other.result.tokens
    first = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    c = summary.comparison
    assert not c.identical and c.index == first and (c.baseline_token, c.other_token) == (a[first], b[first])
    assert c.margin is not None and c.near_tie == (c.margin < NEAR_TIE)
    text = widget.verdict.text()
    assert f"differ at token {first}" in text
    assert ("(a near-tie)" in text) == c.near_tie and ("(NOT a near-tie)" in text) == (not c.near_tie)


def test_replay_clock_shows_what_each_run_had_at_that_time(qtbot, pair, prompt):
    base = record(pair, Baseline(), GREEDY, 24, "Tell me about trees.")
    other = record(pair, Chain(3), GREEDY, 24, "Tell me about trees.")
    widget = CompareWidget(engines_for(pair))
    qtbot.addWidget(widget)
    widget.show_results("Baseline", base, "Chain(3)", other)
    widget._timer.stop()
    t = other.steps[len(other.steps) // 2].timestamp
    widget.set_clock(t)
    for pane, run in ((widget.left, base), (widget.right, other)):
        shown = sum(1 for s in run.steps if s.timestamp <= t)
        assert pane._shown == shown
        tokens = run.steps[shown - 1].stats.new_tokens if shown else 0
        assert pane.numbers.text().startswith(f"{tokens} tokens") or (shown == 0 and "prefill" in pane.numbers.text())
        assert pane.text.toPlainText() == "".join(x for s in run.steps[:shown] for x in s.token_texts)
    assert widget.verdict.text() == ""                      # the verdict waits for the finish
    widget.finish_replay()
    assert widget.verdict.text() != ""


def test_run_replay_queries():
    base = record(tiny_pair(noise=0.1), Baseline(), GREEDY, 8, "hi")
    run = RunReplay("Baseline", base)
    assert run.steps_at(-1.0) == 0 and run.tokens_at(-1.0) == 0
    assert run.steps_at(run.duration) == len(base.steps) and run.tokens_at(run.duration) == 8
    assert run.text_at(run.duration) == base.text
    s = summarize("Baseline", base, "Baseline again", base)
    assert s.comparison.identical and s.speedup == pytest.approx(1.0)


def test_bad_requests_are_refused_clearly(qtbot, pair, prompt):
    widget = CompareWidget(engines_for(pair))
    qtbot.addWidget(widget)
    with pytest.raises(ValueError, match="speculative strategy"):
        widget.start(prompt, Baseline())
    with pytest.raises(ValueError, match="needs a prompt"):
        widget.start([], Chain(3))


def test_stop_abandons_the_race(qtbot, pair, prompt):
    widget = CompareWidget(engines_for(pair))
    qtbot.addWidget(widget)
    widget.start(prompt, Chain(3), 400)
    assert widget.running and widget.stop_button.isEnabled()
    widget.stop()
    qtbot.waitUntil(lambda: not widget.running, timeout=60_000)
    assert widget.summary is None and widget.status.text() == "Race stopped."
    assert not widget.stop_button.isEnabled() and not widget.replay_button.isEnabled()
