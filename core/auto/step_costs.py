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
"""
from __future__ import annotations

import math
from collections import deque
from statistics import median

WINDOW = 16         # steps of each option remembered: the cost follows the machine, not one prompt's start
MIN_SAMPLES = 3
REFERENCE = "plain"


class StepCosts:
    """Measured / predicted seconds per step, per option (``plain``, ``memory``, ``tree``)."""

    def __init__(self, window: int = WINDOW) -> None:
        self.window = window
        self._ratios: dict[str, deque[float]] = {}

    def observe(self, option: str, predicted: float, seconds: float) -> None:
        """One step of ``option``, predicted to take ``predicted`` seconds, took ``seconds``."""
        if predicted <= 0 or not math.isfinite(seconds) or seconds <= 0:
            return
        self._ratios.setdefault(option, deque(maxlen=self.window)).append(seconds / predicted)

    def factor(self, option: str) -> float:
        """What to multiply the plan's cost of ``option`` by."""
        own = self._ratios.get(option, ())
        if len(own) >= MIN_SAMPLES:
            return median(own)
        return self.factor(REFERENCE) if option != REFERENCE else 1.0

    def samples(self, option: str) -> int:
        return len(self._ratios.get(option, ()))
