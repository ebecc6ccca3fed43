"""How often memory-drafted tokens are accepted, by match length, and the calibration of memory's estimates.

A node drafted from memory is backed by the occurrences that agree with the context on ``match`` tokens plus its
path; its *raw* estimate is its token's share among the ``n`` occurrences that go on after its parent (weighted by
recency), shrunk toward "something else" as if ``KAPPA`` more occurrences had been seen: ``share * n / (n + KAPPA)``.
One occurrence gives ``1 / (1 + KAPPA)``, many agreeing ones approach 1, but only at short matches: past
``AGREEMENT_MATCH`` tokens agreement adds nothing (:func:`confidence`). The estimate the planner uses is
``scale(m) * raw``, where ``scale(m)`` is the number of accepted nodes per unit of raw estimate observed in the
match-length bucket of ``m``: calibrated on average per bucket, and smoothed toward ``PRIOR_RATE`` (what a node of a
single occurrence is assumed to achieve) while the bucket has little evidence.

The event counted is "the node was accepted given its parent was", which for a deterministic draft is exactly the
target's probability of the node's token, whatever the sibling order. Evidence decays slowly (``DECAY`` per new
observation in a bucket) so the numbers follow the model pair and the user's texts across sessions.

A copy of a remembered text (an earlier answer, an earlier conversation) is counted apart from a match in the text at
hand, in buckets of its own (:func:`key`). Two last buckets hold guesses about edits, which no match length
describes since no token agrees behind them: ``RESUMED``, the first token of a copy guessed to resume after an edit
(core.memory.resume), and ``EDITED``, the first new token of a substitution the text has made once, carried to the
copy's next use of its old tokens (core.memory.substitutions). A third, ``RECORDED``, holds the nodes of a remembered
answer whose tokens' probabilities were recorded under the sampling settings at hand: there the raw estimate is the
probability the token was drawn with (what a deterministic draft of it is accepted with after the same context), and
the bucket's calibration starts at 1.

A match in the text at hand whose latest occurrence lies in the answer being written (the answer repeating its own
phrases) is counted apart from one in its prompt (the answer copying what it was given), in buckets of their own: on
the bench's 77 recorded greedy answers (tools/memory_calibration.py's walk along the likeliest path), the first held
0.36 / 0.51 / 0.54 / 0.71 / 0.70 of the time at matches of 2 / 3 / 4 / 5-8 / 9-16 tokens, the second 0.59 / 0.69 /
0.79 / 0.90 / 0.94. One bucket averaged them: a prose answer's echoes of itself were judged as surely as an edit's
copies of its source, and the copies less surely for the echoes' misses.

Only the remembered texts' buckets are carried from one generation to the next (:meth:`MemoryStats.forget_this_text`):
how often a match in the text at hand holds depends on the prompt (an edit copies its source, new code only echoes
its own phrases), and an average over earlier prompts, most of whose nodes came from copies, misjudged new ones.
Replaying the benchmark's answers with the statistics learnt on the other sets (tools/replay.py --warm), new code ran
at 0.97x of plain decoding at a 2-core Zen 4's and a Xeon's costs; measured on the Zen 4 with the default pair, 0.95x
of Baseline against 1.00x from empty statistics. Apart, new code replays at 0.99-1.00x either way (measured: 0.99x
both ways), and a regeneration still starts from what copies of earlier answers have achieved.
"""
from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field

BUCKET_STARTS = (1, 2, 3, 4, 5, 9, 17)          # match lengths 1, 2, 3, 4, 5-8, 9-16, 17+
RESUMED = -1            # the key of a resumed copy's first token
EDITED = 0              # the key of a once-made substitution's first new token
RECORDED = -1 - 2**20   # the key of a node whose probability was recorded: below every remembered text's key
_LENGTHS = ("1", "2", "3", "4", "5-8", "9-16", "17+")
OWN = 2**20             # keys above it: a match in the answer being written, ``key - OWN`` tokens long
BUCKET_LABELS = (_LENGTHS + tuple(f"remembered {n}" for n in _LENGTHS) + ("resumed", "edited", "recorded")
                 + tuple(f"own {n}" for n in _LENGTHS))
_OWN_START = BUCKET_LABELS.index("own 1")
_RESUMED, _EDITED, _RECORDED = (BUCKET_LABELS.index(label) for label in ("resumed", "edited", "recorded"))
# A generation starts this text's buckets from these: matches of 9-16 and 17+ tokens hold 0.92 and 0.97 of the time
# on the bench's recorded answers (the estimates said 0.75 and 0.82); priors of 0.65 and 0.75 there kept a fresh copy
# in calls of one or two nodes. Replayed (tools/replay.py, 45 prompts, four machines' costs), 0.75 and 0.85 gained
# 0.1-2.0% on each table, new code and prose unchanged; 0.8 and 0.9 no more.
_PRIORS = (0.15, 0.25, 0.35, 0.45, 0.55, 0.75, 0.85)
# A substitution made once is made again at its next use about two times in five: replaying the bench's 69 recorded
# answers, 6 of 15 first uses were made, 8 made in part or not at all, one undone (the old tokens written).
PRIOR_WEIGHT = 4.0      # the prior counts as this many observations
DECAY = 0.995
KAPPA = 1.0             # pseudo-occurrences of an unseen continuation behind every raw estimate
SINGLE = 1.0 / (1.0 + KAPPA)   # raw estimate of a token seen after one occurrence
# Beyond a match of this many tokens, more occurrences that agree are no surer than one. On the bench's 77 recorded
# greedy answers (tools/memory_calibration.py --answers), nodes backed by two occurrences were accepted 0.40 / 0.62 /
# 0.61 / 0.65 / 0.50 of the time at matches of 2 / 3 / 4 / 5-8 / 9-16 tokens against 0.45 / 0.57 / 0.69 / 0.87 / 0.93
# for one; sampled at T 0.7, such nodes at 9-16 tokens held 0.73 of the time where they were judged at 0.92 (one
# occurrence's: 0.90 at 0.91), and 15-node drafts begun at a match of 6 emitted 5 tokens where 11.5 were predicted.
AGREEMENT_MATCH = 3
# A recorded probability is the acceptance itself after the same context: its bucket's calibration starts at 1
PRIOR_RATE = _PRIORS + _PRIORS + (0.55, 0.4, SINGLE) + _PRIORS
THIS_TEXT = tuple(range(len(BUCKET_STARTS))) + (_RESUMED, _EDITED) + tuple(range(_OWN_START, len(BUCKET_LABELS)))
MAX_PROB = 0.98         # no memory guess is certain


def confidence(occurrences: int, stats_key: int) -> float:
    """The shrinkage behind a raw estimate when ``occurrences`` continuations of the parent go on:
    ``n / (n + KAPPA)``, or one occurrence's at a match longer than ``AGREEMENT_MATCH`` tokens (in the text at hand
    or a remembered one)."""
    match = stats_key - OWN if stats_key > OWN else stats_key if stats_key > EDITED else \
        -1 - stats_key if RECORDED < stats_key < RESUMED else 0
    return SINGLE if match > AGREEMENT_MATCH else occurrences / (occurrences + KAPPA)


def key(match: int, remembered: bool = False, own: bool = False) -> int:
    """The statistics key of a node with ``match`` tokens of agreement behind it: the length itself in the text at
    hand's prompt, ``OWN + match`` in the answer being written (``own``), ``-1 - match`` (below ``RESUMED``) in a
    remembered text (lengths below 1 count as 1)."""
    return -1 - max(match, 1) if remembered else max(match, 1) + (OWN if own else 0)


def bucket(stats_key: int) -> int:
    """Index of the bucket of a statistics key (:func:`key`, ``RESUMED``, ``EDITED`` or ``RECORDED``)."""
    if stats_key == EDITED:
        return _EDITED
    if stats_key == RESUMED:
        return _RESUMED
    if stats_key == RECORDED:
        return _RECORDED
    if stats_key > OWN:
        return _OWN_START + bisect_right(BUCKET_STARTS, stats_key - OWN) - 1
    if stats_key < RESUMED:
        return len(BUCKET_STARTS) + bisect_right(BUCKET_STARTS, -1 - stats_key) - 1
    return bisect_right(BUCKET_STARTS, max(stats_key, 1)) - 1


def shorter_copies(b: int) -> range:
    """The buckets of the same kind of text as bucket ``b`` (the text at hand's prompt, the answer being written, or a
    remembered text) from matches of two tokens up to just below ``b``'s; for the ``RESUMED`` and ``EDITED`` buckets,
    all of the prompt's from two tokens up (a copy that resumes is a copy of what the answer was given)."""
    n = len(BUCKET_STARTS)
    if b in (_RESUMED, _EDITED):
        return range(1, n)
    if b >= _OWN_START:
        return range(_OWN_START + 1, b)
    return range(n + 1, b) if b >= n else range(1, b)


def highest(stats_key: int) -> float:
    """The most a node of this key may be judged: ``MAX_PROB``, or certainty for a recorded probability, which after
    the same context is the acceptance itself (a greedy answer regenerated is accepted whole; kept below certainty,
    it was drafted 15 nodes a call on a Zen 4, where 64 nodes cost 25 plain steps)."""
    return 1.0 if stats_key == RECORDED else MAX_PROB


def calibrated(scale: float, raw: float, stats_key: int) -> float:
    """A raw estimate times its bucket's calibration, kept below :func:`highest`."""
    return min(highest(stats_key), scale * raw)


def per_bucket() -> list[float]:
    """A zero for every bucket: the shape of every per-bucket count."""
    return [0.0] * len(BUCKET_LABELS)


@dataclass
class MemoryStats:
    """Per bucket: decayed counts of observed nodes, accepted nodes and the sum of their raw estimates. Methods take
    a node's statistics key (:func:`key`), which in the text at hand is its match length."""

    tested: list[float] = field(default_factory=per_bucket)
    accepted: list[float] = field(default_factory=per_bucket)
    predicted: list[float] = field(default_factory=per_bucket)

    def rate(self, match: int) -> float:
        """Smoothed share of memory-drafted tokens accepted at this match length."""
        b = bucket(match)
        return (self.accepted[b] + PRIOR_WEIGHT * PRIOR_RATE[b]) / (self.tested[b] + PRIOR_WEIGHT)

    def scale(self, match: int) -> float:
        """Accepted nodes per unit of raw estimate at this match length (the calibration factor)."""
        b = bucket(match)
        return (self.accepted[b] + PRIOR_WEIGHT * PRIOR_RATE[b]) / (self.predicted[b] + PRIOR_WEIGHT * SINGLE)

    def estimate(self, match: int, raw: float) -> float:
        """Calibrated probability that a node is accepted given its parent was."""
        return calibrated(self.scale(match), raw, match)

    def observe(self, match: int, accepted: bool, raw: float) -> None:
        b = bucket(match)
        self.tested[b] = self.tested[b] * DECAY + 1.0
        self.accepted[b] = self.accepted[b] * DECAY + float(accepted)
        self.predicted[b] = self.predicted[b] * DECAY + raw

    def forget_this_text(self) -> None:
        """Start the buckets of matches in the text at hand afresh (a new generation), keeping the remembered texts'
        (the module docstring)."""
        for b in THIS_TEXT:
            self.tested[b] = self.accepted[b] = self.predicted[b] = 0.0

    def copy(self) -> "MemoryStats":
        return MemoryStats(list(self.tested), list(self.accepted), list(self.predicted))

    def to_dict(self) -> dict:
        return {"tested": self.tested, "accepted": self.accepted, "predicted": self.predicted}

    @classmethod
    def from_dict(cls, data: dict) -> "MemoryStats":
        """Raises ValueError when ``data`` is not what :meth:`to_dict` writes. A file written before the ``RESUMED``,
        ``EDITED``, ``RECORDED``, remembered texts' or own answer's buckets existed gets them empty."""
        try:
            lists = [[float(v) for v in data[name]] for name in ("tested", "accepted", "predicted")]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"memory statistics are malformed: {exc}") from None
        n = len(BUCKET_STARTS)
        older = {n: lambda v: v + [0.0] * (n + 3), n + 1: lambda v: v[:n] + [0.0] * n + v[n:] + [0.0, 0.0],
                 2 * n + 1: lambda v: v + [0.0, 0.0], 2 * n + 2: lambda v: v + [0.0], 2 * n + 3: lambda v: v}
        lists = [older[len(v)](v) + [0.0] * n if len(v) in older else v for v in lists]
        if any(len(v) != len(BUCKET_LABELS) or not all(math.isfinite(x) and x >= 0 for x in v) for v in lists):
            raise ValueError("memory statistics have the wrong number of buckets or negative counts")
        return cls(*lists)
