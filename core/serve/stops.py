"""Where a streamed answer ends: stop sequences, and the two rules with which llama-server ends a completion at the
cursor (an editor's ``n_indent`` and ``t_max_predict_ms``); what may be sent now.

Text that could still turn into a stop sequence is held back until the next delta settles it, so a client never
receives the beginning of a stop sequence, and the answer ends just before the first one.
"""
from __future__ import annotations

import time
from typing import Sequence

WORD, LIMIT = "word", "limit"     # why the text ended, in llama-server's names: a stop sequence, or a rule


class StopText:
    """Feed the answer's text deltas with :meth:`push`; each returns the text that may be sent; :meth:`flush` returns
    what was held back once the answer ended without a stop.

    ``min_indent``: a line after the first that is indented less (spaces and tabs; an empty line too) ends the answer
    before its text, as a completion inside a block should end with the block. ``newline_after_s``: once that long has
    passed since the first delta, the answer ends after its next newline (an editor's time limit that still ends on a
    whole line)."""

    def __init__(self, stops: Sequence[str], min_indent: int = 0, newline_after_s: float | None = None) -> None:
        self.stops = tuple(s for s in stops if s)
        self.min_indent = min_indent
        self.newline_after_s = newline_after_s
        self.text = ""
        self.sent = 0
        self.stopped = False
        self.reason = ""
        self.stopping_word = ""
        self._settled = 0          # lines starting before this have been checked for their indentation
        self._started: float | None = None

    def push(self, delta: str) -> str:
        if self.stopped:
            return ""
        if self._started is None:
            self._started = time.perf_counter()
        old = len(self.text)
        self.text += delta
        ends = self._ends(old)
        if ends:
            end, self.reason, self.stopping_word = min(ends)
            self.stopped = True
            self.text = self.text[:end]
            return self._send(end)
        return self._send(len(self.text) - self._held())

    def flush(self) -> str:
        return "" if self.stopped else self._send(len(self.text))

    def _ends(self, old: int) -> list[tuple[int, str, str]]:
        """Every place the answer may end given the text so far: (end, reason, stop sequence)."""
        longest = max((len(s) for s in self.stops), default=0)
        start = max(0, self.sent - longest + 1)
        ends = [(i, WORD, s) for s, i in ((s, self.text.find(s, start)) for s in self.stops) if i >= 0]
        if self.min_indent:
            line = self._underindented()
            if line is not None:
                ends.append((line, LIMIT, ""))
        if self.newline_after_s is not None and time.perf_counter() - self._started >= self.newline_after_s:
            newline = self.text.find("\n", old)
            if newline >= 0:
                ends.append((newline + 1, LIMIT, ""))
        return ends

    def _underindented(self) -> int | None:
        """Where the text of the first line indented less than ``min_indent`` begins, once its indentation is known."""
        newline = self.text.find("\n", self._settled)
        while newline >= 0:
            i = newline + 1
            while i < len(self.text) and self.text[i] in " \t":
                i += 1
            if i == len(self.text):       # only blanks so far: the line's indentation is not known yet
                return None
            if i - newline - 1 < self.min_indent:
                return i
            self._settled = newline + 1
            newline = self.text.find("\n", self._settled)
        return None

    def _held(self) -> int:
        """Characters at the end that begin some stop sequence (and so may not be sent yet)."""
        for n in range(min(max((len(s) for s in self.stops), default=1) - 1, len(self.text) - self.sent), 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0

    def _send(self, end: int) -> str:
        out = self.text[self.sent:end]
        self.sent = max(self.sent, end)
        return out
