"""Stop sequences on streamed text: what may be sent now, and where the answer ends.

Text that could still turn into a stop sequence is held back until the next delta settles it, so a client never
receives the beginning of a stop sequence, and the answer ends just before the first one.
"""
from __future__ import annotations

from typing import Sequence


class StopText:
    """Feed the answer's text deltas with :meth:`push`; each returns the text that may be sent; :meth:`flush` returns
    what was held back once the answer ended without a stop sequence."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.text = ""
        self.sent = 0
        self.stopped = False

    def push(self, delta: str) -> str:
        if self.stopped:
            return ""
        self.text += delta
        longest = max((len(s) for s in self.stops), default=0)
        start = max(0, self.sent - longest + 1)
        ends = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        if ends:
            self.stopped = True
            self.text = self.text[:min(ends)]
            return self._send(len(self.text))
        return self._send(len(self.text) - self._held())

    def flush(self) -> str:
        return "" if self.stopped else self._send(len(self.text))

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
