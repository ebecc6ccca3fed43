"""Cheap drafters: prompt lookup, SpecInfer's merged tree, the adaptive chain. Lookup logic, greedy identity with
Baseline on tiny float64 models, and exact enumeration of the sampled output distribution through the real engine."""
from __future__ import annotations

import pytest
import torch

from core.adaptive import AdaptiveChain
from core.drafting import Baseline, Chain, Tree
from core.engine import SpeculativeEngine
from core.merge import Merge, merge_trees, verdict_for
from core.ngram import NGram, NGramDrafter, lookup
from core.sampling import SamplingParams
from core.tree import Proposal, TokenTree
from core.verify import Verdict
from tests.exact import first_two_tokens_exact
from tests.table_backend import TableBackend, random_table
from tests.tiny_models import tiny_draft_pair

PROMPTS = ([3, 4, 5, 6, 7, 3, 4, 5], [9, 1, 9, 1, 9, 1, 2], [10, 11, 12, 13, 14, 15], [7, 7, 7, 7])


def test_lookup_takes_the_latest_longest_match() -> None:
    #            0  1  2  3  4  5  6  7  8  9
    tokens = [1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 3]
    found = lookup(tokens, max_ngram=3, max_len=2)
    assert found.continuation == (8, 1)   # the occurrence at 4..6, not the older one at 0..2
    assert found.match == 3


def test_lookup_extends_the_match_backwards() -> None:
    tokens = [5, 6, 1, 2, 3, 4, 0, 5, 6, 1, 2, 3]
    found = lookup(tokens, max_ngram=2, max_len=3)
    assert found.continuation == (4, 0, 5)
    assert found.match == 5   # 5 6 1 2 3 agree although only 2 were looked up


def test_lookup_without_a_match() -> None:
    assert lookup([1, 2, 3, 4]).match == 0
    assert lookup([1]).continuation == ()


def test_a_lookup_chain_ends_at_a_stop_token() -> None:
    tokens = [7, 8, 9, 3, 10, 11, 7, 8]
    drafter = NGramDrafter(k=4, min_match=1)
    assert drafter.draft(tokens, 8, 8).tokens == [9, 3, 10, 11]
    drafter.start(tokens, stops={3})          # nothing after the end of turn can be emitted
    assert drafter.draft(tokens, 8, 8).tokens == [9, 3]


def _greedy_pair():
    return tiny_draft_pair(vocab=24, seed=7, noise=0.05)


@pytest.mark.parametrize("strategy", [NGram(4, min_match=1), Merge((Chain(2), NGram(3, min_match=1))),
                                      Merge((Tree.sequoia(6, 3), NGram(4, min_match=2))), AdaptiveChain(2, 1, 5)],
                         ids=["ngram", "merge-chain", "merge-sequoia", "adaptive"])
def test_greedy_identical_to_baseline(strategy) -> None:
    target, draft = _greedy_pair()
    params = SamplingParams(temperature=0.0)
    drafted = 0
    for prompt in PROMPTS:
        base = SpeculativeEngine(target, None, Baseline(), params).generate(prompt, 30)
        spec = SpeculativeEngine(target, draft, strategy, params).generate(prompt, 30)
        assert spec.tokens == base.tokens, strategy.label
        drafted += spec.stats.drafted
    assert drafted > 0


def test_merged_tree_carries_ngram_nodes() -> None:
    target, draft = _greedy_pair()
    engine = SpeculativeEngine(target, draft, Merge((Chain(1), NGram(3, min_match=1))), SamplingParams())
    sources = {node.source for event in engine.stream(PROMPTS[0], 20) for node in event.nodes}
    assert {"draft", "ngram"} <= sources


def test_merge_folds_deterministic_duplicates_only() -> None:
    dist = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    sampled = TokenTree()
    sampled.add(1, -1, Proposal(dist))
    sampled.add(2, -1, Proposal(dist, (1,)))
    fixed = TokenTree.chain([2, 0], "ngram")          # deterministic 2 folds into the sampled 2; 0 hangs below it
    merged, maps = merge_trees([sampled, fixed])
    assert merged.tokens == [1, 2, 0] and merged.parents == [-1, -1, 1] and maps == [[0, 1], [1, 2]]
    merged, maps = merge_trees([sampled, sampled])    # sampled nodes are never folded, even onto equal tokens
    assert merged.tokens == [1, 2, 1, 2] and maps == [[0, 1], [2, 3]]
    greedy = TokenTree.chain([1, 0], "draft")         # a deterministic first tree
    lookup_tree = TokenTree.chain([1, 0, 2], "ngram")  # folds into 1 -> 0, then adds 2 below
    merged, maps = merge_trees([greedy, lookup_tree])
    assert merged.tokens == [1, 0, 2] and maps == [[0, 1], [0, 1, 2]]
    verdict = Verdict(accepted=(0, 1, 2), extra=5, bonus=True)
    assert verdict_for(verdict, maps[0]).accepted == (0, 1)
    assert not verdict_for(verdict, maps[0]).bonus
    assert verdict_for(verdict, maps[1]).accepted == (0, 1, 2)


def test_adaptive_chain_grows_and_shrinks() -> None:
    target, draft = tiny_draft_pair(vocab=24, seed=7, noise=0.0)   # a perfect draft: every chain is accepted
    engine = SpeculativeEngine(target, draft, AdaptiveChain(1, 1, 4), SamplingParams())
    sizes = [len(e.nodes) for e in engine.stream([1, 2, 3], 40)]
    assert sizes[:4] == [1, 2, 3, 4]
    noisy_target, noisy_draft = tiny_draft_pair(vocab=24, seed=7, noise=2.0)
    engine = SpeculativeEngine(noisy_target, noisy_draft, AdaptiveChain(4, 1, 4), SamplingParams())
    sizes = [len(e.nodes) for e in engine.stream([1, 2, 3], 40)]
    assert min(sizes[:-1]) < 4


# -- exact enumeration on table models ---------------------------------------------------------------------------

EXACT = [
    ("ngram", NGram(2, min_match=1)),
    ("merge-chain", Merge((Chain(1), NGram(2, min_match=1)))),
    ("merge-tree", Merge((Tree((-1, -1), "without_replacement"), NGram(2, min_match=1)))),
    ("merge-iid", Merge((Tree((-1, -1), "iid"), NGram(1, min_match=1)))),
    ("ngram-first", Merge((NGram(1, min_match=1), Tree((-1, -1), "iid")))),
    ("adaptive", AdaptiveChain(1, 1, 2)),
]


@pytest.mark.parametrize("name,strategy", EXACT, ids=[n for n, _ in EXACT])
@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9)],
                         ids=["t1", "t0.7-p0.9"])
def test_sampled_joint_distribution_is_exact(name: str, strategy, params: SamplingParams) -> None:
    vocab = 3
    target = TableBackend(random_table(vocab, seed=11), vocab, "target")
    draft = TableBackend(random_table(vocab, seed=12, holes=0.3), vocab, "draft")
    prompt = [0, 1, 2, 0, 1]   # the suffix 0 1 occurred before: lookup proposes 2 0
    got, expected = first_two_tokens_exact(target, draft, strategy, params, prompt)
    assert float((got - expected).abs().max()) < 1e-9, name
