"""Auto's choice, every step: plain decoding, a memory tree, or the planned Sequoia tree of the draft model.

Each option is scored in predicted tokens per second from the evidence at hand:

* plain decoding: one token per target call, cost ``t(1)``;
* memory (core.memory): the best-first tree of what followed earlier occurrences of the text's latest tokens. Its
  first ``n`` nodes are expected to give ``1 + sum of their path probabilities`` tokens for ``t(n + 1)``; ``n`` is
  chosen to maximise the rate. The probabilities are memory's calibrated estimates, corrected by what *this* prompt
  has shown so far (:class:`PromptRates`): a few rejections at a match length stop drafting at that length here;
* the draft model's Sequoia tree: ``c(n, d)`` from the acceptance tracked online, cost the measured draft and verify
  times of that shape, and until the model has read the text (it reads it at its first tree step, not before the
  first token), this step's share of that reading over the tree steps the answer has left.

Each cost is the plan's, scaled by what that option's steps (for memory, of that width) have really cost in this
decode (core.auto.step_costs): the plan times each forward alone, and a draft-model step interleaved with the
target's, or a wide verification deep into a decode, costs more than that.

Every option pays the memory lookup (timed each step). An option other than plain is taken only when it beats plain
decoding by the plan's gate (the machine's measured timing noise, at least 3 %): a gain smaller than the noise is a
coin toss that costs a verification of several tokens when it loses. So a memory tree whose likeliest node is too
unlikely for any width of it to clear the gate is not built past that node (:meth:`AutoDrafter._least_node`). Plain
decoding is the yardstick: when it has gone unmeasured for a while, one plain step re-times it
(core.auto.step_costs).
"""
from __future__ import annotations

import math
import time
from collections import deque
from statistics import median
from typing import Callable, Collection, Sequence

from core.auto.estimates import AcceptanceTracker, PromptRates
from core.auto.plan import MAX_BUDGET, MAX_DEPTH, Plan, best_plan
from core.auto.step_costs import MIN_SAMPLES, WIDTH_STARTS, StepCosts, width_class
from core.backends.base import Cancelled
from core.drafting import DrafterBase, ModelDrafter
from core.events import PlanEvent
from core.memory import MemoryDrafter, MemoryProposal
from core.memory.stats import bucket
from core.sequoia import solve, tree_value
from core.tree import TokenTree, depths_of
from core.verify import Verdict

LOOKUP_SHARE = 0.02     # a lookup costing more than this share of a plain step backs off while it finds nothing
LOOKUP_WINDOW = 16      # recent lookups whose median is a lookup's cost
MAX_SKIP = 16
# A match this long is a copy under way, whose estimates rise with every token it holds: its lookups are never spaced
# out. Seen at T 0.7 on a 2-core Zen 4, where a lookup (0.4-0.7 ms) straddles 2 % of a 31 ms step: a follow-up's copy
# of its given code, predicted at 0.80-0.95x for its first four steps, backed off.
COPY_UNDER_WAY = 4
DRIFT = 0.15            # re-plan the tree when the measured c(n, d) moves this far from the planned one
DRIFT_STEPS = 12        # ... judged over at least this many model-drafted steps


class AutoDrafter(DrafterBase):
    """See the module docstring. ``model`` is the draft model's drafter when the plan's tree pays, else None.

    ``costs`` carries what steps cost from one generation to the next; ``clock`` times them (None: decide from the
    plan's latencies alone, as tests with made-up latencies do).
    """

    def __init__(self, plan: Plan, memory: MemoryDrafter, model: ModelDrafter | None, on_replan=None,
                 costs: StepCosts | None = None, clock: Callable[[], float] | None = time.perf_counter) -> None:
        self.plan = plan
        self.latencies = plan.latencies
        self.memory = memory
        self.model = model
        self.tracker = AcceptanceTracker(plan.acceptance) if model is not None else None
        self.tree_plan = plan.tree if model is not None else None
        self.on_replan = on_replan
        self.costs = costs if costs is not None else StepCosts()
        self.clock = clock
        self.lookup_timer: Callable[[], float] = time.perf_counter   # a replay times them on its clock
        self._step: tuple | None = None   # the last step's option, planned cost, start and memory's width
        self.rates = PromptRates(memory.stats)
        self.note = ""
        self.choice = "plain"
        self.width = 1          # tokens the last step's choice verifies
        self.counts = {"plain": 0, "memory": 0, "tree": 0}
        self.predicted_tokens = 0.0
        self.predicted_seconds = 0.0
        self.plain_seconds = 0.0   # what a plain step was predicted to cost at each step, summed
        self.lookup_seconds = 0.0
        self._lookups = 0
        self._recent_lookups: deque[float] = deque(maxlen=LOOKUP_WINDOW)
        self._skip = 0          # steps left without a lookup
        self._backoff = 0       # how many to skip after the next fruitless lookup
        self._model_steps = 0
        self._shadow: tuple[MemoryProposal, int] | None = None   # a proposal not drafted, and where it applied
        self._prompt_length = 0     # tokens of the generation's prompt: a draft of no more is of its first token
        self._unread: tuple | None = None   # the draft model has yet to read this generation's text: (cancel, stops)
        self._plan_event: PlanEvent | None = plan.to_event(_plan_note(plan, model is not None))
        widest = self.latencies.widest
        self._bound_widths = [(w, WIDTH_STARTS[width_class(w)]) for w in sorted(
            {n for n in self.latencies.verify if 2 <= n <= widest}
            | {w for s in WIDTH_STARTS for w in (s - 1, s) if 2 <= w <= widest})]   # (width, its cost class)

    @property
    def predicted_speedup(self) -> float:
        """Tokens per second the chosen steps were predicted to reach, over plain decoding's."""
        if self.predicted_seconds <= 0:
            return 1.0
        steps = sum(self.counts.values())
        return self.predicted_tokens / self.predicted_seconds * self.plain_seconds / steps

    def start(self, prompt: Sequence[int], cancel=None, stops: Collection[int] = ()) -> None:
        self._step = None       # the time until the first draft is the prefill's, not a step's
        self._prompt_length = len(prompt)
        self.memory.start(prompt, stops=stops)
        # the draft model reads the text when a step first drafts with it (:meth:`_model_tree`), not before the first
        # token: most answers never draft with it on a CPU, and its prefill held every first token back (Auto's time
        # to the first token 1.25-1.31x Baseline's in the median of three bench runs on a 2-core Zen 3, in which 5 of
        # 105 answers took a model step)
        self._unread = (cancel, stops) if self.model is not None else None

    def take_plan(self) -> PlanEvent | None:
        event, self._plan_event = self._plan_event, None
        return event

    # -- the choice ---------------------------------------------------------------------------------------------
    def draft(self, tokens: Sequence[int], max_depth: int, max_nodes: int) -> TokenTree:
        if len(tokens) <= self._prompt_length:
            return self._first_token()
        lat = self.latencies
        started = self._time_last_step()
        self._score_shadow(tokens)
        skipped = self._skip > 0
        proposal = self._lookup(tokens, max_nodes, max_depth)
        lookup = self._lookup_cost()
        options: dict[str, tuple[float, float]] = {"plain": (1.0, lat.plain + lookup)}
        size = 0
        if len(proposal.tree):
            size, expected = self._memory_size(proposal)
            options["memory"] = (expected, lat.verify_cost(size + 1) + lookup)
        if self.model is not None:
            shape = self.tree_plan.parents
            value = tree_value(shape, self.tracker.vector())
            options["tree"] = (value, lat.tree_cost(shape) + lookup + self._reading_share(tokens, value, max_depth))
        factor = {name: self.costs.factor(name, size + 1 if name == "memory" else None) for name in options}
        rate = {name: e / (c * factor[name]) for name, (e, c) in options.items()}
        choice = max(rate, key=rate.get)
        plain = rate["plain"]
        retime = choice != "plain" and self.costs.stale("plain")
        if retime or rate[choice] < plain * (1.0 + self.plan.gate):
            choice = "plain"
        self.choice = choice
        self.width = {"plain": 1, "memory": size + 1}.get(choice) or len(self.tree_plan.parents) + 1
        if not skipped:     # a step that skipped its lookup learnt nothing of whether lookups find anything
            self._back_off(choice == "memory" or proposal.match >= COPY_UNDER_WAY, lookup)
        expected, cost = options[choice]
        self._tally(choice, expected, cost * factor[choice], lat.plain * factor["plain"])
        if started is not None:
            self._step = (choice, cost, started, self.width if choice == "memory" else None)
        self._shadow = (proposal, len(tokens)) if choice != "memory" and len(proposal.tree) else None
        self.shape = self.tree_plan.parents if choice == "tree" else None
        if choice == "memory":
            tree = proposal.tree.truncated(max_nodes=size)
            self.note = (f"memory: {size} of {len(proposal.tree)} nodes ({_what_matched(proposal)}), "
                         f"{expected:.2f} tokens expected, predicted {rate[choice] / plain:.2f}x")
            return tree
        if choice == "tree":
            shape = self.tree_plan.parents
            self.note = (f"Sequoia tree of {len(shape)} nodes, depth {max(depths_of(shape))}: "
                         f"predicted {rate[choice] / plain:.2f}x")
            return self._model_tree(tokens, max_depth, max_nodes)
        if retime:
            self.note = (f"plain decoding: re-timing a plain step, the yardstick of the others (the last was "
                         f"{self.costs.steps_since('plain')} steps ago)")
        else:
            self.note = "plain decoding: " + self._why_plain(proposal, rate, plain, factor)
        return TokenTree()

    def _reading_share(self, tokens: Sequence[int], value: float, max_depth: int) -> float:
        """What a tree step owes of the draft model's reading of the text while the model has not read it: the
        reading's predicted seconds spread over the tree steps the answer has left at this tree's rate. On a GPU, or
        for a long answer, next to nothing; for a long prompt read on a CPU for a short answer, the whole of it (a
        2,277-token prompt read for a 16-token answer stalled it 15 s on a 2-core Zen 3)."""
        if self._unread is None:
            return 0.0
        steps_left = max(1.0, (max_depth + 1) / max(value, 1.0))
        return self.latencies.reading_cost(len(tokens) - 1) / steps_left

    def _model_tree(self, tokens: Sequence[int], max_depth: int, max_nodes: int) -> TokenTree:
        """The draft model's tree. The first of a generation has the model read the text first, untimed as the
        prompt's prefill is (it is what the first token no longer waits for); a Stop meanwhile drafts nothing."""
        if self._unread is not None:
            cancel, stops = self._unread
            self._unread = None
            try:
                self.model.start(tokens, cancel, stops)
            except Cancelled:
                return TokenTree()
            if self._step is not None:
                option, planned, _, width = self._step
                self._step = (option, planned, self.clock(), width)
        return self.model.draft(tokens, max_depth, max_nodes)

    def _first_token(self) -> TokenTree:
        """The first token is decoded alone, as plain decoding does, so that it shows as soon as the prompt is read:
        verifying a draft with it delays it by that call (a regeneration whose first step verified a 64-token copy of
        the earlier answer showed its first token 0.8 s after plain decoding's, on a 2-core Zen 4), and decoding it
        alone costs the whole answer one plain step at most. Untimed, as the prefill before it."""
        self.choice, self.width, self.shape, self._shadow = "plain", 1, None, None
        seconds = self.latencies.plain * self.costs.factor("plain")
        self._tally("plain", 1.0, seconds, seconds)
        self.note = "plain decoding: the first token comes alone, as soon as the prompt is read"
        return TokenTree()

    def _tally(self, choice: str, expected: float, seconds: float, plain_seconds: float) -> None:
        """Count a step's choice with the tokens and seconds it was predicted at, and a plain step's predicted
        seconds beside them (:attr:`predicted_speedup`)."""
        self.counts[choice] += 1
        self.predicted_tokens += expected
        self.predicted_seconds += seconds
        self.plain_seconds += plain_seconds

    def _time_last_step(self) -> float | None:
        """Now, after charging the time since the last draft to the option that step took."""
        if self.clock is None:
            return None
        now = self.clock()
        if self._step is not None:
            option, planned, started, width = self._step
            self.costs.observe(option, planned, now - started, width)
        return now

    def _lookup(self, tokens: Sequence[int], max_nodes: int, max_depth: int) -> MemoryProposal:
        """Memory's proposal, timed; skipped (an empty proposal) while backing off."""
        if self._skip > 0:
            self._skip -= 1
            return MemoryProposal(TokenTree(), 0)
        timer = self.lookup_timer
        t0 = timer()
        # no call wider than the plan measured: a width never timed is never chosen on a guess
        widest = self.latencies.widest - 1
        proposal = self.memory.propose(tokens, min(widest, max_nodes), min(widest, max_depth),
                                       least_first=self._least_first)
        seconds = timer() - t0
        self._lookups += 1
        self.lookup_seconds += seconds
        self._recent_lookups.append(seconds)
        return proposal

    def _least_first(self, match: int) -> float:
        """The least estimate memory's likeliest first node of ``match`` tokens of agreement needs for a tree of it
        to be worth building: below it no width can beat plain decoding by the gate, so the proposal keeps that node
        alone (this prompt's record still learns from it) and the rest is neither built nor priced: on new code and
        prose that took Auto's Python from 0.35 to 0.27 ms a step (Zen 4). This prompt's correction applies as in
        :meth:`_memory_size`."""
        least = self._least_node()
        if self.rates.cap(match) <= least:
            return math.inf
        return least / self.rates.factor(match)

    def _least_node(self) -> float:
        """The least probability the likeliest node of a memory tree must have for any width to pay: ``n`` nodes give
        at most ``1 + n`` times it in tokens, for ``n + 1`` verified tokens at their measured cost, and memory is
        taken only ahead of plain decoding by the gate. Between the widths where the cost table has a knot or the
        measured correction changes class the bound is monotone, so those widths are the only ones checked. The
        lookup's cost is counted at its highest recent value, which only lowers the bound."""
        lat = self.latencies
        lookup = max(self._recent_lookups, default=0.0)
        plain = (lat.plain + lookup) * self.costs.factor("plain") / (1.0 + self.plan.gate)
        factors = {start: self.costs.factor("memory", start) for start in WIDTH_STARTS}
        return min((((lat.verify_cost(width) + lookup) * factors[start] / plain - 1.0) / (width - 1)
                    for width, start in self._bound_widths), default=math.inf)

    def _lookup_cost(self) -> float:
        """What a lookup costs: the median of the recent ones, the cheapest while there are fewer than
        ``MIN_SAMPLES``. Not the mean: one lookup stalled by the system (seen: the first of a benchmark run, 2.6 ms on
        average over its answer against 0.3-0.5 for every other) priced every lookup above ``LOOKUP_SHARE``, and the
        back-off then left too few lookups to dilute it: memory drafted nothing for the whole answer."""
        recent = self._recent_lookups
        if len(recent) < MIN_SAMPLES:
            return min(recent, default=0.0)
        return median(recent)

    def _back_off(self, fruitful: bool, lookup: float) -> None:
        """Where a lookup costs a noticeable share of a step (small fast models), fruitless lookups (neither drafted
        nor a copy under way) are spaced out, twice as far each time, until memory drafts again. Only a step that
        looked up says so: until stop 46 a skipped step counted as fruitless, re-armed the skip the moment it ran out,
        and no lookup was made again for the rest of the answer (on the Zen 4, a follow-up that copies its given code
        drafted 87 tokens in one run and none in the next two)."""
        if fruitful or lookup <= LOOKUP_SHARE * self.latencies.plain:
            self._backoff = 0
        elif self._skip == 0:
            self._skip = self._backoff
            self._backoff = min(MAX_SKIP, max(1, 2 * self._backoff))

    def _memory_size(self, proposal: MemoryProposal) -> tuple[int, float]:
        """How many of the proposal's nodes (best first) to draft, and the tokens they are expected to give, with
        the probabilities corrected by this prompt's own record, and each width's cost by what its steps have
        really cost (a wide verification runs further from its plan than a narrow one)."""
        lat = self.latencies
        tree = proposal.tree
        path: list[float] = []
        best_n, best_expected, best_rate = 1, 0.0, 0.0
        expected = 1.0
        limits: dict[int, tuple[float, float]] = {}     # per stats bucket: this prompt's factor and cap
        for j in range(len(tree)):
            match = proposal.node_matches[j]
            b = bucket(match)
            if b not in limits:
                limits[b] = (self.rates.factor(match), self.rates.cap(match))
            factor, cap = limits[b]
            node = min(cap, proposal.node_probs[j] * factor)
            parent = tree.parents[j]
            path.append(node * (path[parent] if parent >= 0 else 1.0))
            expected += path[-1]
            rate = expected / (lat.verify_cost(j + 2) * self.costs.factor("memory", j + 2))
            if rate > best_rate:
                best_n, best_expected, best_rate = j + 1, expected, rate
        return best_n, best_expected

    def _why_plain(self, proposal: MemoryProposal, rate: dict[str, float], plain: float,
                   factor: dict[str, float]) -> str:
        reasons = []
        if proposal.cut:
            reasons.append(f"memory ({_what_matched(proposal)}) cannot pay: its likeliest token is too unlikely for "
                           "any draft of it")
        elif "memory" in rate:
            reasons.append(f"memory ({_what_matched(proposal)}) is predicted at {rate['memory'] / plain:.2f}x")
        elif proposal.match:
            reasons.append(f"memory's match of {proposal.match} tokens is too short")
        else:
            reasons.append("no earlier text matches")
        if "tree" in rate:
            reasons.append(f"the draft model's tree is predicted at {rate['tree'] / plain:.2f}x"
                           + self._measured_note("tree", factor))
        elif self.plan.tree is not None:
            reasons.append(f"the draft model's best tree is predicted at {self.plan.tree.speedup:.2f}x")
        reasons.append(f"drafting needs {1 + self.plan.gate:.2f}x")
        return "; ".join(reasons)

    def _measured_note(self, option: str, factor: dict[str, float]) -> str:
        """Say so when the option's steps cost noticeably more, relative to plain, than the plan timed."""
        if self.costs.samples(option) < MIN_SAMPLES:
            return ""
        relative = factor[option] / factor["plain"]
        return f" (its steps take {relative:.2f}x the plan's timing)" if abs(relative - 1.0) > 0.1 else ""

    # -- learning -----------------------------------------------------------------------------------------------
    def _score_shadow(self, tokens: Sequence[int]) -> None:
        """Score the last proposal that was not drafted against the tokens the target then emitted.

        For a deterministic draft, "the target emitted the drafted token" has exactly the probability that
        verification would have accepted it, at any temperature; so this prompt's record keeps learning while it
        decodes plainly, and a match length judged unpromising gets corrected rather than never tried.
        """
        if self._shadow is None:
            return
        proposal, at = self._shadow
        self._shadow = None
        tree = proposal.tree
        node = next(iter(tree.children(-1)), None)
        for real in tokens[at:]:
            if node is None:
                break
            hit = tree.tokens[node] == real
            self._observe(proposal, node, hit)
            if not hit:
                break
            node = next(iter(tree.children(node)), None)

    def _observe(self, proposal: MemoryProposal, node: int, hit: bool) -> None:
        """A node of ``proposal`` not drafted, judged by the token the target emitted in its place."""
        self.rates.observe(proposal.node_matches[node], hit)
        self.memory.stats.observe(proposal.node_matches[node], hit, proposal.raw_probs[node])

    def _score_beyond(self, proposal: MemoryProposal, verdict: Verdict) -> None:
        """Score the proposal's next node past the drafted leaf where verification ended, which the draft left out,
        against the target's bonus token there: drawn at a leaf, that token has the target's own distribution, as a
        shadow's does. A copy drafted one node at a time (its estimates still low) so learns from two tokens a step."""
        if not verdict.bonus or verdict.extra is None or not verdict.accepted:
            return
        beyond = next(iter(proposal.tree.children(verdict.accepted[-1])), None)
        if beyond is not None:
            self._observe(proposal, beyond, proposal.tree.tokens[beyond] == verdict.extra)

    def feedback(self, tree: TokenTree, verdict: Verdict) -> None:
        if self.choice == "memory":
            self.memory.feedback(tree, verdict)
            proposal = self.memory.last_proposal
            for j, accept in verdict.accept_probs.items():
                self.rates.observe(proposal.node_matches[j], j in verdict.accepted)
            self._score_beyond(proposal, verdict)
        elif self.choice == "tree":
            self.model.feedback(tree, verdict)
            self.tracker.observe(tree, verdict)
            self._model_steps += 1
            if self._model_steps >= DRIFT_STEPS:
                self._check_drift()

    def finish(self, prompt: Sequence[int], answer: Sequence[int], probs: Sequence[float]) -> None:
        """Remember the answer (an earlier answer to the same prompt drafts a regenerated one)."""
        self.memory.remember(prompt, answer, probs)

    def _check_drift(self) -> None:
        vector = self.tracker.vector()
        planned = self.tree_plan.expected_tokens
        if abs(tree_value(self.tree_plan.parents, vector) - planned) <= DRIFT * planned:
            return
        self._model_steps = 0
        new = best_plan(solve(vector, MAX_BUDGET, MAX_DEPTH), self.latencies)
        self.plan.acceptance, self.plan.tree = vector, new
        if self.on_replan is not None:
            self.on_replan(self.plan)
        if new.speedup < 1.0 + self.plan.gate:
            self.model = None     # the draft's cache simply stops following; nothing else holds it
            self.note = f"re-planned: the acceptance drifted and the best tree is now predicted at {new.speedup:.2f}x"
        else:
            self.tree_plan = new
            self.model = ModelDrafter(self.model.backend, new.parents, "without_replacement", self.model.params,
                                      self.model.rng, "draft")
        self._plan_event = self.plan.to_event("re-planned: the acceptance seen while decoding drifted from the plan")


def _what_matched(proposal: MemoryProposal) -> str:
    what = "where a copy resumes after an edit" if proposal.resumed else f"match of {proposal.match} tokens"
    return what + proposal.edit_note


def _plan_note(plan: Plan, drafting: bool) -> str:
    if plan.tree is None:
        return "Auto's plan: no draft-model tree (memory drafts only)"
    state = "the draft model drafts this tree" if drafting else "the draft model stays idle: its tree does not pay"
    return f"Auto's plan for this pair on this machine: {state}"
