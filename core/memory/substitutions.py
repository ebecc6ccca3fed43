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

A rename is learnt on the tokens where the text first made it, and a name is spelt by other tokens elsewhere: ``p``
renamed ``price`` is learnt as `` p`` -> `` price``, and the copy then meets ``round(p``, whose ``(p`` is another
token, and drafts the old name in a long call that the target rejects at once. With the tokenizer's spelling
(core.memory.spelling), the names a learnt substitution renames are read from its text (both split into names and
single other characters, as many of each, differing only in names), and a token of the copy holding one of them as a
whole name is spelt anew with the new name (``(p`` -> ``(price``) and carried like a substitution of its own: a guess
until the text makes it (it was never made), dropped for good where the text writes the old token instead (``for p in
prices`` in another function keeps its own ``p``).
"""
from __future__ import annotations

import re

import numpy as np

from core.memory.index import SEP
from core.memory.spelling import Spelling

MAX_TOKENS = 8          # the longest ``old`` or ``new`` learnt: longer changes are rewrites, not substitutions
MAX_KEPT = 16           # substitutions kept, the latest learnt
MAX_RESPELT = 64        # tokens spelt anew with a learnt rename, at most
PARTS = re.compile(r"\w+|\W")      # a text as names (and numbers) and single other characters
WORD = re.compile(r"\w")


def renames(old: str, new: str) -> dict[tuple[bool, str], str]:
    """The names ``new`` renames in ``old`` (`` calc(p`` -> `` compute(price``: ``calc`` -> ``compute``, ``p`` ->
    ``price``), each keyed with whether it follows a ``.``: a variable ``items`` renamed says nothing of the method
    ``.items()``. Empty unless both split into as many names and other characters and differ only in names."""
    a, b = PARTS.findall(old), PARTS.findall(new)
    if len(a) != len(b):
        return {}
    pairs = [(i, x, y) for i, (x, y) in enumerate(zip(a, b)) if x != y]
    if not pairs or not all(x.isidentifier() and y.isidentifier() for _, x, y in pairs):
        return {}
    return {(attribute(a, i), x): y for i, x, y in pairs}


def attribute(parts: list[str], i: int) -> bool:
    """Whether ``parts[i]`` follows a ``.`` that is no spread (``...arr`` spreads the variable)."""
    return i > 0 and parts[i - 1] == "." and (i < 2 or parts[i - 2] != ".")


class Substitutions:
    """The substitutions learnt in one text: ``old`` tokens -> ``new`` tokens, and which of them are open."""

    def __init__(self, spelling: Spelling | None = None) -> None:
        self.spelling = spelling
        self._new: dict[tuple[int, ...], tuple[int, ...]] = {}
        self._open: set[tuple[int, ...]] = set()       # olds whose ``new`` is what the text wrote first, then varied
        self._made: dict[tuple[int, ...], int] = {}    # old -> times the text was seen making it
        # continuations that carried a substitution: (context length, their tokens before it, its old)
        self._checks: list[tuple[int, tuple[int, ...], tuple[int, ...]]] = []
        # tokens spelt anew with the renames learnt (old -> whether the name starts / ends the token's text),
        # every token asked (None: no rename in it), the renames they were spelt with, and tokens the text refused
        self._respelt: dict[tuple[int, ...], tuple[bool, bool]] = {}
        self._spelt: dict[int, tuple[int, ...] | None] = {}
        self._renames: dict[tuple[bool, str], str] = {}
        self._refused: set[int] = set()

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
        while len(self._new) - len(self._respelt) > MAX_KEPT:
            self._forget(next(o for o in self._new if o not in self._respelt))

    def _forget(self, old: tuple[int, ...], refused: bool = False) -> None:
        """``refused``: the text wrote the old tokens where a respelling of them was carried: never respelt again."""
        if refused and old in self._respelt:
            self._refused.add(old[0])
        self._respelt.pop(old, None)
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
            if written[:len(old)] == old or (old in self._respelt and old[:len(written)] != written):
                self._forget(old, refused=True)     # a respelling is a guess: any other text drops it
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
        self._respell(rows)
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
            if old in self._respelt and self._inside_name(old, out[-1] if out else None, row[k + 1:k + 2]):
                old = None
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

    def _respell(self, rows: np.ndarray) -> None:
        """Carry the renames the learnt substitutions make (the module's docstring) to the tokens of ``rows`` that
        hold a renamed name: each token is asked once for the renames learnt; when they change, afresh."""
        if self.spelling is None:
            return
        learnt = {}
        for old, new in self._new.items():
            if old not in self._respelt and old not in self._open:
                learnt.update(renames(self.spelling.texts(old), self.spelling.texts(new)))
        if learnt != self._renames:
            for old in list(self._respelt):
                self._forget(old)
            self._spelt.clear()
            self._renames = learnt
        if not learnt:
            return
        for token in np.unique(rows).tolist():
            if token != SEP and token not in self._spelt and len(self._respelt) < MAX_RESPELT:
                self._spelt[token] = self._respelling(token)

    def _respelling(self, token: int) -> tuple[int, ...] | None:
        """The token spelt with the renames learnt made in it, learnt as a substitution (None: no rename in it)."""
        if token in self._refused or (token,) in self._new:
            return None
        parts = PARTS.findall(self.spelling.text(token))
        renamed = [self._renames.get((attribute(parts, i), part)) for i, part in enumerate(parts)]
        if not any(renamed):
            return None
        new = self.spelling.tokens("".join(r or part for r, part in zip(renamed, parts)))
        if new is None or new == (token,) or len(new) > MAX_TOKENS:
            return None
        self._new[(token,)], self._made[(token,)] = new, 1
        self._respelt[(token,)] = (renamed[0] is not None, renamed[-1] is not None)
        return new

    def _inside_name(self, old: tuple[int, ...], before: int | None, after: list[int]) -> bool:
        """Whether a respelt token's renamed name runs on into the token before or after it in a row (``(p``
        followed by ``rices``), or follows a ``.`` that ends the token before (an attribute): then it is another
        name."""
        starts, ends = self._respelt[old]
        if starts and before is not None and before != SEP:
            parts = PARTS.findall(self.spelling.text(before))
            if parts and (WORD.fullmatch(parts[-1][-1]) or attribute(parts + [""], len(parts))):
                return True
        if ends and after and after[0] != SEP:
            return bool(WORD.fullmatch(self.spelling.text(after[0])[:1]))
        return False
