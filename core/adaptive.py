"""The adaptive chain: the simple reference the planner is measured against.

It drafts a chain of ``k`` tokens with the draft model, grows ``k`` by one after a step whose whole chain was
accepted and shrinks it by one after a rejection (the heuristic of llama.cpp's and HF's assisted generation).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Sequence

from core.backends.base import Backend
from core.drafting import DrafterBase, ModelDrafter, StaticStrategy
from core.sampling import Rng, SamplingParams
from core.tree import TokenTree
from core.verify import Verdict


class AdaptiveChainDrafter(DrafterBase):
    """A chain drafter whose length follows the last step's outcome, within ``k_min..k_max``."""

    def __init__(self, backend: Backend, k: int, k_min: int, k_max: int, params: SamplingParams, rng: Rng) -> None:
        self.k, self.k_min, self.k_max = k, k_min, k_max
        # one model drafter for the longest chain; shorter chains are the same drafter cut by max_depth
        self.model = ModelDrafter(backend, tuple(range(-1, k_max - 1)), "without_replacement", params, rng, "draft")

    @property
    def note(self) -> str:
        return f"chain length {self.k}"

    def start(self, prompt: Sequence[int], cancel=None, stops: Collection[int] = ()) -> None:
        self.model.start(prompt, cancel, stops)

    def draft(self, tokens: Sequence[int], max_depth: int, max_nodes: int) -> TokenTree:
        return self.model.draft(tokens, min(max_depth, self.k), max_nodes)

    def feedback(self, tree: TokenTree, verdict: Verdict) -> None:
        self.model.feedback(tree, verdict)
        if not len(tree):
            return
        if len(verdict.accepted) == len(tree) and len(tree) == self.k:
            self.k = min(self.k + 1, self.k_max)
        elif len(verdict.accepted) < len(tree):
            self.k = max(self.k - 1, self.k_min)


@dataclass(frozen=True)
class AdaptiveChain(StaticStrategy):
    """Chain speculative sampling whose length adapts step by step, starting at ``k``."""

    k: int = 4
    k_min: int = 1
    k_max: int = 8

    def __post_init__(self) -> None:
        for name, value in (("k", self.k), ("k_min", self.k_min), ("k_max", self.k_max)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 64:
                raise ValueError(f"AdaptiveChain: {name} must be an integer in 1..64, got {value!r}")
        if not self.k_min <= self.k <= self.k_max:
            raise ValueError(f"AdaptiveChain: need k_min <= k <= k_max, got {self.k_min}, {self.k}, {self.k_max}")

    @property
    def label(self) -> str:
        return f"AdaptiveChain({self.k_min}..{self.k_max})"

    def make_drafter(self, draft: Backend | None, params: SamplingParams, rng: Rng) -> AdaptiveChainDrafter:
        if draft is None:
            raise ValueError(f"strategy {self.label} needs a draft model")
        return AdaptiveChainDrafter(draft, self.k, self.k_min, self.k_max, params, rng)
