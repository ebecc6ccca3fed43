"""Drafting across an edit: when the text stops matching what it was copying, guess where the copy resumes.

An edit copies its source with small changes: a renamed identifier, an inserted annotation, a dropped line. At the
change the suffix match breaks (the newest tokens occur nowhere before) and a suffix index has nothing to offer until
a few tokens agree again, so every token of ``bar(x):`` after a rename of ``foo`` is decoded plainly although the
source says what follows. The :class:`CopyAnchor` remembers where the copy was when a match was last long; after a
gap of ``n`` new tokens the copy most likely resumes ``n`` source tokens on (a substitution of as many tokens), else a
token or two sooner or later (the new name tokenises differently), or where it stopped (an insertion). Each guess is
one row of continuations weighted by how likely its shift is; :func:`core.memory.proposal.best_first` merges the
rows into a tree, and memory's statistics learn in a bucket of their own (``RESUMED``) how often a guess is right.
"""
from __future__ import annotations

import numpy as np

from core.memory.index import LiveIndex

ANCHOR_MATCH = 4        # a match this long is a copy worth following
MAX_GAP = 8             # new tokens after which an edit is no longer a small change: the anchor is dropped
SHIFT_WEIGHTS = {0: 1.0, -1: 0.5, 1: 0.5, -2: 0.25, 2: 0.25}   # source tokens skipped minus tokens written
INSERTION_WEIGHT = 0.5  # the copy resumes where it stopped: the new tokens were inserted


class CopyAnchor:
    """Where the live text last copied an earlier part of itself: ``(n, source)``, context token ``n - 1`` being a
    copy of context token ``source``."""

    def __init__(self) -> None:
        self.at: tuple[int, int] | None = None

    def follow(self, n: int, match: int, ends: np.ndarray) -> None:
        """After a lookup in a context of ``n`` tokens: a match of ``ANCHOR_MATCH`` tokens or more re-anchors at its
        latest occurrence."""
        if match >= ANCHOR_MATCH and len(ends):
            self.at = (n, int(ends[-1]))

    def resumptions(self, live: LiveIndex) -> tuple[np.ndarray, np.ndarray]:
        """(ends, weights): the positions after which the copy may resume, as ``LiveIndex`` ends (the token before
        the resumed one), and each guess's weight; empty when there is no anchor or the gap grew too long."""
        none = np.zeros(0, np.int64), np.zeros(0)
        if self.at is None:
            return none
        n, source = self.at
        tokens = live.tokens()
        agreed = _agreed(tokens, n, source + 1, len(tokens) - n)
        gap = len(tokens) - n - agreed
        if gap > MAX_GAP:
            self.at = None
            return none
        stopped = source + agreed          # the last source token copied
        guesses: dict[int, float] = {}
        for shift, weight in SHIFT_WEIGHTS.items():
            skip = gap + shift
            if skip >= 0:
                guesses[stopped + skip] = guesses.get(stopped + skip, 0.0) + weight
        guesses[stopped] = max(guesses.get(stopped, 0.0), INSERTION_WEIGHT)   # already a guess after one new token
        ends = [e for e in guesses if e < len(tokens) - 1]   # the resumed token must exist
        return np.asarray(ends, np.int64), np.asarray([guesses[e] for e in ends])


def _agreed(tokens: np.ndarray, at: int, source: int, limit: int) -> int:
    """How many tokens from ``tokens[at]`` on repeat those from ``tokens[source]`` on (at most ``limit``)."""
    width = min(limit, len(tokens) - source)
    if width <= 0:
        return 0
    differ = np.flatnonzero(tokens[at:at + width] != tokens[source:source + width])
    return int(differ[0]) if len(differ) else width
