"""Auto replayed on recorded greedy answers at a machine's measured costs: its choices and their speed in seconds of
computer time instead of an hour of benchmark, and free of the machine's noise.

A greedy answer is a function of the prompt, so once recorded it can be decoded again without the model: the target
is replaced by :class:`ScriptedTarget`, whose greedy token after ``prompt + answer[:i]`` is ``answer[i]``, and whose
every call moves a simulated clock by what a call of that width costs on the machine (a cost table: the plan's, or
one measured deeper into a decode). Auto runs unchanged on that clock (its step costs are learnt from it), its memory
starts as the bench's does, and the speedup is plain decoding's time over the simulated time plus the real seconds
its lookups took. What the replay cannot show is the machine's noise and what the plan's table gets wrong unless a
truer table is given as ``actual``; it ranks policies, the bench measures them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import torch

from core.auto import Auto
from core.auto.costs import Latencies
from core.auto.plan import Plan
from core.engine import SpeculativeEngine
from core.memory import SuffixMemory
from core.tree import TokenTree


def latencies_from_plan_text(text: str) -> Latencies:
    """The target's costs from what ``speclens plan`` prints (:meth:`Plan.describe`): how another machine's costs
    are kept (docs/bench/plan-*.txt). ValueError when the text has none."""
    found = re.search(r"target forward of n tokens: (.*)", text)
    if not found:
        raise ValueError("no 'target forward of n tokens' line: is it the output of `speclens plan`?")
    return Latencies({int(n): float(ms) / 1000 for n, ms in re.findall(r"n=(\d+): ([\d.]+) ms", found.group(1))})


class SimulatedClock:
    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds


class ScriptedTarget:
    """A Backend whose greedy continuation of ``prompt`` is ``answer`` (any context off that path continues with
    token 0, which greedy verification never reaches), and whose calls cost what ``costs`` says, on ``clock``."""

    name = "scripted"
    device = "cpu"

    def __init__(self, prompt: Sequence[int], answer: Sequence[int], costs: Latencies, clock: SimulatedClock,
                 vocab_size: int, eos: Sequence[int] = ()) -> None:
        self.script = list(prompt) + list(answer)
        self.costs, self.clock = costs, clock
        self.vocab_size = vocab_size
        self.eos_ids = frozenset(eos)
        self.context_length = len(self.script) + 1
        self.calls = 0
        self.reset()

    @property
    def committed(self) -> list[int]:
        return list(self._committed)

    def fingerprint(self) -> str:
        return "scripted"

    def tokenize(self, text: str) -> list[int]:
        raise NotImplementedError("a scripted target decodes token ids only")

    def apply_chat_template(self, messages) -> list[int]:
        raise NotImplementedError("a scripted target decodes token ids only")

    def detokenize(self, ids: Sequence[int]) -> str:
        return ""       # nothing reads the text of a replay

    def special_name(self, token: int) -> str | None:
        return None

    def reset(self) -> None:
        self._committed: list[int] = []
        self._tree: TokenTree | None = None

    def _row(self, context: Sequence[int]) -> torch.Tensor:
        n = len(context)
        on_path = n < len(self.script) and list(context) == self.script[:n]
        row = torch.zeros(self.vocab_size)
        row[self.script[n] if on_path else 0] = 1.0
        return row

    def prefill(self, ids: Sequence[int], cancel=None, progress=None) -> torch.Tensor:
        self._committed = list(ids)
        return self._row(self._committed)

    def forward_tree(self, tree: TokenTree, start: int = 0) -> torch.Tensor:
        self.calls += 1
        self.clock.seconds += self.costs.verify_cost(len(tree))
        self._tree = tree
        return torch.stack([self._row(self._committed + [tree.tokens[i] for i in tree.path_to(j)])
                            for j in range(len(tree))])

    def commit(self, path: Sequence[int]) -> None:
        self._committed += [self._tree.tokens[i] for i in path]
        self._tree = None


@dataclass(frozen=True)
class Replay:
    speedup: float          # plain decoding's time over Auto's, on the table of actual costs
    predicted: float        # what Auto's choices were predicted to reach
    calls: int
    drafted_steps: int      # steps that verified a memory draft
    tokens: int


def replay(plan: Plan, prompt: Sequence[int], answer: Sequence[int], vocab_size: int,
           earlier: Sequence[int] | None = None, actual: Latencies | None = None,
           memory: SuffixMemory | None = None) -> Replay:
    """Auto, deciding from ``plan``, decodes ``prompt`` into its recorded greedy ``answer`` (``earlier``: an earlier
    answer to the same prompt, remembered first, as the bench does for a regenerated prompt); calls cost ``actual``
    (default: the plan's own table). ``memory``: the memory of earlier texts to start from (default: an empty one).

    Raises RuntimeError if Auto's output differs from the answer: the replay would then be of another answer."""
    costs = actual or plan.latencies
    clock = SimulatedClock()
    target = ScriptedTarget(prompt, answer, costs, clock, vocab_size)
    memory = memory if memory is not None else SuffixMemory("scripted")
    if earlier:
        memory.add_answer(prompt, earlier)
    auto = Auto(plan=plan, memory=memory, clock=clock)
    out = SpeculativeEngine(target, None, auto).generate(prompt, len(answer))
    if list(out.tokens) != list(answer):
        raise RuntimeError("the replayed decode left the recorded answer")
    drafter = auto.last_drafter
    seconds = clock.seconds + drafter.lookup_seconds
    return Replay(len(answer) * costs.plain / seconds, drafter.predicted_speedup, target.calls,
                  drafter.counts["memory"], len(answer))
