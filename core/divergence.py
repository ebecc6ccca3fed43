"""Compare two greedy decodes of the same prompt: identical, or where they part and how close to a tie it was.

Exact identity holds where numerics are exact. Quantized llama.cpp evaluates a batch with other kernels than one
token at a time, so there two greedy runs may part at a near-tie; the margin tells which case it was.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from core.events import GenerationResult

NEAR_TIE = 0.1  # top-2 logit margin under which a flip is attributed to batched-kernel rounding


@dataclass(frozen=True)
class GreedyComparison:
    identical: bool
    index: int | None = None              # first position where the tokens differ
    baseline_token: int | None = None
    other_token: int | None = None
    margin: float | None = None           # the smaller top-2 margin of the two runs at that position
    compared: int = 0                     # tokens compared (the shorter run's length)

    @property
    def near_tie(self) -> bool:
        return self.margin is not None and self.margin < NEAR_TIE

    @property
    def reason(self) -> str:
        """Why two greedy runs of one prompt may part here: rounding at a near-tie, or something to investigate."""
        return ("batched kernels can round a near-tie either way" if self.near_tie
                else "a real difference between the two runs: investigate")

    def describe(self) -> str:
        if self.identical:
            return f"identical ({self.compared} tokens)"
        kind = "a near-tie" if self.near_tie else "NOT a near-tie"
        return (f"diverged at token {self.index}: {self.baseline_token} vs {self.other_token}, "
                f"top-2 margin {self.margin:.4f} ({kind})")


def _margins(result: GenerationResult) -> list[float | None]:
    return [m for step in result.steps for m in step.margins] or [None] * len(result.tokens)


def compare_greedy(baseline: GenerationResult, other: GenerationResult) -> GreedyComparison:
    """Token-by-token comparison of two greedy results (the shorter length is compared)."""
    a, b = baseline.tokens, other.tokens
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            ma, mb = _value_at(_margins(baseline), i), _value_at(_margins(other), i)
            known = [m for m in (ma, mb) if m is not None]
            return GreedyComparison(False, i, a[i], b[i], min(known) if known else None, n)
    return GreedyComparison(True, compared=n)


def _value_at(values: Sequence[float | None], i: int) -> float | None:
    return values[i] if i < len(values) else None
