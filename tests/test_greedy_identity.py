"""Greedy speculative decoding is token-for-token identical to the target's own greedy decoding.

Float64 tiny models (Qwen2 and Llama architectures), 24 random prompts each, every strategy; EOS placed where the
baseline emits it so that it falls inside drafted trees; max_new_tokens smaller than the tree depth.
"""
from __future__ import annotations

import random

import pytest

from core.drafting import Baseline, Chain, MultiDraft, Tree
from core.engine import SpeculativeEngine
from core.events import Origin, StopReason
from core.sampling import SamplingParams
from tests.tiny_models import tiny_draft_pair

STRATEGIES = [Chain(k) for k in range(1, 7)] + [
    MultiDraft(3, 3),
    Tree((-1, -1, 0, 0, 1, 2, 2, 4), "without_replacement"),
    Tree((-1, -1, -1, 0, 1, 2, 3, 3), "top_k"),
    Tree((-1, 0, 1, 2, 3, 4, 5, 6, 7, 8), "iid"),
]
GREEDY = SamplingParams(temperature=0.0)


def prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    rnd = random.Random(seed)
    return [[rnd.randrange(vocab) for _ in range(rnd.randint(1, 12))] for _ in range(n)]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_greedy_identical_to_baseline(arch: str) -> None:
    target, draft = tiny_draft_pair(arch, vocab=48, seed=3, noise=0.05)
    accepted_total = 0
    for prompt in prompts(24, 48, seed=11):
        base = SpeculativeEngine(target, None, Baseline(), GREEDY).generate(prompt, 20)
        assert len(base.tokens) == 20 and base.stats.target_calls == 20
        for strategy in STRATEGIES:
            spec = SpeculativeEngine(target, draft, strategy, GREEDY).generate(prompt, 20)
            assert spec.tokens == base.tokens, f"{strategy.label} diverged on prompt {prompt}"
            accepted_total += spec.stats.accepted
    assert accepted_total > 500, "drafts were hardly ever accepted: the test would not exercise acceptance"


def test_eos_inside_tree_and_short_budgets() -> None:
    target, draft = tiny_draft_pair("qwen2", vocab=48, seed=5, noise=0.03)
    eos_accepted_in_tree = 0
    for prompt in prompts(20, 48, seed=12):
        free = SpeculativeEngine(target, None, Baseline(), GREEDY).generate(prompt, 12).tokens
        # declare the token the target emits 6th as EOS (if it did not occur earlier): the run must stop there
        eos = free[5]
        if eos in free[:5]:
            continue
        target.eos_ids = draft.eos_ids = frozenset({eos})
        try:
            base = SpeculativeEngine(target, None, Baseline(), GREEDY).generate(prompt, 12)
            assert base.tokens == free[:6] and base.stop_reason == StopReason.EOS
            for strategy in STRATEGIES:
                spec = SpeculativeEngine(target, draft, strategy, GREEDY).generate(prompt, 12)
                assert spec.tokens == base.tokens and spec.stop_reason == StopReason.EOS, strategy.label
                last = spec.steps[-1]
                if last.origins[-1] == Origin.DRAFT and last.tokens[-1] == eos:
                    eos_accepted_in_tree += 1
                    assert spec.text == base.text
        finally:
            target.eos_ids = draft.eos_ids = frozenset()
    assert eos_accepted_in_tree > 10, "EOS was never accepted inside a drafted tree"


@pytest.mark.parametrize("budget", [1, 2, 3])
def test_max_new_tokens_smaller_than_tree_depth(budget: int) -> None:
    target, draft = tiny_draft_pair("qwen2", vocab=48, seed=4, noise=0.0)
    for prompt in prompts(5, 48, seed=13):
        base = SpeculativeEngine(target, None, Baseline(), GREEDY).generate(prompt, budget)
        for strategy in (Chain(6), Tree((-1, 0, 1, 2, 3, 4, 5, 6), "top_k")):
            spec = SpeculativeEngine(target, draft, strategy, GREEDY).generate(prompt, budget)
            assert spec.tokens == base.tokens and len(spec.tokens) == budget
            assert spec.stop_reason == StopReason.MAX_TOKENS
            assert all(n.depth <= budget - 1 for step in spec.steps for n in step.nodes)
