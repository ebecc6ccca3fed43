"""Compare two greedy decodes of the same prompt: identical, or where they part and how close to a tie it was.

Exact identity holds where numerics are exact: float64 models, and quantized llama.cpp with SpecLens's build and
flash attention on. Elsewhere (a stock llama.cpp build, flash attention off: native/llama.cpp/README.md) a batch and
one-token steps can add the same values in other orders, so two greedy runs may part at a near-tie; the margin tells
which case it was.
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
    texts: tuple[str, str] | None = None  # runs compared by their text (an endpoint's has no token ids): where they part

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
            return f"identical ({self.compared} {'characters' if self.texts is not None else 'tokens'})"
        kind = "a near-tie" if self.near_tie else "NOT a near-tie"
        margin = f"top-2 margin {self.margin:.4f} ({kind})" if self.margin is not None else "no margin recorded"
        if self.texts is not None:
            return f"diverged at token {self.index}: {self.texts[0]!r} vs {self.texts[1]!r}, {margin}"
        return f"diverged at token {self.index}: {self.baseline_token} vs {self.other_token}, {margin}"


def _margins(result: GenerationResult) -> list[float | None]:
    return [m for step in result.steps for m in step.margins] or [None] * len(result.tokens)


def _from_text(result: GenerationResult) -> bool:
    """A run recorded from text (an endpoint's stream): its steps carry no token ids."""
    return any(step.text and not step.tokens for step in result.steps)


def _token_at(result: GenerationResult, char: int) -> int | None:
    """The token whose characters hold ``char`` (or the first one after it: a control token has none)."""
    spans = [span for step in result.steps for span in step.spans]
    return next((k for k, (start, end) in enumerate(spans) if end > char or start >= char), None)


def _compare_texts(baseline: GenerationResult, other: GenerationResult) -> GreedyComparison:
    """Two greedy runs compared character by character, as an endpoint gives only text; where they part, the token of
    the run that has tokens there tells the margin."""
    a, b = baseline.text, other.text
    n = min(len(a), len(b))
    char = next((i for i in range(n) if a[i] != b[i]), None)
    if char is None:
        return GreedyComparison(True, compared=n, texts=("", ""))
    index, margins = char, []
    for run in (baseline, other):
        if not _from_text(run) and (k := _token_at(run, char)) is not None:
            index = k
            margins.append(_value_at(_margins(run), k))
    known = [m for m in margins if m is not None]
    return GreedyComparison(False, index, None, None, min(known) if known else None, n,
                            (a[char:char + 12], b[char:char + 12]))


def compare_greedy(baseline: GenerationResult, other: GenerationResult) -> GreedyComparison:
    """Token-by-token comparison of two greedy results (the shorter length is compared); by text when either was
    recorded from an endpoint's text."""
    if _from_text(baseline) or _from_text(other):
        return _compare_texts(baseline, other)
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
