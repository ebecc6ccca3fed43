"""A memory tree is built and priced only where some width of it could pay (AutoDrafter._least_node): the bound is
sound (no tree whose likeliest node is below it beats plain decoding), tight (just above it one does), and cutting
the trees below it changes none of Auto's choices."""
from __future__ import annotations

import numpy as np
import pytest

from core.auto import Auto
from core.auto.costs import Latencies
from core.auto.plan import Plan
from core.auto.policy import AutoDrafter
from core.bench.replay import ScriptedTarget, SimulatedClock
from core.engine import SpeculativeEngine
from core.memory import MemoryDrafter, SuffixMemory
from core.memory.proposal import best_first
from core.memory.stats import MemoryStats

SECONDS = 1.0       # a plain step: long against the real lookups, which every option's cost includes
ZEN4 = {1: 1.0, 2: 1.65, 3: 2.28, 4: 2.86, 6: 4.2, 8: 6.47, 12: 8.29, 16: 8.29, 24: 12.67, 32: 14.73, 64: 24.7}


def rows(*continuations: list[int]) -> np.ndarray:
    return np.array(continuations, np.int64)


def test_below_its_least_a_proposal_keeps_its_best_first_node_alone() -> None:
    table = rows([5, 6, 7, 8], [5, 6, 7, 9], [4, 6, 7, 8])
    weights = np.ones(len(table))
    documents = np.full(len(table), -1, np.int64)
    full = best_first(table, weights, documents, 3, MemoryStats(), 16, 4)
    kept = best_first(table, weights, documents, 3, MemoryStats(), 16, 4, least_first=lambda m: full.node_probs[0])
    cut = best_first(table, weights, documents, 3, MemoryStats(), 16, 4,
                     least_first=lambda m: full.node_probs[0] + 1e-9)
    assert not full.cut and not kept.cut and len(kept.tree) == len(full.tree) > 1
    assert cut.cut and len(cut.tree) == 1
    assert cut.tree.tokens == full.tree.tokens[:1] and cut.node_probs == full.node_probs[:1]
    assert cut.node_matches == full.node_matches[:1], "the node kept is judged as before: this prompt's record learns"


def drafter_on(verify: dict[int, float], gate: float, factors: dict[str, list[tuple[int | None, float]]]) -> AutoDrafter:
    """An AutoDrafter on these costs whose steps were measured at ``factors`` (option -> (width, measured / planned))."""
    plan = Plan({}, Latencies({n: SECONDS * t for n, t in verify.items()}, noise=gate / 2))
    drafter = AutoDrafter(plan, MemoryDrafter(), None, clock=None)
    for option, measured in factors.items():
        for width, ratio in measured:
            for _ in range(3):
                drafter.costs.observe(option, 1.0, ratio, width)
    return drafter


def rate_ahead(drafter: AutoDrafter, path: list[float]) -> float:
    """The best rate over plain decoding's of any width of a tree whose nodes' path probabilities are ``path`` (best
    first), as the policy prices a memory step."""
    lat, costs = drafter.latencies, drafter.costs
    plain = 1.0 / (lat.plain * costs.factor("plain"))
    expected = np.cumsum([1.0] + list(path))
    return max(expected[n] / (lat.verify_cost(n + 1) * costs.factor("memory", n + 1))
               for n in range(1, len(path) + 1)) / plain


@pytest.mark.parametrize("seed", range(12))
def test_no_tree_below_the_least_node_pays_and_one_just_above_does(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sizes = sorted({1, 64, *rng.choice(np.arange(2, 64), 5, replace=False).tolist()})
    per_token = np.sort(rng.uniform(0.1, 1.2, len(sizes) - 1))[::-1]    # calls grow, each token cheaper or not
    verify = {1: 1.0}
    for (a, b), step in zip(zip(sizes, sizes[1:]), per_token):
        verify[b] = verify[a] + (b - a) * step
    factors = {"plain": [(None, rng.uniform(0.8, 1.2))],
               "memory": [(w, rng.uniform(0.8, 1.6)) for w in (2, 3, 5, 9) if rng.random() < 0.7]}
    drafter = drafter_on(verify, 0.03, factors)
    least = drafter._least_node()
    needed = 1.0 + drafter.plan.gate
    widest = drafter.latencies.widest - 1
    for _ in range(200):
        top = least * rng.uniform(0.5, 1.0) if least < np.inf else rng.uniform(0, 1)
        path = np.sort(rng.uniform(0, top, rng.integers(1, widest + 1)))[::-1]
        path[0] = top
        assert rate_ahead(drafter, path.tolist()) < needed
    if least < 1.0:
        # nodes all just above the bound, as many as the width that sets it: that tree pays
        width = min(range(2, widest + 2), key=lambda w: (
            (drafter.latencies.verify_cost(w) * drafter.costs.factor("memory", w)
             / (drafter.latencies.plain * drafter.costs.factor("plain")) * needed - 1) / (w - 1)))
        assert rate_ahead(drafter, [least * 1.001] * (width - 1)) >= needed


def steps(prompt: list[int], answer: list[int], vocab: int) -> list[tuple[int, str]]:
    clock = SimulatedClock()
    target = ScriptedTarget(prompt, answer, Latencies({n: SECONDS * t for n, t in ZEN4.items()}), clock, vocab)
    auto = Auto(plan=Plan({}, target.costs), memory=SuffixMemory("scripted"), clock=clock)
    engine = SpeculativeEngine(target, None, auto)
    out = [(len(e.nodes), e.note) for e in engine.stream(prompt, len(answer))]
    assert list(engine.last_result.tokens) == answer
    return out


def test_cutting_the_trees_that_cannot_pay_changes_no_choice(monkeypatch) -> None:
    source = list(range(10, 60))
    # copies of the source broken by edits, and stretches of new text whose short matches are everywhere
    answer = (source[:20] + [70, 71, 72] + source[23:40] + [11, 12, 73, 13, 14, 74, 10, 75, 15, 16, 17, 76]
              + source[40:50])
    prompt = [1, 2] + source + [3, 4]
    cut = steps(prompt, answer, 80)
    monkeypatch.setattr(AutoDrafter, "_least_first", lambda self, match: 0.0)
    whole = steps(prompt, answer, 80)
    assert [n for n, _ in cut] == [n for n, _ in whole]
    assert any("cannot pay" in note for _, note in cut), "no proposal was cut: the test exercises nothing"
    assert any(n > 1 for n, _ in cut), "no long copy was drafted: the scenario is not Auto's"
