"""Suffix indexes over token sequences: where did the context's last ``m`` tokens occur before, for the largest ``m``?

Both indexes answer with the end positions of those occurrences; the tokens after them are candidate continuations.

* :class:`CorpusIndex`, over remembered documents, is a suffix array of the text read *backwards*: every position,
  sorted by the (up to ``MAX_MATCH``) tokens ending there, newest token first. The positions whose backward text
  starts with the context's last ``k`` tokens (reversed) are one contiguous range, and matching one more token narrows
  that range by a binary search, so the longest match costs ``O(m log n)`` probes whatever the corpus size. A new
  document is binary-searched into the order (no rebuild); the order only looks ``MAX_MATCH`` tokens back, so ties
  beyond that are broken by position.
* :class:`LiveIndex`, over the context being written, grows by a few tokens every step: it keeps the positions of
  every pair of consecutive tokens in lists and compares the candidates' preceding tokens with the context's in numpy
  gathers.

Text layout: documents are separated by ``SEP`` (``[SEP, doc0..., SEP, doc1..., SEP]``), so reading backwards or
forwards stops at a document's edge, and an occurrence never spans two documents.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

SEP = -1            # document separator; lower than every token, so texts that end sort first
MAX_MATCH = 64      # the longest match looked for (and how far back the corpus order looks)
LIVE_CANDIDATES = 1024   # most recent occurrences of the last two tokens compared in the live context
AGREEMENT_STAGES = (4, 16, MAX_MATCH)   # widths at which many candidates are compared (most fail early) ...
FEW_CANDIDATES = 64                     # ... and up to how many are compared at once instead
REBUILD_SHARE = 32  # a document adding more than 1/REBUILD_SHARE of the indexed positions is sorted in afresh


def recorded_bytes(probs: Sequence[float]) -> np.ndarray:
    """Probabilities kept in a byte each: ``round(255 p)``, at least 1 (a drawn token had some probability), so that
    0 means "not recorded". Steps of 0.004 are finer than any estimate needs."""
    return np.clip(np.rint(np.asarray(probs, np.float64) * 255.0), 1, 255).astype(np.uint8)


def _leading_true(eq: np.ndarray) -> np.ndarray:
    """Per row, how many columns agree before the first disagreement."""
    return np.where(eq.all(axis=1), eq.shape[1], eq.argmin(axis=1))


def _agreement(text: np.ndarray, ends: np.ndarray, suffix: np.ndarray) -> np.ndarray:
    """For each end, how many tokens read backwards from it agree with ``suffix`` (newest first).

    Many candidates are compared in widening stages, dropping those that already disagree (most fail within a few
    tokens); a few are compared at once. A separator never equals a token, so a match stops at a document's edge;
    ``text[0]`` must be a separator.
    """
    lengths = np.zeros(len(ends), np.int64)
    alive = np.arange(len(ends))
    done = 0
    for width in AGREEMENT_STAGES if len(ends) > FEW_CANDIDATES else (MAX_MATCH,):
        width = min(width, len(suffix))
        if width <= done or not len(alive):
            break
        rows = np.maximum(ends[alive, None] - np.arange(done, width), 0)
        agree = _leading_true(text[rows] == suffix[done:width])
        lengths[alive] = done + agree
        alive = alive[agree == width - done]
        done = width
    return lengths


def _backward(text: np.ndarray, ends: np.ndarray, width: int) -> np.ndarray:
    """``text[end], text[end-1], ...`` for ``width`` tokens per end, ``SEP`` from a document's start on."""
    rows = np.clip(ends[:, None].astype(np.int64) - np.arange(width), 0, None)
    out = text[rows]
    out[np.logical_or.accumulate(out == SEP, axis=1)] = SEP
    return out


def _forward(text: np.ndarray, ends: np.ndarray, depth: int) -> np.ndarray:
    """The ``depth`` tokens after each end position (int64), ``SEP`` from a document's end on."""
    rows = np.clip(ends[:, None].astype(np.int64) + 1 + np.arange(depth), None, len(text) - 1)
    out = text[rows].astype(np.int64)
    out[np.logical_or.accumulate(out == SEP, axis=1)] = SEP
    return out


def _sorted_ends(text: np.ndarray) -> np.ndarray:
    """Every position with a token after it, sorted by its backward text (``MAX_MATCH`` tokens), then position.

    Prefix doubling: ``rank_h`` orders positions by their first ``h`` backward tokens; ``rank_2h`` is the rank of the
    pair (``rank_h[i]``, ``rank_h[i - h]``), the second part being 0 when the text already ended within ``h`` tokens.
    Separators keep rank 0 throughout, below every token.
    """
    n = len(text)
    sep = text == SEP
    pos = np.arange(n)
    since_sep = pos - np.maximum.accumulate(np.where(sep, pos, 0))   # tokens back to the separator (0 on it)
    rank = np.where(sep, 0, text.astype(np.int64) + 1)
    h = 1
    while h < MAX_MATCH:
        prev = np.zeros(n, np.int64)
        reach = since_sep[h:] >= h
        prev[h:][reach] = rank[:-h][reach]
        distinct, rank = np.unique(rank * (int(rank.max()) + 1) + prev, return_inverse=True)
        rank = rank.reshape(-1)
        h *= 2
        if len(distinct) == n - int(sep.sum()) + 1:   # every position already told apart
            break
    ends = np.flatnonzero(~sep[:-1] & ~sep[1:])
    return ends[np.argsort(rank[ends], kind="stable")].astype(np.int32)


def _compare(text: np.ndarray, a: np.ndarray, a_keys: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Sign of (backward text, position) of ends ``a`` (keys given) against ends ``b``; the order of the index."""
    b_keys = _backward(text, b, MAX_MATCH)
    differ = a_keys != b_keys
    first = differ.argmax(axis=1)
    rows = np.arange(len(a))
    sign = np.sign(a_keys[rows, first].astype(np.int64) - b_keys[rows, first])
    return np.where(differ.any(axis=1), sign, np.sign(a.astype(np.int64) - b))


def _inserted(text: np.ndarray, order: np.ndarray, new: np.ndarray) -> np.ndarray:
    """``order`` with the ends ``new`` placed where they belong: one vectorised binary search for all of them."""
    keys = _backward(text, new, MAX_MATCH)
    own = np.lexsort([new] + [keys[:, j] for j in range(MAX_MATCH - 1, -1, -1)])
    new, keys = new[own], keys[own]
    lo = np.zeros(len(new), np.int64)
    hi = np.full(len(new), len(order), np.int64)
    while True:
        active = lo < hi
        if not active.any():
            break
        mid = np.minimum((lo + hi) // 2, len(order) - 1)
        after = _compare(text, new, keys, order[mid]) > 0
        lo = np.where(active & after, mid + 1, lo)
        hi = np.where(active & ~after, mid, hi)
    return np.insert(order, lo, new).astype(np.int32)


@dataclass(frozen=True)
class CorpusIndex:
    """Remembered documents and their backward suffix array, and beside the text, the probability each token was
    drawn with where it was recorded (:func:`recorded_bytes`; 0: not recorded). Immutable: every change returns a new
    index, so a reader holding one (a drafting step, a snapshot) is never disturbed."""

    text: np.ndarray = field(default_factory=lambda: np.array([SEP], np.int32))
    order: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    starts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))   # first position of each document
    probs: np.ndarray | None = None     # uint8 beside ``text``; None: nothing recorded

    def __post_init__(self) -> None:
        if self.probs is None:
            object.__setattr__(self, "probs", np.zeros(len(self.text), np.uint8))
        # plain-int views: the binary search probes a few dozen entries per token matched, and a memoryview gives
        # Python ints several times faster than numpy scalar indexing (numpy calls cost more than the whole search)
        object.__setattr__(self, "_text_mv", memoryview(self.text))
        object.__setattr__(self, "_order_mv", memoryview(self.order))

    @classmethod
    def built(cls, documents: Sequence[np.ndarray]) -> "CorpusIndex":
        parts = [np.array([SEP], np.int32)]
        starts = []
        at = 1
        for doc in documents:
            parts += [np.asarray(doc, np.int32), np.array([SEP], np.int32)]
            starts.append(at)
            at += len(doc) + 1
        text = np.concatenate(parts)
        return cls(text, _sorted_ends(text), np.array(starts, np.int64))

    def document(self, i: int) -> np.ndarray:
        end = self.starts[i + 1] - 1 if i + 1 < len(self.starts) else len(self.text) - 1
        return self.text[self.starts[i]:end]

    def appended(self, doc: np.ndarray, probs: np.ndarray | None = None) -> "CorpusIndex":
        """A new index with ``doc`` as the last document, with ``probs`` (:func:`recorded_bytes`) beside it."""
        start = len(self.text)
        text = np.concatenate([self.text, np.asarray(doc, np.int32), np.array([SEP], np.int32)])
        kept = np.concatenate([self.probs, probs if probs is not None else np.zeros(len(doc), np.uint8),
                               np.zeros(1, np.uint8)])
        starts = np.append(self.starts, start)
        new = np.arange(start, start + len(doc) - 1, dtype=np.int32)   # the last token has no continuation
        if len(new) * REBUILD_SHARE > len(self.order):
            return CorpusIndex(text, _sorted_ends(text), starts, kept)
        return CorpusIndex(text, _inserted(text, self.order, new) if len(new) else self.order, starts, kept)

    def without(self, drop: Sequence[int]) -> "CorpusIndex":
        """A new index without the documents ``drop`` (indices); the others keep their order."""
        lengths = np.diff(np.append(self.starts, len(self.text)))   # each document plus its separator
        gone = np.zeros(len(self.text), bool)
        for i in drop:
            gone[self.starts[i]:self.starts[i] + lengths[i]] = True
        shift = np.cumsum(gone)
        keep_docs = np.setdiff1d(np.arange(len(self.starts)), np.asarray(drop, np.int64))
        order = self.order[~gone[self.order]]
        return CorpusIndex(self.text[~gone], (order - shift[order]).astype(np.int32),
                           self.starts[keep_docs] - shift[self.starts[keep_docs]], self.probs[~gone])

    def document_of(self, ends: np.ndarray) -> np.ndarray:
        """Index of the document holding each position."""
        return np.searchsorted(self.starts, ends, side="right") - 1

    def continuations(self, ends: np.ndarray, depth: int) -> np.ndarray:
        return _forward(self.text, ends, depth)

    def recorded(self, ends: np.ndarray, depth: int) -> np.ndarray:
        """The recorded probability of each token of :meth:`continuations` (float64; 0 where none was recorded, and
        from a document's end on)."""
        rows = np.clip(ends[:, None].astype(np.int64) + 1 + np.arange(depth), None, len(self.text) - 1)
        out = self.probs[rows] / 255.0
        out[np.logical_or.accumulate(self.text[rows] == SEP, axis=1)] = 0.0
        return out

    def longest(self, suffix: Sequence[int]) -> tuple[int, np.ndarray]:
        """(m, ends): the longest ``m`` such that ``suffix[:m]`` (the context's last tokens, newest first) occurs
        backwards from some position, and every such position. ``(0, [])`` when not even the newest token occurs.
        At most ``MAX_MATCH`` tokens are matched: the order looks no further back."""
        text, order = self._text_mv, self._order_mv
        lo, hi = 0, len(self.order)
        for k, t in enumerate(suffix[:MAX_MATCH]):
            a, b = lo, hi
            while a < b:                      # first entry whose k-th backward token is >= t
                mid = (a + b) >> 1
                if text[order[mid] - k] < t:
                    a = mid + 1
                else:
                    b = mid
            c, b = a, hi
            while c < b:                      # first entry whose k-th backward token is > t
                mid = (c + b) >> 1
                if text[order[mid] - k] <= t:
                    c = mid + 1
                else:
                    b = mid
            if a == c:
                return k, self.order[lo:hi] if k else self.order[:0]
            lo, hi = a, c
        m = min(len(suffix), MAX_MATCH)
        return (m, self.order[lo:hi]) if m else (0, self.order[:0])


class LiveIndex:
    """The context being generated, indexed by its last two tokens (and by last token); grows by appending.

    Token ``i`` is stored at ``buffer[i + 1]``: ``buffer[0]`` and everything past the end are ``SEP``, so gathers
    before the start or past the end read a separator instead of failing.
    """

    def __init__(self, tokens: Sequence[int] = ()) -> None:
        self._reset(tokens)

    def _reset(self, tokens: Sequence[int]) -> None:
        self._buffer = np.full(256, SEP, np.int32)
        self._n = 0
        self._after: dict[int, list[int]] = {}               # token -> positions
        self._pairs: dict[tuple[int, int], list[int]] = {}   # (previous token, token) -> positions of the token
        self.extend(tokens)

    def __len__(self) -> int:
        return self._n

    def extend(self, tokens: Sequence[int]) -> None:
        need = self._n + len(tokens) + 2
        if need > len(self._buffer):
            grown = np.full(max(need, 2 * len(self._buffer)), SEP, np.int32)
            grown[:self._n + 1] = self._buffer[:self._n + 1]
            self._buffer = grown
        self._buffer[self._n + 1:self._n + 1 + len(tokens)] = tokens
        prev = int(self._buffer[self._n]) if self._n else SEP
        for i, t in enumerate(tokens, self._n):
            t = int(t)
            self._after.setdefault(t, []).append(i)
            if prev != SEP:
                self._pairs.setdefault((prev, t), []).append(i)
            prev = t
        self._n += len(tokens)

    def sync(self, tokens: Sequence[int]) -> None:
        """Catch up with ``tokens``, the whole context. A context that is not a continuation of the indexed one (its
        first or last indexed token differs, or it is shorter) is indexed afresh."""
        n = self._n
        if n and (len(tokens) < n or tokens[0] != self._buffer[1] or tokens[n - 1] != self._buffer[n]):
            self._reset(tokens)
        elif len(tokens) > n:
            self.extend(tokens[n:])

    def tokens(self) -> np.ndarray:
        """The context indexed (a view: valid until the next change)."""
        return self._buffer[1:self._n + 1]

    def suffix(self, width: int = MAX_MATCH) -> list[int]:
        """The last ``width`` tokens, newest first."""
        return self._buffer[max(self._n - width, 0) + 1:self._n + 1][::-1].tolist()

    def longest(self) -> tuple[int, np.ndarray]:
        """(m, ends): the longest match of the context's suffix ending before its last token, and those ends."""
        n = self._n
        if n < 2:
            return 0, np.zeros(0, np.int64)
        last, prev = int(self._buffer[n]), int(self._buffer[n - 1])
        # the last entry of each list is the context's own end
        pairs = self._pairs[(prev, last)][-LIVE_CANDIDATES - 1:-1]
        if not pairs:
            singles = self._after[last][-LIVE_CANDIDATES - 1:-1]
            return (1, np.asarray(singles, np.int64)) if singles else (0, np.zeros(0, np.int64))
        ends = np.asarray(pairs, np.int64)
        own = self._buffer[n - np.arange(min(MAX_MATCH, n - 1))]
        lengths = _agreement(self._buffer, ends + 1, own)
        m = int(lengths.max())
        return m, ends[lengths == m]

    def continuations(self, ends: np.ndarray, depth: int) -> np.ndarray:
        return _forward(self._buffer, np.asarray(ends, np.int64) + 1, depth)
