"""Exact enumeration of every random path a piece of code can take, with the probability of each.

``ScriptedRng`` stands in for :class:`core.sampling.Rng`: each ``accept(p)`` and ``sample(probs)`` is a branch
point. ``enumerate_outcomes(run)`` re-runs ``run(rng)`` once per complete path (depth-first) and sums the
probability of each outcome, so a distribution produced by the real drafting and verification code is computed
exactly, with no sampling noise.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable, Hashable

import torch


class ScriptedRng:
    def __init__(self, script: tuple[int, ...]) -> None:
        self.script = script
        self.taken: list[int] = []
        self.options: list[int] = []
        self.weight = 1.0

    def _choose(self, weights: list[tuple[object, float]]):
        i = len(self.taken)
        pick = self.script[i] if i < len(self.script) else 0
        self.taken.append(pick)
        self.options.append(len(weights))
        value, w = weights[pick]
        self.weight *= w
        return value

    def accept(self, prob: float) -> bool:
        prob = min(max(float(prob), 0.0), 1.0)
        branches = [(b, w) for b, w in ((True, prob), (False, 1.0 - prob)) if w > 0]
        return self._choose(branches)

    def sample(self, probs: torch.Tensor) -> int:
        p = probs.detach().to(torch.float64)
        p = p / p.sum()
        return self._choose([(int(t), float(p[t])) for t in range(len(p)) if p[t] > 0])


def enumerate_outcomes(run: Callable[[ScriptedRng], Hashable]) -> dict[Hashable, float]:
    """Probability of every outcome of ``run`` over all its random paths."""
    dist: dict[Hashable, float] = defaultdict(float)
    stack: list[tuple[int, ...]] = [()]
    while stack:
        script = stack.pop()
        rng = ScriptedRng(script)
        outcome = run(rng)
        dist[outcome] += rng.weight
        for pos in range(len(script), len(rng.taken)):
            for alt in range(1, rng.options[pos]):
                stack.append(tuple(rng.taken[:pos]) + (alt,))
    return dict(dist)


def first_two_tokens_exact(target, draft, strategy, params, prompt: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(speculative, target) joint distributions of the first two generated tokens, both exact.

    The speculative one runs the real engine through every random path; the target's is the product of its own
    processed next-token distributions. ``target`` must offer ``logits_for(context)`` (tests.table_backend).
    """
    from core.engine import SpeculativeEngine
    from core.sampling import logits_to_probs

    def run(rng):
        engine = SpeculativeEngine(target, draft, strategy, params, rng_factory=lambda seed: rng)
        out: list[int] = []
        for event in engine.stream(prompt, max_new_tokens=3):
            out += event.tokens
            if len(out) >= 2:
                break
        return tuple(out[:2])

    vocab = target.vocab_size
    got = torch.zeros((vocab, vocab), dtype=torch.float64)
    for (a, b), w in enumerate_outcomes(run).items():
        got[a, b] += w
    expected = torch.zeros_like(got)
    first = logits_to_probs(target.logits_for(prompt), params)
    for a in range(vocab):
        if first[a] > 0:
            expected[a] = first[a] * logits_to_probs(target.logits_for(prompt + [a]), params)
    return got, expected


def greedy_identical_on_random_tables(strategy, prompt: list[int], seeds: int = 6, vocab: int = 9,
                                      new_tokens: int = 12) -> int:
    """Assert that ``strategy`` decodes ``prompt`` greedily token for token as plain decoding does on ``seeds`` sharp
    random table targets; returns how many nodes it drafted in all (a test also asserts that it drafted)."""
    from core.drafting import Baseline
    from core.engine import SpeculativeEngine
    from core.sampling import SamplingParams
    from tests.table_backend import TableBackend, random_table

    greedy = SamplingParams(temperature=0.0)
    drafted = 0
    for seed in range(seeds):
        target = TableBackend(random_table(vocab, seed=seed, sharp=3.0), vocab, "target")
        expected = SpeculativeEngine(target, None, Baseline(), greedy).generate(prompt, new_tokens).tokens
        result = SpeculativeEngine(target, None, strategy, greedy).generate(prompt, new_tokens)
        assert result.tokens == expected, f"seed {seed}"
        drafted += result.stats.drafted
    return drafted
