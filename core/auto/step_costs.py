"""What each of Auto's options really costs per step while decoding, learnt from the steps it takes.

The plan times the target's and the draft's forwards one at a time. Interleaved in a decode they cost more, and
not by the same factor for every option: on two cores the draft model and the target taking turns keep evicting
each other's weights from the caches, and the engine's own work sits between the calls. Measured on the default
pair, a draft-model tree step cost about 30 % more than the plan's sum of its calls while a plain step stayed within
a few percent of its timing, so a tree predicted at 1.11x ran slower than plain decoding.

So each option's predicted cost is scaled by the median ratio of its recent measured steps to their predictions
(the median: one step stalled by the system, or a draft catching up on tokens it skipped, must not flip the choice).
An option with fewer than ``MIN_SAMPLES`` steps is assumed to stand to plain decoding as the plan says: it takes
plain's ratio (``REFERENCE``), which carries how fast the machine runs now against when the plan was measured. Keeping
the plan's own cost instead is not self-correcting when the machine got faster: plain, measured, looks cheap; the
other options, unmeasured, look dear by the same factor and are never taken, so never measured. (Seen: a plan timed
at 77 ms per token on a busy machine, plain steps then at 46 ms, and memory matches of 10-20 copied tokens predicted
at 0.7-0.9x, never drafted.) Once an option has its own steps, its own ratio takes over, overhead included.

Memory drafts come in every size, and a wide verification runs further from its timing than a narrow one: the plan
times each width alone on a short context (the fastest of five), while a decode verifies after hundreds of tokens,
with the KV cache to roll back. Measured on a 2-core Xeon, an edit prompt's memory steps of 1-2 drafted tokens took
1.2x their planned time and those of 15 took 1.5x, so with one ratio for all sizes a 15-token draft of a one-token
match predicted at 1.1x lost about a fifth to plain decoding. So steps are also kept per width class
(``WIDTH_STARTS``, in verified tokens). A class with fewer than ``MIN_SAMPLES`` steps takes the nearest narrower
measured class's ratio (a wider verification runs no closer to its plan), else plain's: not the option's ratio over
all widths, which after a few dear wide steps would price the narrow ones out before any was measured.

Plain's ratio is the yardstick of every other option, and it is only measured while plain steps are taken. Measured
in a busy moment and then left alone while drafting won, it goes stale: seen on the Xeon, plain's ratio frozen at
about 1.3x of the tree's kept the draft model's tree predicted at 1.3-1.46x for about five hundred steps while it
ran at 0.92-0.98x of plain decoding. So once plain has gone ``STALE`` steps unmeasured the policy takes one plain step
(:meth:`stale`), and that step starts plain's record afresh.
"""
from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from statistics import median

WINDOW = 16         # steps of each option remembered: the cost follows the machine, not one prompt's start
MIN_SAMPLES = 3
REFERENCE = "plain"
WIDTH_STARTS = (1, 2, 3, 5, 9)   # verified tokens: 1, 2, 3-4, 5-8, 9+
STALE = 48          # steps after which plain's record says how the machine ran then, not now


class StepCosts:
    """Measured / predicted seconds per step, per option (``plain``, ``memory``, ``tree``) and per width class."""

    def __init__(self, window: int = WINDOW) -> None:
        self.window = window
        self._ratios: dict[tuple[str, int | None], deque[float]] = {}
        self._medians: dict[tuple[str, int | None], float] = {}   # of _ratios, until the next observation
        self._steps = 0
        self._last: dict[str, int] = {}     # option -> the step it was last measured at

    def observe(self, option: str, predicted: float, seconds: float, width: int | None = None) -> None:
        """One step of ``option`` verifying ``width`` tokens, predicted to take ``predicted`` seconds, took
        ``seconds``."""
        if predicted <= 0 or not math.isfinite(seconds) or seconds <= 0:
            return
        self._steps += 1
        if option == REFERENCE and self.stale(REFERENCE):
            self._ratios.pop((REFERENCE, None), None)
        self._last[option] = self._steps
        keys = [(option, None)] if width is None else [(option, None), (option, width_class(width))]
        for key in keys:
            self._ratios.setdefault(key, deque(maxlen=self.window)).append(seconds / predicted)
        self._medians.clear()

    def factor(self, option: str, width: int | None = None) -> float:
        """What to multiply the plan's cost of ``option`` (verifying ``width`` tokens, if given) by."""
        keys = [(option, None)] if width is None else [(option, c) for c in range(width_class(width), -1, -1)]
        for key in keys:
            own = self._ratios.get(key, ())
            if len(own) >= MIN_SAMPLES:
                if key not in self._medians:
                    self._medians[key] = median(own)
                return self._medians[key]
        return self.factor(REFERENCE) if option != REFERENCE else 1.0

    def samples(self, option: str) -> int:
        return len(self._ratios.get((option, None), ()))

    def steps_since(self, option: str) -> int | None:
        """Steps measured since ``option`` last was (None: never)."""
        return self._steps - self._last[option] if option in self._last else None

    def stale(self, option: str) -> bool:
        """Measured once, but not in the last ``STALE`` steps."""
        since = self.steps_since(option)
        return since is not None and since >= STALE


def width_class(width: int) -> int:
    """The index in ``WIDTH_STARTS`` of the class whose steps' costs a step verifying ``width`` tokens shares."""
    return bisect_right(WIDTH_STARTS, max(width, 1)) - 1
