"""Edits that repeat: a substitution seen once where a copy broke off is applied where the copy meets it again.

A rename changes every use of a name, so an edit that copies its source breaks off at each of them: the copy drafts
the old name, the target writes the new one, and the copy is found again a few tokens on (core.memory.resume). When
such a break closes (the text copies the same source again a few tokens later), the tokens the source had there
(``old``) and the ones written instead (``new``) are a substitution; from then on the copy's continuations carry
``new`` wherever the source has ``old``, so one draft runs through the next use of the new name.

When the text, having followed a continuation that carries a substitution up to it, writes something else there,
the substitution is judged by what it wrote. The old tokens (a rename in one function only): it is forgotten. Other
tokens: the edit is made each time but not the same way (``return None`` became ``raise ValueError("Invalid port
number")``, then ``raise ValueError("Port number out of range")``): what both wrote, ``raise ValueError("``, is kept
as an *open* substitution, after which a continuation ends, since the text there is new each time. Nothing in common
(values that change from line to line) leaves an open substitution of no tokens: continuations end before the old
ones, where the copy breaks off every time, instead of drafting them to be rejected. Substitutions are drafts like
any other: the target verifies every token, so a wrong one costs a rejected node, never a wrong output.
"""
from __future__ import annotations

import numpy as np

from core.memory.index import SEP

MAX_TOKENS = 8          # the longest ``old`` or ``new`` learnt: longer changes are rewrites, not substitutions
MAX_KEPT = 16           # substitutions kept, the latest learnt


class Substitutions:
    """The substitutions learnt in one text: ``old`` tokens -> ``new`` tokens, and which of them are open."""

    def __init__(self) -> None:
        self._new: dict[tuple[int, ...], tuple[int, ...]] = {}
        self._open: set[tuple[int, ...]] = set()       # olds whose ``new`` is what the text wrote first, then varied
        self._made: dict[tuple[int, ...], int] = {}    # old -> times the text was seen making it
        # continuations that carried a substitution: (context length, their tokens before it, its old)
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
        known = self._new.get(old)
        if known is not None and (new == known if old not in self._open else new[:len(known)] == known):
            self._made[old] += 1     # made again (an open one the way it varies: its start stays what is known)
            self._keep(old, known, old in self._open)
        else:
            self._keep(old, new, False)

    def _keep(self, old: tuple[int, ...], new: tuple[int, ...], open_: bool) -> None:
        made = self._made.get(old, 1)
        self._forget(old)            # learnt or made again: the latest, evicted last
        self._new[old], self._made[old] = new, made
        if open_:
            self._open.add(old)
        while len(self._new) > MAX_KEPT:
            self._forget(next(iter(self._new)))

    def _forget(self, old: tuple[int, ...]) -> None:
        self._new.pop(old, None)
        self._made.pop(old, None)
        self._open.discard(old)

    def proven(self, old: tuple[int, ...]) -> bool:
        """Whether the text made this substitution more than the once it was learnt from: a change made once may
        be an insertion the text never repeats (``):`` -> ``, encoding="utf-8"):`` in one function)."""
        return self._made.get(tuple(old), 0) > 1

    def check(self, tokens: np.ndarray) -> None:
        """Judge the substitutions the last continuations carried by what the text ``tokens`` then wrote where it
        followed them up to one (see the module's docstring), as soon as it wrote enough to tell. Checks the text
        has not decided yet are dropped (the next continuations carry them again)."""
        for at, lead, old in self._checks:
            new = self._new.get(old)
            start = at + len(lead)
            if new is None or tuple(tokens[at:start].tolist()) != lead:
                continue        # not reached, or the text left the continuation before it: no evidence
            written = tuple(tokens[start:start + max(len(new), len(old))].tolist())
            same = next((i for i, (w, t) in enumerate(zip(written, new)) if w != t), None)
            if same is None and new:
                self._made[old] += len(written) >= len(new)     # made (or, so far, being made)
                continue
            if written[:len(old)] == old:
                self._forget(old)
            elif same is not None and old[:len(written)] != written:
                self._keep(old, new[:same], True)
                self._made[old] += same > 0     # its start was made again
        self._checks.clear()

    def made_at(self, tokens: np.ndarray, written: int, text: np.ndarray, source: int) -> tuple[int, int] | None:
        """``(len(old), len(new))`` of a learnt substitution whose ``old`` starts at ``text[source]`` (the copy's
        source) and whose ``new`` was written at ``tokens[written]`` (the longest such ``old``); None when none was
        made there. An open substitution says only how such an edit starts, not where the copy goes on after it."""
        for old, new in sorted(self._new.items(), key=lambda item: len(item[0]), reverse=True):
            if old not in self._open and (tuple(text[source:source + len(old)].tolist()) == old
                    and tuple(tokens[written:written + len(new)].tolist()) == new):
                return len(old), len(new)
        return None

    def applied(self, rows: np.ndarray, depth: int, at: int, guessed: bool = False) -> np.ndarray:
        """``rows`` (continuations after a context of ``at`` tokens, ``SEP`` where the text ended) with every learnt
        ``old`` written as its ``new`` (and nothing after an open one), cut to ``depth`` tokens. Only rows holding the
        first token of some ``old`` are rewritten; each rewritten row's first substitution is checked at the next
        :meth:`check`, unless the rows are ``guessed`` (where a copy may resume) and it is the row's first token: a
        guess the text did not take says nothing about the substitution."""
        return self.edited(rows, depth, at, guessed)[0]

    def edited(self, rows: np.ndarray, depth: int, at: int,
               guessed: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        """:meth:`applied`'s rows, and where a substitution not yet :meth:`proven` starts its ``new`` in them (None:
        nowhere): a guess about the edit rather than a copy."""
        if not self._new or not len(rows):
            return rows[:, :depth], None
        firsts = np.fromiter({old[0] for old in self._new}, np.int64)
        olds = sorted(self._new, key=len, reverse=True)     # the longest ``old`` that fits wins
        out = rows[:, :depth].copy()
        starts = np.zeros(out.shape, bool)
        for i in np.flatnonzero(np.isin(rows, firsts).any(axis=1)):
            row, made = self._rewrite(rows[i].tolist(), olds)
            if made and not (guessed and made[0][0] == 0):
                self._checks.append((at, tuple(row[:made[0][0]]), made[0][1]))
            row = row[:depth]
            out[i] = row + [SEP] * (depth - len(row))
            starts[i, [k for k, old in made if k < depth and self._new[old] and not self.proven(old)]] = True
        return out, (starts if starts.any() else None)

    def _rewrite(self, row: list[int],
                 olds: list[tuple[int, ...]]) -> tuple[list[int], list[tuple[int, tuple[int, ...]]]]:
        """The row rewritten with the first of ``olds`` that fits at each token, up to an open one's ``new``, and
        where each substitution starts in it and which ``old`` it replaced."""
        out: list[int] = []
        made: list[tuple[int, tuple[int, ...]]] = []
        k = 0
        while k < len(row) and row[k] != SEP:
            old = next((o for o in olds if tuple(row[k:k + len(o)]) == o), None)
            if old is None:
                out.append(row[k])
                k += 1
            else:
                made.append((len(out), old))
                out.extend(self._new[old])
                if old in self._open:
                    break
                k += len(old)
        return out, made
