"""The race between Baseline and a speculative strategy, as data: replay on a shared clock, and the verdict.

The two runs happen one after the other on the same device (running them at once would make them contend), each
recorded with its engine timestamps; replaying both on one clock lets them race fairly. No Qt here.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

from core.divergence import GreedyComparison, compare_greedy
from core.events import GenerationResult, Origin


@dataclass(frozen=True)
class RunReplay:
    """One recorded run, queried at replay time ``t`` (seconds since its prompt was submitted)."""

    label: str
    result: GenerationResult

    @property
    def duration(self) -> float:
        """Seconds from the prompt to the last token (engine clock)."""
        return self.result.stats.seconds

    def steps_at(self, t: float) -> int:
        """How many steps had finished ``t`` seconds into the run."""
        return bisect.bisect_right([s.timestamp for s in self.result.steps], t)

    def tokens_at(self, t: float) -> int:
        k = self.steps_at(t)
        return self.result.steps[k - 1].stats.new_tokens if k else 0

    def pieces_at(self, t: float) -> list[tuple[str, Origin]]:
        """The answer's text so far as (piece, origin) pairs, one per emitted token, for colouring."""
        out: list[tuple[str, Origin]] = []
        for step in self.result.steps[: self.steps_at(t)]:
            out.extend(zip(step.token_texts, step.origins))
        return out

    def text_at(self, t: float) -> str:
        """The decoded answer text so far (as the chat shows it)."""
        return "".join(step.text for step in self.result.steps[: self.steps_at(t)])


def is_greedy(result: GenerationResult) -> bool:
    """Whether the run decoded greedily (every step says; an endpoint's steps too)."""
    return bool(result.steps) and result.steps[0].greedy


@dataclass(frozen=True)
class RaceSummary:
    """The verdict of a race."""

    baseline: RunReplay
    other: RunReplay
    comparison: GreedyComparison | None   # None unless both runs were greedy

    @property
    def speedup(self) -> float:
        """Decode speed of the strategy over the baseline's (tokens/s after the first token, engine clock)."""
        base = self.baseline.result.stats.tokens_per_second
        return self.other.result.stats.tokens_per_second / base if base > 0 else 0.0

    @property
    def wall_speedup(self) -> float:
        """Whole-answer time ratio, prefill and first token included (same token count assumed)."""
        b, o = self.baseline.result.stats, self.other.result.stats
        if b.seconds <= 0 or o.seconds <= 0 or b.new_tokens == 0:
            return 0.0
        return (o.new_tokens / o.seconds) / (b.new_tokens / b.seconds)

    @property
    def fastest(self) -> str:
        """Label of the run with the higher decode speed."""
        return self.other.label if self.speedup > 1.0 else self.baseline.label

    def identity_text(self) -> str:
        """For greedy runs: identical, or where the texts part and whether that was a near-tie."""
        if self.comparison is None:
            return "sampling: the two answers are different draws from the same distribution, so texts may differ"
        c = self.comparison
        if c.identical:
            unit = "characters" if c.texts is not None else "tokens"
            return f"greedy outputs identical \u2714 ({c.compared} {unit} compared)"
        pieces = [p for p, _ in self.baseline.pieces_at(float("inf"))]
        other = [p for p, _ in self.other.pieces_at(float("inf"))]
        context = "".join(pieces[max(0, c.index - 12): c.index])
        want = pieces[c.index] if c.index < len(pieces) else "?"
        got = other[c.index] if c.index < len(other) else "?"
        if c.margin is None:
            return (f"greedy outputs differ at token {c.index} after \u201c{context}\u201d: {self.baseline.label} "
                    f"{want!r} vs {self.other.label} {got!r} (no top-2 margin was recorded)")
        return (f"greedy outputs differ at token {c.index} after \u201c{context}\u201d: {self.baseline.label} "
                f"{want!r} vs {self.other.label} {got!r}; {c.describe()}: {c.reason}")


def summarize(baseline_label: str, baseline: GenerationResult, other_label: str,
              other: GenerationResult) -> RaceSummary:
    """Compare two finished runs of the same prompt."""
    comparison = compare_greedy(baseline, other) if is_greedy(baseline) and is_greedy(other) else None
    return RaceSummary(RunReplay(baseline_label, baseline), RunReplay(other_label, other), comparison)
