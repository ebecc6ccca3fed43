"""What Auto learns while decoding: the draft model's acceptance vector, and this prompt's record of memory drafts."""
from __future__ import annotations

from typing import Sequence

from core.memory.stats import (EDITED, MAX_PROB, RECORDED, RESUMED, MemoryStats, bucket, highest, per_bucket,
                               shorter_copies)
from core.tree import TokenTree
from core.verify import Verdict


class AcceptanceTracker:
    """The acceptance vector measured online from verified trees, through per-rank hazards.

    ``h_i`` = P(child of rank i accepted | ranks before it rejected), counted at every node the verification
    reached; then ``a_i = h_i * prod_{j<i} (1 - h_j)``. The plan's vector is the prior (weight ``prior_weight``).
    """

    def __init__(self, prior: Sequence[float], prior_weight: float = 4.0) -> None:
        left = 1.0
        self.accepted, self.tested = [], []
        for a in prior:
            h = a / left if left > 1e-12 else 0.0
            self.accepted.append(h * prior_weight)
            self.tested.append(prior_weight)
            left -= a

    def observe(self, tree: TokenTree, verdict: Verdict) -> None:
        accepted = set(verdict.accepted)
        for rank_children in (tree.children(u) for u in (-1, *verdict.accepted)):
            for rank, child in enumerate(rank_children[: len(self.tested)]):
                if child not in verdict.accept_probs:
                    break
                self.tested[rank] += 1
                if child in accepted:
                    self.accepted[rank] += 1
                    break

    def vector(self) -> tuple[float, ...]:
        out, left = [], 1.0
        for a, t in zip(self.accepted, self.tested):
            h = a / t if t else 0.0
            out.append(left * h)
            left *= 1 - h
        return tuple(out)


class PromptRates:
    """This prompt's acceptance of memory-drafted tokens by match length, against memory's long-run estimate.

    The long-run rate counts as ``PRIOR_WEIGHT`` observations, each observation of this prompt as one: three
    rejections at a match length where memory is usually right 70 % of the time halve the estimate there, which
    stops drafting at that length for the rest of this answer. A longer match is no less reliable than a shorter
    one, so what this prompt shows at shorter lengths is a floor for longer ones (:meth:`_shorter_floor`): a long
    match breaks once per edit, and starts again after it. A guess of where a copy resumes, or that an edit made once
    is made again, is no match: what the copies show only raises its prior, and its own misses stop it (a bug-fix
    prompt whose short copies held drafted six failing guesses in a row, each a lost verification of two tokens).
    ``factor`` is what memory's estimates are multiplied by, and ``cap`` the most certain a node of that match length
    may be judged.
    """

    PRIOR_WEIGHT = 3.0

    def __init__(self, long_run: MemoryStats) -> None:
        self.long_run = long_run
        self.tested = per_bucket()
        self.accepted = per_bucket()

    def observe(self, match: int, accepted: bool) -> None:
        b = bucket(match)
        self.tested[b] += 1.0
        self.accepted[b] += float(accepted)

    def factor(self, match: int) -> float:
        if match == RECORDED:      # a recorded probability is already this token's own: no bucket rate corrects it
            return 1.0
        b = bucket(match)
        prior = self.long_run.rate(match)
        if prior <= 0:
            return 1.0
        floor = self._shorter_floor(b)
        if match in (RESUMED, EDITED):
            return self._observed(b, max(prior, floor)) / prior
        return max(self._observed(b, prior), floor) / prior

    def cap(self, match: int) -> float:
        """The most a node's estimate may reach at this match length: ``MAX_PROB``, or this prompt's own record there
        where that is higher (from a long match's prior, some 20 accepted nodes in a row; one miss among them keeps
        the cap for 70 more).

        The fixed cap kept a regenerated answer, copied whole from the earlier one, in 16-token calls on a machine where
        a call of 64 costs 25 plain steps: at 0.98 a node, 64 are predicted to give 36 tokens. Replaying the bench's
        recorded greedy answers at that machine's costs (tools/replay.py), regenerations went 1.64x -> 1.99x of plain
        decoding, and a rename whose record passed the cap lost one 42-node bet (1.13x -> 0.99x). A recorded
        probability may reach certainty (core.memory.stats.highest).
        """
        if match == RECORDED:
            return highest(match)
        b = bucket(match)
        prior = self.long_run.rate(match)
        return max(MAX_PROB, self._observed(b, prior)) if prior > 0 else MAX_PROB

    def _observed(self, b: int, prior: float) -> float:
        """Bucket ``b``'s acceptance on this prompt, from ``prior`` counted as ``PRIOR_WEIGHT`` observations."""
        return (self.accepted[b] + self.PRIOR_WEIGHT * prior) / (self.tested[b] + self.PRIOR_WEIGHT)

    def _shorter_floor(self, b: int) -> float:
        """This prompt's acceptance at match lengths shorter than bucket ``b``'s in the same kind of text (this text,
        or a remembered one), from two tokens up (one matching token is no sign of copying: it matches anywhere),
        counted as if ``PRIOR_WEIGHT`` misses came first, so that only this prompt's own evidence raises it. For the
        ``resumed`` and ``edited`` buckets that is every bucket of this text from two tokens up: a prompt whose
        copies hold is likely to resume them after its edits.

        An edit that copies its source proves it at short matches first; without the floor its long matches started
        from their long-run rate and were drafted two nodes deep until they had failed or succeeded on their own
        (replaying the bench's recorded greedy answers through the policy: code edits 1.34x -> 1.45x of plain steps,
        the other sets unchanged).
        """
        shorter = shorter_copies(b)
        tested = sum(self.tested[i] for i in shorter)
        return sum(self.accepted[i] for i in shorter) / (tested + self.PRIOR_WEIGHT)
