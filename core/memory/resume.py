"""Drafting across an edit: when the text stops matching what it was copying, guess where the copy resumes.

An edit copies its source with small changes: a renamed identifier, an inserted annotation, a dropped line. At the
change the suffix match breaks (the newest tokens occur nowhere before) and a suffix index has nothing to offer until
a few tokens agree again, so every token of ``bar(x):`` after a rename of ``foo`` is decoded plainly although the
source says what follows. The :class:`CopyAnchor` remembers where the copy was when a match was last long; after a
gap of ``n`` new tokens the copy most likely resumes ``n`` source tokens on (a substitution of as many tokens), else a
token or two sooner or later (the new name tokenises differently), or where it stopped (an insertion). Each guess is
one row of continuations weighted by how likely its shift is; :func:`core.memory.proposal.best_first` merges the
rows into a tree, and memory's statistics learn in a bucket of their own (``RESUMED``) how often a guess is right.
When the copy is found again, the anchor says what the edit was (core.memory.substitutions applies it again), and
from then on it follows the copy through the edits learnt (:meth:`CopyAnchor.through`).

The source is the live text itself (an edit of given code, a follow-up changing an earlier answer) or a remembered
one (a regenerated answer copying the earlier answer, which is not in the context): the same edits break both.
"""
from __future__ import annotations

import numpy as np

from core.memory.index import SEP, CorpusIndex, LiveIndex
from core.memory.substitutions import MAX_TOKENS, Substitutions

ANCHOR_MATCH = 4        # a match this long is a copy worth following
MAX_GAP = 8             # new tokens after which where the copy resumes is no longer guessed
# ... and after which the anchor is dropped: an edit found again later would be longer than a substitution
MAX_KEPT_GAP = MAX_TOKENS + ANCHOR_MATCH
SHIFT_WEIGHTS = {0: 1.0, -1: 0.5, 1: 0.5, -2: 0.25, 2: 0.25}   # source tokens skipped minus tokens written
INSERTION_WEIGHT = 0.5  # the copy resumes where it stopped: the new tokens were inserted


class CopyAnchor:
    """Where the live text last copied a source: ``(n, source)``, context token ``n - 1`` being a copy of source token
    ``source``, with ``agreed`` tokens of agreement behind it (edits it learnt counted). The source is the live text
    itself, or, for an anchor made ``remembered``, the remembered texts (:attr:`index`) its last match was found in."""

    def __init__(self, remembered: bool = False) -> None:
        self.remembered = remembered
        self.index: CorpusIndex | None = None   # a remembered anchor's source
        self.at: tuple[int, int] | None = None
        self.agreed = 0
        self.edited = False     # the copy went through a learnt edit since the suffix match last anchored it

    def _source(self, tokens: np.ndarray) -> tuple[np.ndarray, int]:
        """The source text, and where a copy in it must stop: the live text's copy of itself stays before the
        anchor, a remembered one ends at its document's end (a separator, which no token equals)."""
        if self.remembered:
            return self.index.text, len(self.index.text)
        return tokens, self.at[0]

    def source(self, live: LiveIndex) -> LiveIndex | CorpusIndex:
        """The index whose ``continuations`` read the source after the positions :meth:`resumptions` and
        :meth:`through` give."""
        return self.index if self.remembered else live

    def through(self, live: LiveIndex, substitutions: Substitutions) -> tuple[int, int] | None:
        """``(agreed, source)`` when the text since the anchor copies its source up to the last token with the edits
        learnt so far made, at least one of them: the copy goes on after source token ``source``, ``agreed`` tokens
        of agreement behind it. The anchor moves there. None otherwise (the copy broke off, or nothing was
        substituted: the plain suffix match sees that copy itself).

        A rename breaks the suffix match at every use of the new name, and after it the longest match is often the
        new name's first use in the answer (``calculateTotal(prices, taxRate)``), not the source line being copied
        (``calc(arr, 0.2)``): the copy, followed through its edits, is the longer agreement."""
        if self.at is None or not len(substitutions):
            return None
        tokens = live.tokens()
        n, source = self.at
        text, bound = self._source(tokens)
        i, j, made = n, source + 1, self.edited
        while i < len(tokens):
            if j < bound and tokens[i] == text[j]:
                i, j = i + 1, j + 1
                continue
            edit = substitutions.made_at(tokens, i, text, j)
            if edit is None or j + edit[0] > bound:
                return None
            j, i, made = j + edit[0], i + edit[1], True
        if not made or i != len(tokens) or j >= len(text) - 1:
            return None
        self.agreed += len(tokens) - n
        self.at, self.edited = (len(tokens), j - 1), True
        return self.agreed, j - 1

    def follow(self, live: LiveIndex, match: int, ends: np.ndarray,
               index: CorpusIndex | None = None) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """After a lookup: a match of ``ANCHOR_MATCH`` tokens or more re-anchors at one of its occurrences ``ends``
        (in the live text, or for a remembered anchor in the remembered texts' ``index``): the one nearest to where
        the anchored copy would be had it copied every token written since, else (no anchor, or a tie) the latest. A
        line that repeats in the source (``x = 0`` twice) must not be taken for the copy resuming further on: the edit
        would then swallow the source between them.

        Returns the edit this closes, ``(old, new)``: where the anchored copy broke off, the source's tokens up to
        where the copy resumed and the tokens written instead; None when the copy did not break, resumed elsewhere
        or did not skip any source token (an insertion).
        """
        if match < ANCHOR_MATCH or not len(ends):
            return None
        if self.remembered and index is not self.index:
            self.index, self.at = index, None       # the memory changed: positions in the old one mean nothing
        n = len(live)
        if self.at is None:
            source = int(ends[-1])
        else:
            expected = self.at[1] + n - self.at[0]
            source = int(ends[::-1][np.argmin(np.abs(ends[::-1] - expected))])     # a tie: the latest
        edit = self._closed_edit(live.tokens(), n, source, match) if self.at is not None else None
        self.at, self.agreed, self.edited = (n, source), match, False
        return edit

    def _closed_edit(self, tokens: np.ndarray, n: int, source: int, match: int):
        at, copied = self.at
        text, _ = self._source(tokens)
        agreed = _agreed(tokens, at, text, copied + 1, n - at)
        broke, skipped = at + agreed, copied + 1 + agreed      # first token written / source token not copied
        resumed, resumed_source = n - match, source - match + 1
        if broke >= n or resumed < broke or resumed_source <= skipped:
            return None
        return tuple(text[skipped:resumed_source].tolist()), tuple(tokens[broke:resumed].tolist())

    def resumptions(self, live: LiveIndex) -> tuple[np.ndarray, np.ndarray]:
        """(ends, weights): the source positions after which the copy may resume (:meth:`source` reads them),
        and each guess's weight; empty when there is no anchor or the gap grew too long to guess.

        The anchor outlives the guesses: ``raise ValueError("Invalid port number")`` written for ``return None`` is
        seven new tokens, and the copy is found again only once ``ANCHOR_MATCH`` more agree, so an anchor dropped
        after ``MAX_GAP`` would never learn that edit."""
        none = np.zeros(0, np.int64), np.zeros(0)
        if self.at is None:
            return none
        n, source = self.at
        tokens = live.tokens()
        text, _ = self._source(tokens)
        agreed = _agreed(tokens, n, text, source + 1, len(tokens) - n)
        gap = len(tokens) - n - agreed
        if gap > MAX_KEPT_GAP:
            self.at = None
        if gap > MAX_GAP:
            return none
        stopped = source + agreed          # the last source token copied
        guesses: dict[int, float] = {}
        for shift, weight in SHIFT_WEIGHTS.items():
            skip = gap + shift
            if skip >= 0:
                guesses[stopped + skip] = guesses.get(stopped + skip, 0.0) + weight
        guesses[stopped] = max(guesses.get(stopped, 0.0), INSERTION_WEIGHT)   # already a guess after one new token
        ends = [e for e in guesses if e < len(text) - 1 and text[e + 1] != SEP]   # the resumed token must exist
        return np.asarray(ends, np.int64), np.asarray([guesses[e] for e in ends])


def _agreed(tokens: np.ndarray, at: int, text: np.ndarray, source: int, limit: int) -> int:
    """How many tokens from ``tokens[at]`` on repeat those from ``text[source]`` on (at most ``limit``)."""
    width = min(limit, len(text) - source, len(tokens) - at)
    if width <= 0:
        return 0
    differ = np.flatnonzero(tokens[at:at + width] != text[source:source + width])
    return int(differ[0]) if len(differ) else width
