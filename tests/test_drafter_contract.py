"""Each drafter's proposals are exactly the distributions it sampled from (ALGORITHMS.md §3, drafting contract)."""
from __future__ import annotations

import itertools

import pytest
import torch

from core.drafting import Chain, MultiDraft, Tree, sample_children
from core.sampling import Rng, SamplingParams, logits_to_probs
from tests.exact import enumerate_outcomes
from tests.table_backend import TableBackend, random_table


@pytest.mark.parametrize("mode", ["iid", "without_replacement", "top_k"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_child_sampler_matches_its_proposals(mode: str, k: int) -> None:
    """Enumerate every draw: the probability of each drafted sequence equals the product of its proposals' q."""
    q = torch.tensor([0.5, 0.0, 0.3, 0.15, 0.05], dtype=torch.float64)
    params = SamplingParams(temperature=1.0)
    seen: dict[tuple, float] = {}

    def run(rng):
        children = sample_children(q, torch.log(q), k, mode, params, rng)
        seen[tuple(t for t, _ in children)] = float(torch.tensor([p.prob(t) for t, p in children], dtype=torch.float64).prod())
        return tuple(t for t, _ in children)

    dist = enumerate_outcomes(run)
    assert abs(sum(dist.values()) - 1.0) < 1e-12
    for children, prob in dist.items():
        assert abs(prob - seen[children]) < 1e-12, (children, prob, seen[children])
        if mode == "without_replacement":
            assert len(set(children)) == len(children)
        assert all(q[t] > 0 for t in children) or mode == "top_k"


@pytest.mark.parametrize("strategy", [Chain(3), MultiDraft(2, 2), Tree((-1, -1, 0, 1, 2), "without_replacement"),
                                      Tree((-1, -1, 0), "iid")], ids=lambda s: s.label)
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.6, 0.8)])
def test_model_drafter_proposals_are_processed_draft_distributions(strategy, temperature, top_p) -> None:
    """The q attached to each node is the draft's processed distribution at that node's parent context."""
    vocab = 7
    table = random_table(vocab, seed=5)
    draft = TableBackend(table, vocab, "draft")
    params = SamplingParams(temperature=temperature, top_p=top_p)
    for seed in range(20):
        drafter = strategy.make_drafter(draft, params, Rng(seed))
        prompt = [1, 2, 3]
        drafter.start(prompt)
        tree = drafter.draft(prompt, max_depth=8, max_nodes=32)
        assert len(tree) == len(strategy.parents)
        for j, tok in enumerate(tree.tokens):
            parent_ctx = prompt + [tree.tokens[i] for i in tree.path_to(j)[:-1]]
            expected = logits_to_probs(draft.logits_for(parent_ctx), params)
            proposal = tree.proposals[j]
            assert proposal.dist is not None
            assert float((proposal.dist.double() - expected.double()).abs().max()) < 1e-12
            assert expected[tok] > 0, "a token outside the draft's support was drafted"
            siblings = [c for c in tree.children(tree.parents[j]) if c < j]
            if strategy.make_drafter(draft, params, Rng(0)).mode == "without_replacement":
                assert proposal.exclude == tuple(tree.tokens[c] for c in siblings)


def test_greedy_drafts_are_top_ranked_and_one_hot() -> None:
    vocab = 9
    draft = TableBackend(random_table(vocab, seed=6), vocab, "draft")
    drafter = Tree((-1, -1, -1, 0, 0)).make_drafter(draft, SamplingParams(temperature=0.0), Rng(0))
    drafter.start([4, 4])
    tree = drafter.draft([4, 4], max_depth=4, max_nodes=10)
    ranked = torch.argsort(draft.logits_for([4, 4]), descending=True).tolist()
    assert tree.tokens[:3] == ranked[:3]
    assert all(p.dist is None for p in tree.proposals)
    assert list(itertools.islice((p.prob(t) for p, t in zip(tree.proposals, tree.tokens)), 5)) == [1.0] * 5
