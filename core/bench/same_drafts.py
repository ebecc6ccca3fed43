"""Rule 3 (SpecInfer) against K-SEQ (SpecTr) on the same drafts, with no sampling noise.

:class:`SameDrafts` is a MultiDraft that, at every step, also scores the tree it drafted under both verifiers: the
exact expected number of accepted tokens given the drafted tokens and the target's distributions at every node
(core.spectr.expected_accepted). The generation itself goes on with the strategy's own verifier, so both numbers of a
step describe the very same tree. Sampled decoding only: at temperature 0 both verifiers are the argmax rule.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from statistics import fmean
from typing import Sequence

from core.backends.base import Backend
from core.drafting import Drafter, MultiDraft
from core.engine import SpeculativeEngine
from core.sampling import Rng, SamplingParams
from core.spectr import RULE3, VERIFIERS, expected_accepted


@dataclass(frozen=True)
class SameDrafts(MultiDraft):
    """MultiDraft(k, length, verifier) that records, per step, the expected accepted length of every verifier."""

    scores: list = field(default_factory=list, compare=False, repr=False)  # one {verifier: E[accepted]} per step

    @property
    def label(self) -> str:
        return super().label.replace("MultiDraft", "SameDrafts", 1)

    def make_drafter(self, draft: Backend | None, params: SamplingParams, rng: Rng) -> Drafter:
        drafter = super().make_drafter(draft, params, rng)
        rule = drafter.verify

        def verify(tree, target_dist, rng, eos_ids=(), target_prob=None):
            if len(tree):
                t0 = time.perf_counter()
                score = {v: expected_accepted(tree, target_dist, v, eos_ids) for v in VERIFIERS}
                self.scores.append({**score, "seconds": time.perf_counter() - t0})
            return rule(tree, target_dist, rng, eos_ids, target_prob)

        drafter.verify = verify
        return drafter

    def summary(self) -> dict[str, float]:
        """Mean expected accepted tokens per step under each verifier, and the steps scored."""
        out = {v: fmean(s[v] for s in self.scores) if self.scores else 0.0 for v in VERIFIERS}
        out["steps"] = len(self.scores)
        out["scoring_ms_per_step"] = 1000 * fmean(s["seconds"] for s in self.scores) if self.scores else 0.0
        return out

    def take_summary(self) -> dict[str, float]:
        """The summary of the steps scored since the last call (one generation's, in the bench)."""
        out = self.summary()
        self.scores.clear()
        return out


def scored(strategies: dict, sampling: SamplingParams) -> dict:
    """The bench's strategies with every MultiDraft scoring its trees under both verifiers (sampled runs only: at
    temperature 0 both are the argmax rule). The scoring evaluates the target's distribution at every drafted node,
    a little time each step that the bench reports beside the speed."""
    if sampling.greedy:
        return strategies
    return {m: SameDrafts(s.k, s.length, s.verifier) if type(s) is MultiDraft else s for m, s in strategies.items()}


def compare_verifiers(target: Backend, draft: Backend, k: int, length: int, sampling: SamplingParams,
                      prompts: Sequence[Sequence[int]], max_new_tokens: int, verifier: str = RULE3) -> SameDrafts:
    """Decode ``prompts`` with SameDrafts(k, length, verifier) and return it, its ``scores`` filled."""
    if sampling.greedy:
        raise ValueError("at temperature 0 both verifiers follow the target's argmax: compare them at temperature > 0")
    strategy = SameDrafts(k, length, verifier)
    engine = SpeculativeEngine(target, draft, strategy, sampling)
    for ids in prompts:
        engine.generate(list(ids), max_new_tokens)
    return strategy
