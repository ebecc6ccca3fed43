"""Several drafters in one tree: the budget split (core.tree_budget) against brute force, and MergedTree (core.merge)
exact by enumeration through the real engine, greedy-identical to Baseline, with every node's source kept."""
from __future__ import annotations

import itertools
import random

import pytest

from core.drafting import Baseline
from core.engine import SpeculativeEngine
from core.merge import MergedTree, Part
from core.sampling import Rng, SamplingParams
from core.sequoia import PAPER_ACCEPTANCE, solve, tree_value
from core.tree import depths_of
from core.tree_budget import DrafterModel, Share, breadth_first, chain_value, merged_value, split_budget
from tests.exact import first_two_tokens_exact
from tests.table_backend import TableBackend, random_table
from tests.test_verify_exact import PARAMS, PARAMS_IDS
from tests.tiny_models import tiny_draft_pair


def _shapes(size: int, depth: int):
    for parents in itertools.product(*[range(-1, i) for i in range(size)]):
        if max(depths_of(parents)) <= depth:
            yield parents


def _every_share(model: DrafterModel, size: int, depth: int):
    """(V, A) of every subtree of ``size`` nodes the drafter could be given, by enumeration."""
    if size == 0:
        yield 0.0, 0.0
    elif not model.shaped:
        if size <= depth:
            yield chain_value(model.acceptance, size), model.acceptance[0]
    else:
        for parents in _shapes(size, depth):
            yield tree_value(parents, model.acceptance) - 1.0, sum(model.acceptance[:parents.count(-1)])


def _random_models(rnd: random.Random) -> list[DrafterModel]:
    models = []
    for i in range(rnd.randint(1, 3)):
        if rnd.random() < 0.6:
            a = [rnd.random() for _ in range(rnd.randint(1, 3))]
            scale = sum(a) / rnd.uniform(0.3, 1.0)
            models.append(DrafterModel(f"model{i}", tuple(x / scale for x in a)))
        else:
            models.append(DrafterModel(f"lookup{i}", tuple(rnd.random() for _ in range(rnd.randint(1, 4))), False))
    return models


def test_split_matches_brute_force() -> None:
    rnd = random.Random(1)
    for trial in range(25):
        models, budget, depth = _random_models(rnd), rnd.randint(1, 6), rnd.randint(1, 3)
        best = 1.0
        for sizes in itertools.product(range(budget), repeat=len(models)):
            if sum(sizes) > budget - 1:
                continue
            for combo in itertools.product(*[list(_every_share(m, s, depth)) for m, s in zip(models, sizes)]):
                best = max(best, merged_value([Share("x", (), v, a) for v, a in combo]))
        split = split_budget(models, budget, depth)
        assert abs(split.value - best) < 1e-12, f"trial {trial}: DP {split.value} vs brute force {best}"
        assert sum(s.nodes for s in split.shares) <= budget - 1
        for share, model in zip(split.shares, models):
            assert share.source == model.source
            if share.nodes:
                assert max(depths_of(share.parents)) <= depth
                if model.shaped:
                    assert abs(tree_value(share.parents, model.acceptance) - 1.0 - share.value) < 1e-12


def test_one_drafter_is_sequoia() -> None:
    table = solve(PAPER_ACCEPTANCE, 24, 5)
    for budget in (2, 8, 16, 24):
        split = split_budget([DrafterModel("draft", PAPER_ACCEPTANCE)], budget, 5)
        assert abs(split.value - table.c(budget, 5)) < 1e-12


def test_a_later_drafter_is_worth_less() -> None:
    """The second of two equal drafters is reached only when the first one's root children were all rejected."""
    lookup = DrafterModel("ngram", (0.5, 0.5), shaped=False)
    split = split_budget([lookup, DrafterModel("memory", (0.5, 0.5), shaped=False)], 5, 2)
    assert [s.nodes for s in split.shares] == [2, 2]
    assert abs(split.value - (1 + 0.75 + 0.5 * 0.75)) < 1e-12
    sure = split_budget([DrafterModel("ngram", (1.0,) * 4, shaped=False), lookup], 5, 4)
    assert [s.nodes for s in sure.shares] == [4, 0], "a drafter after a sure one can never be reached"


def test_breadth_first_keeps_the_tree() -> None:
    parents = (-1, 0, 1, -1, 3, 0)
    bfs = breadth_first(parents)
    assert bfs == (-1, -1, 0, 0, 1, 2)
    assert sorted(depths_of(bfs)) == sorted(depths_of(parents))


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="budget"):
        split_budget([DrafterModel("draft", (0.5,))], 0, 3)
    with pytest.raises(ValueError, match="sum"):
        DrafterModel("draft", (0.7, 0.6))
    with pytest.raises(ValueError, match="unknown part"):
        Part("oracle")
    with pytest.raises(ValueError, match="budget"):
        MergedTree((Part("draft"),), budget=1)
    with pytest.raises(ValueError, match="draft model"):
        MergedTree((Part("draft"),), budget=4).make_drafter(None, SamplingParams(temperature=1.0), Rng(0))


# -- MergedTree through the engine ----------------------------------------------------------------------------------

MIXED = MergedTree((Part("ngram", (0.8, 0.8)), Part("draft", (0.5, 0.2))), budget=4, max_depth=2)


def test_mixed_split_gives_every_part_nodes() -> None:
    """Lookup first: 1.44 expected from its chain of two, plus the draft's 0.5 when the lookup's token is rejected;
    with the draft first the lookup would be discounted by the draft's acceptance and the draft left out."""
    assert [s.nodes for s in MIXED.split.shares] == [2, 1]
    assert abs(MIXED.split.value - (1 + 1.44 + 0.2 * 0.5)) < 1e-12
    assert MIXED.label == "MergedTree(4: ngram 2 + draft 1)"
    flipped = MergedTree(tuple(reversed(MIXED.parts)), budget=4, max_depth=2)
    assert [s.nodes for s in flipped.split.shares] == [0, 2]


@pytest.mark.parametrize("params", PARAMS, ids=PARAMS_IDS)
def test_merged_tree_is_exact(params: SamplingParams) -> None:
    vocab = 3
    target = TableBackend(random_table(vocab, seed=11), vocab, "target")
    draft = TableBackend(random_table(vocab, seed=12, holes=0.3), vocab, "draft")
    got, expected = first_two_tokens_exact(target, draft, MIXED, params, [0, 1, 2, 0, 1])
    assert float((got - expected).abs().max()) < 1e-9


def test_merged_tree_greedy_identical_and_sourced() -> None:
    target, draft = tiny_draft_pair(vocab=24, seed=7, noise=0.05)
    strategy = MergedTree((Part("draft"), Part("ngram", (0.7, 0.6, 0.5)), Part("memory", (0.6, 0.5))), budget=10,
                          max_depth=4)
    assert all(s.nodes for s in strategy.split.shares)
    greedy = SamplingParams(temperature=0.0)
    sources: set[str] = set()
    for prompt in ([3, 4, 5, 6, 7, 3, 4, 5], [9, 1, 9, 1, 9, 1, 2], [7, 7, 7, 7]):
        base = SpeculativeEngine(target, None, Baseline(), greedy).generate(prompt, 24)
        spec = SpeculativeEngine(target, draft, strategy, greedy).generate(prompt, 24)
        assert spec.tokens == base.tokens
        sources |= {n.source for step in spec.steps for n in step.nodes}
    assert {"draft", "ngram"} <= sources
