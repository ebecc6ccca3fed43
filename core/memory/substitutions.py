"""Edits that repeat: a substitution seen once where a copy broke off is applied where the copy meets it again.

A rename changes every use of a name, so an edit that copies its source breaks off at each of them: the copy drafts
the old name, the target writes the new one, and the copy is found again a few tokens on (core.memory.resume). When
such a break closes (the text copies the same source again a few tokens later), the tokens the source had there
(``old``) and the ones written instead (``new``) are a substitution; from then on the copy's continuations carry
``new`` wherever the source has ``old``, so one draft runs through the next use of the new name.

A substitution is forgotten as soon as the text, having followed a continuation that carries it up to it, writes
something else there: the old tokens (a rename in one function only) or others (values that change from line to line,
which look like a substitution once and never again). Substitutions are drafts like any other: the target verifies
every token, so a wrong one costs a rejected node, never a wrong output.
"""
from __future__ import annotations

import numpy as np

from core.memory.index import SEP

MAX_TOKENS = 8          # the longest ``old`` or ``new`` learnt: longer changes are rewrites, not substitutions
MAX_KEPT = 16           # substitutions kept, the latest learnt


class Substitutions:
    """The substitutions learnt in one text: ``old`` tokens -> ``new`` tokens, each with where it was learnt."""

    def __init__(self) -> None:
        self._new: dict[tuple[int, ...], tuple[int, ...]] = {}
        # continuations that carried a substitution: (context length, tokens up to and including its new, old)
        self._checks: list[tuple[int, tuple[int, ...], tuple[int, ...]]] = []

    def __len__(self) -> int:
        return len(self._new)

    def __contains__(self, old: tuple[int, ...]) -> bool:
        return tuple(old) in self._new

    @property
    def widest(self) -> int:
        """How many more tokens than ``old`` a substitution may need from the source (for a shorter ``new``)."""
        return max([0] + [len(old) - len(new) for old, new in self._new.items()])

    def learn(self, old: tuple[int, ...], new: tuple[int, ...]) -> None:
        """Remember that the text wrote ``new`` where its source had ``old``: the tokens that differ, each run of them
        apart where both have as many tokens (``(item), []).append(item`` written ``(record), []).append(record`` is
        ``(item`` -> ``(record`` twice, which then also applies in ``key(item)``). A deletion (nothing written) or a
        change longer than ``MAX_TOKENS`` is not one."""
        while old and new and old[-1] == new[-1]:
            old, new = old[:-1], new[:-1]
        if old and len(old) == len(new):
            differ = [i for i in range(len(old)) if old[i] != new[i]]
            runs = [[differ[0]]]
            for i in differ[1:]:
                if i == runs[-1][-1] + 1:
                    runs[-1].append(i)
                else:
                    runs.append([i])
            if len(runs) > 1:
                for run in runs:
                    self.learn(old[run[0]:run[-1] + 1], new[run[0]:run[-1] + 1])
                return
        if not old or not new or old == new or len(old) > MAX_TOKENS or len(new) > MAX_TOKENS:
            return
        self._new.pop(old, None)     # re-learnt: the latest
        self._new[old] = new
        while len(self._new) > MAX_KEPT:
            del self._new[next(iter(self._new))]

    def check(self, tokens: np.ndarray) -> None:
        """Judge the substitutions the last continuations carried by what the text ``tokens`` then wrote: one that
        the text reached and did not write is forgotten. Checks the text has not reached yet are dropped (the next
        continuations carry them again)."""
        for at, expected, old in self._checks:
            if old not in self._new or len(tokens) < at + len(expected):
                continue
            written = tokens[at:at + len(expected)].tolist()
            lead = len(expected) - len(self._new[old])
            if written[:lead] == list(expected[:lead]) and written[lead:] != list(expected[lead:]):
                del self._new[old]
        self._checks.clear()

    def made_at(self, tokens: np.ndarray, written: int, source: int) -> tuple[int, int] | None:
        """``(len(old), len(new))`` of a learnt substitution whose ``old`` starts at ``tokens[source]`` and whose
        ``new`` was written at ``tokens[written]`` (the longest such ``old``); None when none was made there."""
        for old, new in sorted(self._new.items(), key=lambda item: len(item[0]), reverse=True):
            if (tuple(tokens[source:source + len(old)].tolist()) == old
                    and tuple(tokens[written:written + len(new)].tolist()) == new):
                return len(old), len(new)
        return None

    def applied(self, rows: np.ndarray, depth: int, at: int, guessed: bool = False) -> np.ndarray:
        """``rows`` (continuations after a context of ``at`` tokens, ``SEP`` where the text ended) with every learnt
        ``old`` written as its ``new``, cut to ``depth`` tokens. Only rows holding the first token of some ``old``
        are rewritten; each rewritten row's first substitution is checked at the next :meth:`check`, unless the rows
        are ``guessed`` (where a copy may resume) and it is the row's first token: a guess the text did not take
        says nothing about the substitution."""
        if not self._new or not len(rows):
            return rows[:, :depth]
        firsts = np.fromiter({old[0] for old in self._new}, np.int64)
        olds = sorted(self._new, key=len, reverse=True)     # the longest ``old`` that fits wins
        out = rows[:, :depth].copy()
        for i in np.flatnonzero(np.isin(rows, firsts).any(axis=1)):
            row, first = self._rewrite(rows[i].tolist(), olds)
            if first is not None and not (guessed and first[0] == 0):
                self._checks.append((at, tuple(row[:first[0] + len(self._new[first[1]])]), first[1]))
            row = row[:depth]
            out[i] = row + [SEP] * (depth - len(row))
        return out

    def _rewrite(self, row: list[int],
                 olds: list[tuple[int, ...]]) -> tuple[list[int], tuple[int, tuple[int, ...]] | None]:
        """The row rewritten with the first of ``olds`` that fits at each token, and where its first substitution
        starts in it and which ``old`` it replaced."""
        out: list[int] = []
        first = None
        k = 0
        while k < len(row) and row[k] != SEP:
            old = next((o for o in olds if tuple(row[k:k + len(o)]) == o), None)
            if old is None:
                out.append(row[k])
                k += 1
            else:
                first = first or (len(out), old)
                out.extend(self._new[old])
                k += len(old)
        return out, first
