"""Sequoia: the dynamic program against brute force, Sequoia's published numbers, the tree in the engine."""
from __future__ import annotations

import itertools
import random

import pytest

from core.drafting import Baseline, Tree
from core.engine import SpeculativeEngine
from core.sampling import SamplingParams
from core.auto.calibrate import estimate_acceptance, profile_latencies
from core.auto.costs import Latencies
from core.auto.plan import best_plan
from core.sequoia import PAPER_ACCEPTANCE, solve, tree_value
from core.tree import depths_of
from tests.tiny_models import tiny_draft_pair


def all_shapes(nodes: int, depth: int):
    """Every ordered tree of exactly ``nodes`` drafted nodes and depth <= ``depth``, as parent lists."""
    def forests(m: int, d: int):
        # an ordered forest of m nodes: a first tree of s nodes (its root and a forest of s-1 below), then the rest
        if m == 0:
            yield []
            return
        if d == 0:
            return
        for s in range(1, m + 1):
            for below in forests(s - 1, d - 1):
                for rest in forests(m - s, d):
                    yield [below] + rest

    def flatten(forest, parent, out):
        for subtree in forest:
            out.append(parent)
            flatten(subtree, len(out) - 1, out)
        return out

    for forest in forests(nodes, depth):
        yield tuple(flatten(forest, -1, []))


def test_tree_value_by_hand() -> None:
    a = (0.5, 0.2)
    # root -> x (rank 1) -> y (rank 1); root -> z (rank 2); the third root child has rank 3: worth nothing
    assert tree_value((-1, 0, -1, -1), a) == pytest.approx(1 + 0.5 + 0.25 + 0.2)


def test_enumeration_counts_catalan() -> None:
    # ordered forests of m nodes are counted by the Catalan numbers when depth is unbounded
    assert [sum(1 for _ in all_shapes(m, m)) for m in range(1, 7)] == [1, 2, 5, 14, 42, 132]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dp_matches_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    raw = sorted((rng.random() for _ in range(3)), reverse=seed != 2)  # seed 2: increasing, ranks not sorted
    total = rng.uniform(0.5, 0.95)
    a = tuple(x / sum(raw) * total for x in raw)
    table = solve(a, 8, 4)
    for n, d in itertools.product(range(1, 9), range(1, 5)):
        brute = max(tree_value(s, a) for m in range(n) for s in all_shapes(m, d))
        assert table.c(n, d) == pytest.approx(brute, abs=1e-12), (n, d)
        shape = table.parents(n, d)
        assert len(shape) <= n - 1
        assert max(depths_of(shape), default=0) <= d
        assert tree_value(shape, a) == pytest.approx(brute, abs=1e-12)


def test_sequoia_published_numbers() -> None:
    table = solve(PAPER_ACCEPTANCE, 64, 8)
    # budget 8 is reached from depth 3 on; budget 64 needs depth >= 6 (2.752 at depth 5)
    assert table.c(8, 3) == pytest.approx(2.10, abs=0.005)
    assert table.c(8, 2) < 2.05
    assert table.c(64, 6) == pytest.approx(2.76, abs=0.005)
    assert table.c(64, 8) == pytest.approx(2.76, abs=0.005)
    assert table.c(64, 5) < 2.755


def test_bad_inputs_are_named() -> None:
    with pytest.raises(ValueError, match="sum"):
        solve((0.7, 0.6), 4, 2)
    with pytest.raises(ValueError, match="empty"):
        solve((), 4, 2)
    with pytest.raises(ValueError, match="budget"):
        Tree.sequoia(budget=1)
    with pytest.raises(ValueError, match="outside"):
        solve((0.5,), 4, 2).c(5, 1)


def test_tree_sequoia_is_the_dp_shape_and_lossless_greedy() -> None:
    strategy = Tree.sequoia(budget=8, max_depth=3)
    assert strategy.parents == solve(PAPER_ACCEPTANCE, 8, 3).parents(8, 3)
    assert strategy.sampling == "without_replacement"
    target, draft = tiny_draft_pair(vocab=48, seed=3, noise=0.05)
    params = SamplingParams(temperature=0.0)
    for prompt in ([1, 2, 3], [5, 9, 5, 9, 11], [40, 7]):
        base = SpeculativeEngine(target, None, Baseline(), params).generate(prompt, 24)
        spec = SpeculativeEngine(target, draft, strategy, params).generate(prompt, 24)
        assert spec.tokens == base.tokens
        assert spec.stats.target_calls < base.stats.target_calls


def test_acceptance_of_a_perfect_draft_is_all_rank_one() -> None:
    target, draft = tiny_draft_pair(vocab=32, seed=4, noise=0.0)
    est = estimate_acceptance(target, draft, [[1, 2, 3], [4, 5]], SamplingParams(temperature=0.0), width=3,
                              tokens_per_prompt=12)
    assert est.vector == (1.0, 0.0, 0.0)
    assert est.steps >= 4


def test_acceptance_of_a_noisy_draft_is_a_distribution() -> None:
    target, draft = tiny_draft_pair(vocab=32, seed=4, noise=0.6)
    est = estimate_acceptance(target, draft, [[1, 2, 3], [4, 5]], SamplingParams(temperature=1.0, seed=3), width=3,
                              tokens_per_prompt=16)
    assert 0 < sum(est.vector) <= 1
    assert sum(est.counts) <= est.steps
    assert est.vector[0] < 1.0


def test_planner_prefers_big_trees_when_verification_is_flat() -> None:
    table = solve(PAPER_ACCEPTANCE, 32, 8)
    flat = Latencies({1: 1.0, 32: 1.0}, {1: 0.01, 32: 0.01})       # GPU-like: n tokens cost one
    linear = Latencies({1: 1.0, 32: 32.0}, {1: 0.01, 32: 0.01})    # compute-bound: n tokens cost n
    big = best_plan(table, flat)
    small = best_plan(table, linear)
    assert big.budget > 16 and big.speedup > 2.0
    assert small.budget == 2 and small.speedup < 1.0
    # the prediction is c(n, d) over the cost of that very tree, in units of one plain decode
    assert big.speedup == pytest.approx(tree_value(big.parents, PAPER_ACCEPTANCE) / flat.tree_cost(big.parents))


def test_profile_latencies_measures_and_leaves_caches_empty() -> None:
    target, draft = tiny_draft_pair(vocab=32, seed=5)
    lat = profile_latencies(target, draft, [1, 2, 3, 4], verify_sizes=(1, 4), draft_sizes=(1, 2), repeats=1)
    assert set(lat.verify) == {1, 4} and set(lat.draft) == {1, 2}
    assert all(v > 0 for v in [*lat.verify.values(), *lat.draft.values()])
    assert target.committed == [] and draft.committed == []
    assert Latencies.from_json(lat.to_json()) == lat
