"""Auto replayed on recorded greedy answers at a machine's measured costs: its choices and their speed in seconds of
computer time instead of an hour of benchmark, and free of the machine's noise.

A greedy answer is a function of the prompt, so once recorded it can be decoded again without the model: the target
is replaced by :class:`ScriptedTarget`, whose greedy token after ``prompt + answer[:i]`` is ``answer[i]``, and whose
every call moves a simulated clock by what a call of that width costs on the machine (a cost table: the plan's, or
one measured deeper into a decode). Auto runs unchanged on that clock (its step costs are learnt from it), its memory
starts as the bench's does, every lookup in memory costs ``LOOKUP_SECONDS`` on the clock, and the speedup is plain
decoding's time over the simulated time. What the replay cannot show is the machine's noise and what the plan's table
gets wrong unless a truer table is given as ``actual``; it ranks policies, the bench measures them.

The lookups are charged a fixed cost rather than the seconds they take in the replaying process: Auto weighs its
measured lookup cost in every choice, and timed for real, one prompt's replay moved between 1.04x and 1.17x from one
run to the next (a choice on a knife edge, flipped by how long a lookup happened to take).

``knowing=True`` replays an Auto that knows which nodes of its own memory proposals the target accepts: each proposal is
cut to the path the answer takes, every node certain. Its proposals, widths and costs are Auto's own, so the distance
from Auto to it is what better estimates could gain, and the rest of the distance to the ceiling
(core.bench.ceiling) is what better proposals could. :attr:`Replay.unrejected` splits the first distance: Auto's
speed had its calls been charged only for the nodes the target took, so from Auto to it is what drafting nodes that
were rejected cost, and from it to the knowing Auto what the copies Auto judged too unlikely to draft would have given.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import torch

from core.auto import Auto
from core.auto.costs import Latencies
from core.auto.estimates import PromptRates
from core.auto.plan import Plan
from core.engine import SpeculativeEngine
from core.memory import MemoryDrafter, MemoryProposal, SuffixMemory
from core.memory.proposal import SOURCE
from core.sampling import SamplingParams
from core.tree import TokenTree


def latencies_from_plan_text(text: str) -> Latencies:
    """The target's costs from what ``speclens plan`` prints (:meth:`Plan.describe`): how another machine's costs
    are kept (docs/bench/plan-*.txt). ValueError when the text has none."""
    found = re.search(r"target forward of n tokens: (.*)", text)
    if not found:
        raise ValueError("no 'target forward of n tokens' line: is it the output of `speclens plan`?")
    return Latencies({int(n): float(ms) / 1000 for n, ms in re.findall(r"n=(\d+): ([\d.]+) ms", found.group(1))})


LOOKUP_SECONDS = 0.25e-3   # a lookup in memory: the median of Auto's in the bench on a 2-core Zen 4 (0.16-0.50 ms a
                           # step on new code, explanations and edits, docs/bench/draft-ms-zen4.json)


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
                 vocab_size: int, eos: Sequence[int] = (), tokenizer=None) -> None:
        self.script = list(prompt) + list(answer)
        self.tokenizer = tokenizer      # the recorded answers' tokenizer (detokenize, tokenize), when at hand
        self.costs, self.clock = costs, clock
        self.vocab_size = vocab_size
        self.eos_ids = frozenset(eos)
        self.context_length = len(self.script) + 1
        self.calls = 0
        self.wasted = 0.0       # seconds its calls spent on drafted nodes the answer did not take
        self.reset()

    @property
    def committed(self) -> list[int]:
        return list(self._committed)

    def fingerprint(self) -> str:
        return "scripted"

    def tokenize(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise NotImplementedError("a scripted target without a tokenizer decodes token ids only")
        return list(self.tokenizer.tokenize(text))

    def tokenize_special(self, text: str) -> list[int]:
        return self.tokenize(text)

    def infill_tokens(self) -> None:
        return None

    def apply_chat_template(self, messages, tools=()) -> list[int]:
        raise NotImplementedError("a scripted target decodes token ids only")

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.detokenize(ids) if self.tokenizer is not None else ""

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
        self.wasted += self.costs.verify_cost(len(self._tree)) - self.costs.verify_cost(len(path))
        self._committed += [self._tree.tokens[i] for i in path]
        self._tree = None


class ChargedMemoryDrafter(MemoryDrafter):
    """Memory's drafter whose every lookup moves the replay's clock by ``LOOKUP_SECONDS``."""

    def __init__(self, memory: SuffixMemory, clock: SimulatedClock, resume: bool = True, spelling=None,
                 sampling: SamplingParams | None = None) -> None:
        super().__init__(memory, resume=resume, spelling=spelling, sampling=sampling)
        self.clock = clock

    def propose(self, context: Sequence[int], max_nodes: int, max_depth: int, min_match: int = 1,
                least_first=None) -> MemoryProposal:
        self.clock.seconds += LOOKUP_SECONDS
        return super().propose(context, max_nodes, max_depth, min_match, least_first)


class KnowingMemoryDrafter(ChargedMemoryDrafter):
    """Memory's proposals cut to the path the recorded ``answer`` takes after ``prompt``, each node certain."""

    def __init__(self, memory: SuffixMemory, clock: SimulatedClock, prompt: Sequence[int], answer: Sequence[int],
                 resume: bool = True, spelling=None, sampling: SamplingParams | None = None) -> None:
        super().__init__(memory, clock, resume, spelling, sampling)
        self.script = list(prompt) + list(answer)

    def propose(self, context: Sequence[int], max_nodes: int, max_depth: int, min_match: int = 1,
                least_first=None) -> MemoryProposal:
        """Memory's whole proposal (``least_first`` is not applied: the path may run past its first node), cut."""
        full = super().propose(context, max_nodes, max_depth, min_match)
        path, node = [], -1
        while len(context) + len(path) < len(self.script):
            want = self.script[len(context) + len(path)]
            node = next((c for c in full.tree.children(node) if full.tree.tokens[c] == want), None)
            if node is None:
                break
            path.append(node)
        n, certain = len(path), (1.0,) * len(path)
        self._last = MemoryProposal(TokenTree.chain([full.tree.tokens[j] for j in path], SOURCE), full.match,
                                    certain, certain, full.occurrences, tuple(full.node_matches[j] for j in path),
                                    certain, ((0, 0),) * n, (), full.resumed, full.substituted)
        return self._last


class _CertainRates(PromptRates):
    """This prompt's record judging every node of a knowing proposal certain, as it is."""

    def factor(self, match: int) -> float:
        return 1.0

    def cap(self, match: int) -> float:
        return 1.0


class _ReplayedAuto(Auto):
    """Auto whose lookups are charged to the replay's clock."""

    def make_drafter(self, draft, params, rng):
        drafter = super().make_drafter(draft, params, rng)
        drafter.memory = self.memory_drafter(params if self.probs else None)
        drafter.lookup_timer = self.clock
        return drafter

    def memory_drafter(self, sampling: SamplingParams | None) -> MemoryDrafter:
        return ChargedMemoryDrafter(self.memory, self.clock, self.resume, self.spelling, sampling)


class _KnowingAuto(_ReplayedAuto):
    def __init__(self, prompt: Sequence[int], answer: Sequence[int], **kwargs) -> None:
        super().__init__(**kwargs)
        self.prompt, self.answer = prompt, answer

    def make_drafter(self, draft, params, rng):
        drafter = super().make_drafter(draft, params, rng)
        drafter.rates = _CertainRates(drafter.memory.stats)
        return drafter

    def memory_drafter(self, sampling: SamplingParams | None) -> MemoryDrafter:
        return KnowingMemoryDrafter(self.memory, self.clock, self.prompt, self.answer, self.resume, self.spelling,
                                    sampling)


@dataclass(frozen=True)
class Replay:
    speedup: float          # plain decoding's time over Auto's, on the table of actual costs
    predicted: float        # what Auto's choices were predicted to reach
    calls: int
    drafted_steps: int      # steps that verified a memory draft
    tokens: int
    rejected: int = 0       # drafted nodes the target did not take
    unrejected: float = 0.0  # the speedup had the calls cost only the nodes taken (a call of the path alone)


def replay(plan: Plan, prompt: Sequence[int], answer: Sequence[int], vocab_size: int,
           earlier: Sequence[int] | None = None, actual: Latencies | None = None,
           memory: SuffixMemory | None = None, knowing: bool = False, tokenizer=None,
           eos: Sequence[int] = ()) -> Replay:
    """Auto, deciding from ``plan``, decodes ``prompt`` into its recorded greedy ``answer`` (``earlier``: an earlier
    answer to the same prompt, remembered first, as the bench does for a regenerated prompt); calls cost ``actual``
    (default: the plan's own table). ``memory``: the memory of earlier texts to start from (default: an empty one).
    ``knowing``: Auto knows which nodes of its memory proposals the target accepts (the module docstring).
    ``tokenizer``: the answers' tokenizer (``detokenize`` and ``tokenize``), with which renames reach the other tokens
    that spell a renamed name (core.memory.substitutions); without it they stay on the tokens they were learnt on.
    ``eos``: the target's stop tokens, which end a draft as they do in a real decode (a copy of the prompt runs
    through the end of the user's turn into the next one).

    Raises RuntimeError if Auto's output differs from the answer: the replay would then be of another answer."""
    costs = actual or plan.latencies
    clock = SimulatedClock()
    target = ScriptedTarget(prompt, answer, costs, clock, vocab_size, eos, tokenizer)
    memory = memory if memory is not None else SuffixMemory("scripted")
    if earlier:     # remembered as the bench does a greedy earlier answer: each token drawn with probability 1
        memory.add_answer(prompt, earlier, [1.0] * len(earlier), SamplingParams().distribution_key)
    auto = (_KnowingAuto(prompt, answer, plan=plan, memory=memory, clock=clock) if knowing
            else _ReplayedAuto(plan=plan, memory=memory, clock=clock))
    out = SpeculativeEngine(target, None, auto).generate(prompt, len(answer))
    if list(out.tokens) != list(answer):
        raise RuntimeError("the replayed decode left the recorded answer")
    drafter = auto.last_drafter
    plain = len(answer) * costs.plain
    return Replay(plain / clock.seconds, drafter.predicted_speedup, target.calls, drafter.counts["memory"],
                  len(answer), out.stats.drafted - out.stats.accepted, plain / (clock.seconds - target.wasted))
