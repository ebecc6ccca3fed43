"""Auto: the strategy that measures the machine once, then chooses step by step what pays (core.auto.policy)."""
from __future__ import annotations

import logging
import time
from typing import Callable

from core.auto.cache import load_plan, save_plan
from core.auto.calibrate import Report, apply_tuning, load_quantised, measure_plan
from core.auto.plan import Plan, plan_key
from core.auto.policy import AutoDrafter
from core.auto.step_costs import StepCosts
from core.drafting import ModelDrafter
from core.memory import Memory, MemoryDrafter, SuffixMemory, open_memory
from core.memory.spelling import Spelling
from core.sampling import Rng, SamplingParams

log = logging.getLogger(__name__)


def get_plan(target, draft, sampling: SamplingParams, refresh: bool = False, cache: bool = True,
             report: Report | None = None) -> Plan:
    """The cached plan for this pair and machine, measured (and cached) when missing or when ``refresh``."""
    key = plan_key(target, draft, sampling)
    plan = None if refresh or not cache else load_plan(key)
    if plan is None:
        plan = measure_plan(target, draft, sampling, report=report)
        if cache:
            save_plan(plan)
    return plan


class Auto:
    """Plain decoding, memory drafts or Sequoia trees, chosen step by step from measurements.

    The engine binds it to its models before a generation: the plan is loaded from the cache or measured, its
    verification settings applied, and the memory of earlier texts opened (``memory=`` gives one; ``use_memory=False``
    drafts from the current text only; ``resume=False`` never guesses where a copy resumes after an edit, nor applies
    an edit again; ``spell=False`` leaves a rename on the tokens it was learnt on, without the target's spelling;
    ``probs=False`` estimates a remembered answer's tokens by how often copies hold, not by the probability each was
    drawn with).
    Pass ``plan=`` to decide from given measurements (tests inject latencies this way, with ``clock=None`` so that the
    real steps' timings do not correct them).

    What each option's steps really cost is learnt across the generations of one binding (core.auto.step_costs).
    """

    label = "Auto"

    def __init__(self, plan: Plan | None = None, cache: bool = True, refresh: bool = False,
                 memory: SuffixMemory | None = None, use_memory: bool = True, resume: bool = True,
                 clock: Callable[[], float] | None = time.perf_counter, spell: bool = True,
                 probs: bool = True) -> None:
        self.plan = plan
        self._fixed = plan is not None
        self.cache = cache
        self.refresh = refresh
        self.memory = memory
        self.use_memory = use_memory
        self.resume = resume
        self.spell = spell
        self.probs = probs
        self.clock = clock
        self.step_costs = StepCosts()
        self.report: Report | None = None   # progress of a measurement, for a window that shows it
        self.last_drafter: AutoDrafter | None = None
        self._tree_draft = None     # the backend the tree is drafted with (a cheaper re-quantised copy, or the draft)
        self._bound: tuple | None = None
        self.spelling: Spelling | None = None   # the target's tokenizer: renames learnt reach other tokens

    def bind(self, target, draft, sampling: SamplingParams) -> None:
        """Load or measure the plan for these models (once per pair, backend, device and threads) and open the
        memory of earlier texts for their tokenizer."""
        key = plan_key(target, draft, sampling)
        if self.spell and (self._bound is None or self._bound[0] != id(target)):     # a new target: its spelling
            self.spelling = Spelling.of(target)
        if self._bound == (id(target), id(draft), repr(key)):
            return
        if not self._fixed or self.plan is None:
            self.plan = get_plan(target, draft, sampling, refresh=self.refresh, cache=self.cache, report=self.report)
            self.refresh = False
        apply_tuning(target, self.plan.tuning)
        self.step_costs = StepCosts()
        self._tree_draft = None
        if draft is not None and self.plan.tree_pays():
            self._tree_draft = load_quantised(draft, self.plan.draft_quantised) or draft
        if self.memory is None and self.use_memory:
            self.memory = open_memory(target.fingerprint())
            if self.memory.notice:
                log.warning(self.memory.notice)
        self._bound = (id(target), id(draft), repr(key))

    def _replanned(self, plan: Plan) -> None:
        if self.cache and not self._fixed:
            save_plan(plan)

    def make_drafter(self, draft, params: SamplingParams, rng: Rng) -> AutoDrafter:
        if self.plan is None:
            raise ValueError("Auto has no plan yet: run it through SpeculativeEngine (which binds it to the models) "
                             "or pass plan=")
        model = None
        tree_draft = self._tree_draft if self._tree_draft is not None else draft
        if tree_draft is not None and self.plan.tree_pays():
            model = ModelDrafter(tree_draft, self.plan.tree.parents, "without_replacement", params, rng, "draft")
        memory = MemoryDrafter(self.memory if self.use_memory else None, resume=self.resume, spelling=self.spelling,
                               sampling=params if self.probs else None)
        self.last_drafter = AutoDrafter(self.plan, memory, model, self._replanned, self.step_costs, self.clock)
        return self.last_drafter


def attach_memory(strategy, memory: SuffixMemory):
    """``strategy`` drafting from ``memory`` instead of the user's memory of earlier texts (Auto, Memory); any other
    strategy as it is."""
    if isinstance(strategy, Auto):
        return Auto(memory=memory, resume=strategy.resume, spell=strategy.spell, probs=strategy.probs)
    if isinstance(strategy, Memory):
        return strategy.attached(memory)
    return strategy
