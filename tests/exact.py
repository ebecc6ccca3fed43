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
