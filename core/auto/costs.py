"""The cost model: seconds per call measured on one machine, and the predicted cost of a step.

``verify[n]`` is the target's forward of ``n`` tokens (the root and ``n - 1`` drafted nodes), ``draft[w]`` the draft
model's forward of a level of ``w`` tokens. Other sizes are interpolated linearly between the measured ones and
extrapolated from the last two. ``noise`` is the relative spread of repeated timings of one size: a predicted gain
smaller than it cannot be told from the machine's own jitter.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Sequence

from core.tree import depths_of


@dataclass(frozen=True)
class Latencies:
    """Seconds per call on one machine (the fastest of a few repeats) and the timing noise seen."""

    verify: dict[int, float]
    draft: dict[int, float] = field(default_factory=dict)
    noise: float = 0.0

    def __post_init__(self) -> None:
        for name, table in (("verify", self.verify), ("draft", self.draft)):
            for size, seconds in table.items():
                if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                    raise ValueError(f"{name} latency sizes must be positive integers, got {size!r}")
                if not isinstance(seconds, (int, float)) or not 0 < seconds < 3600:
                    raise ValueError(f"{name} latency of {size} tokens must be a positive number of seconds, "
                                     f"got {seconds!r}")
        if not self.verify:
            raise ValueError("no verify latency was measured")
        if not 0 <= self.noise < 10:
            raise ValueError(f"timing noise must be a small non-negative fraction, got {self.noise!r}")

    @property
    def plain(self) -> float:
        """One plain decode step of the target: the unit of every speedup."""
        return self.verify_cost(1)

    def verify_cost(self, n: int) -> float:
        table = self._verify_table
        return table[n] if 0 < n < len(table) else _interpolate(self.verify, n)

    @cached_property
    def _verify_table(self) -> tuple[float, ...]:
        """``verify_cost`` of every size up to the widest measured, index = size: Auto prices every width of a
        memory draft each step, and interpolating afresh each time was a noticeable share of a step's own Python."""
        return (0.0,) + tuple(_interpolate(self.verify, n) for n in range(1, self.widest + 1))

    def draft_cost(self, width: int) -> float:
        if not self.draft:
            raise ValueError("no draft latencies were measured")
        return _interpolate(self.draft, width)

    def reading_cost(self, n: int) -> float:
        """Predicted seconds for the draft model to read ``n`` tokens of text: its widest measured call's cost per
        token (a prefill's batches are wider still and cheaper per token: this errs on the dear side)."""
        widest = max(self.draft)
        return n * self.draft_cost(widest) / widest

    def tree_cost(self, parents: Sequence[int]) -> float:
        """Predicted seconds of one speculative step with this tree shape drafted by a model, then verified.

        The model drafter makes one call for the root (the token left by the last step) and one per level except the
        deepest; the target evaluates the root and every drafted node at once.
        """
        depths = depths_of(parents) if parents else []
        widths = [depths.count(level) for level in range(1, max(depths, default=0))]
        draft = self.draft_cost(1) + sum(self.draft_cost(w) for w in widths) if parents else 0.0
        return self.verify_cost(len(parents) + 1) + draft

    @property
    def widest(self) -> int:
        """The largest call measured: steps never verify more, as larger ones would be guessed, not measured."""
        return max(self.verify)

    def ratios(self) -> dict[int, float]:
        """t(n) / t(1) for every measured size."""
        return {n: t / self.plain for n, t in sorted(self.verify.items())}

    def to_json(self) -> dict:
        return {"verify": {str(k): v for k, v in self.verify.items()},
                "draft": {str(k): v for k, v in self.draft.items()}, "noise": self.noise}

    @classmethod
    def from_json(cls, data: dict) -> "Latencies":
        return cls({int(k): float(v) for k, v in data["verify"].items()},
                   {int(k): float(v) for k, v in data.get("draft", {}).items()}, float(data.get("noise", 0.0)))


def _interpolate(table: dict[int, float], x: int) -> float:
    if x in table:
        return table[x]
    keys = sorted(table)
    if len(keys) == 1:
        return table[keys[0]] * x / keys[0]
    lo = max((k for k in keys if k < x), default=None)
    hi = min((k for k in keys if k > x), default=None)
    if lo is None:
        lo, hi = keys[0], keys[1]
    elif hi is None:
        lo, hi = keys[-2], keys[-1]
    slope = (table[hi] - table[lo]) / (hi - lo)
    return max(table[lo] + slope * (x - lo), 1e-9)
