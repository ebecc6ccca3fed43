"""Auto: plain decoding when nothing pays, drafting when it does, the cache, drift re-planning, `speclens plan`."""
from __future__ import annotations

import json

import pytest

import core.planner as planner
from core.drafting import Baseline
from core.engine import SpeculativeEngine
from core.planner import AcceptanceTracker, Auto, NGramStats, Plan, plan_key
from core.sampling import SamplingParams
from core.sequoia import Latencies, best_plan, solve
from core.tree import Proposal, TokenTree
from core.verify import Verdict
from tests.tiny_models import tiny_draft_pair

GREEDY = SamplingParams(temperature=0.0)
REPETITIVE = [3, 4, 5, 6, 7, 8, 3, 4, 5, 6, 7, 8, 3, 4, 5]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(planner, "cache_dir", lambda: tmp_path / "plans")
    return tmp_path / "plans"


def make_plan(target, draft, verify: dict, acceptance=(0.8, 0.1), ngram_rate: float = 0.95) -> Plan:
    lat = Latencies(verify, {1: 0.01, 8: 0.01} if draft is not None else {})
    tree = best_plan(solve(acceptance, planner.MAX_BUDGET, planner.MAX_DEPTH), lat) if draft is not None else None
    stats = NGramStats([ngram_rate * 50] * NGramStats.BUCKETS, [50.0] * NGramStats.BUCKETS)
    return Plan(plan_key(target, draft, GREEDY), lat, stats, tuple(acceptance) if draft else None, tree)


def run(target, draft, strategy, prompt=REPETITIVE, tokens=24):
    engine = SpeculativeEngine(target, draft, strategy, GREEDY)
    events = list(engine.stream(prompt, tokens))
    return engine.last_result, events


def test_expensive_verification_means_plain_decoding_with_a_reason() -> None:
    target, draft = tiny_draft_pair(vocab=24, seed=7, noise=0.05)
    # a target call on n tokens costs n^2 plain decodes: no draft can pay for itself
    plan = make_plan(target, draft, {1: 1.0, 2: 4.0, 4: 16.0, 16: 256.0})
    result, events = run(target, draft, Auto(plan))
    base = SpeculativeEngine(target, None, Baseline(), GREEDY).generate(REPETITIVE, 24)
    assert result.tokens == base.tokens
    assert result.stats.drafted == 0
    assert all(e.note.startswith("plain decoding: nothing is predicted to beat it") for e in events)
    assert "n-gram match" in events[0].note and "draft model's best tree" in events[0].note


def test_flat_verification_means_trees_and_lossless() -> None:
    target, draft = tiny_draft_pair(vocab=24, seed=7, noise=0.05)
    auto = Auto(make_plan(target, draft, {1: 1.0, 16: 1.0}))
    result, events = run(target, draft, auto, prompt=[1, 2, 3])
    base = SpeculativeEngine(target, None, Baseline(), GREEDY).generate([1, 2, 3], 24)
    assert result.tokens == base.tokens
    assert auto.last_drafter.counts["tree"] > 0
    assert any(e.note.startswith("Sequoia tree") for e in events)
    assert auto.last_drafter.predicted_speedup > 1.5


def test_ngram_only_when_the_text_repeats() -> None:
    target, _ = tiny_draft_pair(vocab=24, seed=7)
    auto = Auto(make_plan(target, None, {1: 1.0, 2: 1.2, 16: 4.0}))
    result, events = run(target, None, auto)
    base = SpeculativeEngine(target, None, Baseline(), GREEDY).generate(REPETITIVE, 24)
    assert result.tokens == base.tokens
    assert {n.source for e in events for n in e.nodes} == {"ngram"}
    assert events[0].note.startswith("n-gram lookup")


def test_ngram_gate_follows_measured_acceptance() -> None:
    lat = Latencies({1: 1.0, 2: 1.7, 3: 2.3, 4: 2.9, 8: 8.6})   # llama.cpp on 2 cores (MODELS.md)
    poor = NGramStats([0.5] * 8, [1.0] * 8)
    good = NGramStats([99.0] * 8, [100.0] * 8)
    assert planner.best_ngram_k(poor, lat, 4, 8) == (0, 1.0)
    k, speedup = planner.best_ngram_k(good, lat, 4, 8)
    assert k >= 3 and speedup > 1.3


def test_plan_is_measured_once_then_cached(private_cache, monkeypatch) -> None:
    target, draft = tiny_draft_pair(vocab=24, seed=8)
    monkeypatch.setattr(planner, "CALIBRATION_TOKENS", 8)
    monkeypatch.setattr(planner, "VERIFY_SIZES", (1, 2, 4))
    monkeypatch.setattr(planner, "DRAFT_SIZES", (1, 2))
    auto = Auto()
    run(target, draft, auto, tokens=6)
    files = list(private_cache.glob("plan-*.json"))
    assert len(files) == 1
    saved = json.loads(files[0].read_text())
    assert saved["key"] == plan_key(target, draft, GREEDY)
    assert len(saved["acceptance"]) == planner.WIDTH and set(saved["latencies"]["verify"]) == {"1", "2", "4"}

    def no_measuring(*args, **kwargs):
        raise AssertionError("the cached plan should have been used")

    monkeypatch.setattr(planner, "measure_plan", no_measuring)
    again = Auto()
    run(target, draft, again, tokens=6)
    cached = Plan.from_json(saved)
    assert (again.plan.latencies, again.plan.acceptance, again.plan.tree) == (cached.latencies, cached.acceptance,
                                                                              cached.tree)


def test_drift_replans_the_tree() -> None:
    target, draft = tiny_draft_pair(vocab=24, seed=7, noise=1.5)   # a poor draft
    plan = make_plan(target, draft, {1: 1.0, 16: 1.0}, acceptance=(0.95, 0.04))
    planned = plan.tree.parents
    saved = []
    auto = Auto(plan)
    auto._replanned = saved.append
    run(target, draft, auto, prompt=[1, 2, 3], tokens=60)
    assert saved, "the measured acceptance is far below the plan's: it must re-plan"
    assert plan.acceptance[0] < 0.9
    assert plan.tree.parents != planned


def test_acceptance_tracker_counts_hazards() -> None:
    tracker = AcceptanceTracker((0.0, 0.0), prior_weight=0.0)
    tree = TokenTree()
    for tok in (1, 2):
        tree.add(tok, -1, Proposal())
    tracker.observe(tree, Verdict(accepted=(1,), extra=3, bonus=False, accept_probs={0: 0.0, 1: 1.0}))
    tracker.observe(tree, Verdict(accepted=(0,), extra=3, bonus=False, accept_probs={0: 1.0}))
    # rank 1 accepted once in two tests; rank 2 accepted in its one test: a = (1/2, 1/2 * 1)
    assert tracker.vector() == (0.5, 0.5)


def test_ngram_stats_replay_target_text() -> None:
    text = [1, 2, 3, 4, 1, 2, 3, 5]
    stats = NGramStats.from_texts([(6, text)])
    # at position 6 the lookup (match 2: "1 2") proposes 3 4 ...: 3 right, then 4 wrong (against 5)
    # at position 7 (match 3: "1 2 3") it proposes 4: wrong
    assert stats.tested[1] == 1 and stats.accepted[1] == 1
    assert stats.tested[2] == 2 and stats.accepted[2] == 0


def test_speclens_plan_prints_everything(capsys, monkeypatch) -> None:
    monkeypatch.setattr(planner, "CALIBRATION_TOKENS", 8)
    assert planner.main(["--pair", "tiny"]) == 0
    out = capsys.readouterr().out
    for part in ("Acceptance vector", "Sequoia DP", "target forward of n tokens", "Plan:", "predicted"):
        assert part in out
    assert planner.main(["--pair", "tiny", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["version"] == planner.PLAN_VERSION


def test_speclens_plan_names_a_bad_pair(capsys) -> None:
    assert planner.main(["--pair", "nonesuch"]) == 2
    assert "nonesuch" in capsys.readouterr().err


def test_lookups_are_scored_while_decoding_plainly() -> None:
    target, _ = tiny_draft_pair(vocab=24, seed=7)
    plan = make_plan(target, None, {1: 1.0, 2: 10.0, 16: 100.0}, ngram_rate=0.0)
    drafter = Auto(plan).make_drafter(None, GREEDY, None)
    before = (list(plan.ngram.accepted), list(plan.ngram.tested))
    assert len(drafter.draft([1, 2, 3, 1, 2], 8, 8)) == 0          # plain: the lookup (3 1 2) is only remembered
    drafter.draft([1, 2, 3, 1, 2, 3], 8, 8)                         # the target then wrote 3: the lookup was right
    bucket = NGramStats.bucket(2)
    assert plan.ngram.tested[bucket] == pytest.approx(before[1][bucket] * NGramStats.DECAY + 1)
    assert plan.ngram.accepted[bucket] == pytest.approx(before[0][bucket] * NGramStats.DECAY + 1)
