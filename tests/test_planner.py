"""Auto: plain decoding when nothing pays, memory and trees when they do, this prompt's record, the gate, the plan's
cache (damaged files measured again), drift re-planning, `speclens plan`."""
from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import torch

import core.auto.calibrate as calibrate
import core.auto.policy as policy
from core.auto import Auto, Plan, plan_key
from core.auto.cache import load_plan, plan_path, save_plan
from core.auto.cli import main as plan_main
from core.auto.costs import Latencies
from core.auto.estimates import AcceptanceTracker, PromptRates
from core.auto.plan import MAX_BUDGET, MAX_DEPTH, PLAN_VERSION, best_plan
from core.auto.step_costs import MIN_SAMPLES, StepCosts
from core.drafting import Baseline
from core.engine import SpeculativeEngine
from core.memory import MemoryDrafter, MemoryStats, open_memory
from core.memory.stats import MAX_PROB, RESUMED
from core.sampling import SamplingParams
from core.sequoia import solve
from core.tree import Proposal, TokenTree
from core.verify import Verdict
from tests.table_backend import TableBackend
from tests.tiny_models import tiny_draft_pair

GREEDY = SamplingParams(temperature=0.0)
REPETITIVE = [3, 4, 5, 6, 7, 8, 3, 4, 5, 6, 7, 8, 3, 4, 5]


def make_plan(target, draft, verify: dict, acceptance=(0.8, 0.1), noise: float = 0.0) -> Plan:
    lat = Latencies(verify, {1: 0.01, 8: 0.01} if draft is not None else {}, noise)
    tree = best_plan(solve(acceptance, MAX_BUDGET, MAX_DEPTH), lat) if draft is not None else None
    return Plan(plan_key(target, draft, GREEDY), lat, tuple(acceptance) if draft else None, tree)


def run(target, draft, strategy, prompt=REPETITIVE, tokens=24):
    engine = SpeculativeEngine(target, draft, strategy, GREEDY)
    events = list(engine.stream(prompt, tokens))
    return engine.last_result, events


def baseline(target, prompt=REPETITIVE, tokens=24):
    return SpeculativeEngine(target, None, Baseline(), GREEDY).generate(prompt, tokens)


def test_expensive_verification_means_plain_decoding_with_a_reason(tmp_path) -> None:
    target, draft = tiny_draft_pair(vocab=24, seed=7, noise=0.05)
    # a target call on n tokens costs n^2 plain decodes: no draft can pay for itself, not even a copy of the answer
    plan = make_plan(target, draft, {1: 1.0, 2: 4.0, 4: 16.0, 16: 256.0})
    memory = open_memory("t", tmp_path)
    plain = baseline(target).tokens
    memory.add_answer(REPETITIVE, plain, [1.0] * len(plain), GREEDY.distribution_key)
    result, events = run(target, draft, Auto(plan, memory=memory, clock=None))
    assert result.tokens == plain
    assert result.stats.drafted == 0
    assert all(e.note.startswith("plain decoding: ") for e in events)
    assert "the first token comes alone" in events[0].note
    assert "memory (match of" in events[1].note and "draft model's best tree" in events[1].note
    assert events[0].plan is not None and all(e.plan is None for e in events[1:])   # the plan reaches the views once


def test_flat_verification_means_trees_and_lossless() -> None:
    target, draft = tiny_draft_pair(vocab=24, seed=7, noise=0.05)
    auto = Auto(make_plan(target, draft, {1: 1.0, 16: 1.0}), use_memory=False, clock=None)
    result, events = run(target, draft, auto, prompt=[1, 2, 3])
    assert result.tokens == baseline(target, [1, 2, 3]).tokens
    assert auto.last_drafter.counts["tree"] > 0
    assert any(e.note.startswith("Sequoia tree") and e.shape == auto.plan.tree.parents for e in events)
    assert auto.last_drafter.predicted_speedup > 1.5


def test_the_draft_model_reads_the_text_only_when_a_step_first_drafts_with_it() -> None:
    target, draft = tiny_draft_pair(vocab=24, seed=7, noise=0.05)
    prompt = [1, 2, 3, 4, 5]
    plan = make_plan(target, draft, {1: 1.0, 16: 1.0})      # trees pay
    # the first token comes alone: it waits for the target's prefill only, not for the draft model's
    draft.reset()
    first, _ = run(target, draft, Auto(plan, use_memory=False, clock=None), prompt=prompt, tokens=1)
    assert len(first.tokens) == 1 and draft.committed == []
    # the first tree step has the model read the text (the prompt and the first token) before it drafts
    auto = Auto(plan, use_memory=False, clock=None)
    result, events = run(target, draft, auto, prompt=prompt)
    assert result.tokens == baseline(target, prompt).tokens and auto.last_drafter.counts["tree"] > 0
    assert events[0].nodes == () and {n.source for n in events[1].nodes} == {"draft"}
    assert draft.committed[:len(prompt)] == prompt


@pytest.mark.parametrize("tokens, reads", [(3, False), (120, True)])
def test_a_long_text_is_read_by_the_draft_model_only_for_an_answer_long_enough_to_repay_it(tokens, reads) -> None:
    target, draft = tiny_draft_pair(vocab=24, seed=7, noise=0.05)
    prompt = [1 + i % 20 for i in range(300)]
    # a tree step costs one plain step, and reading costs 0.01 plain steps a token: 3 plain steps for this prompt
    auto = Auto(make_plan(target, draft, {1: 1.0, 16: 1.0}), use_memory=False, clock=None)
    auto.plan.latencies = Latencies({1: 1.0, 16: 1.0}, {1: 0.01, 8: 0.08})
    draft.reset()
    result, _ = run(target, draft, auto, prompt=prompt, tokens=tokens)
    assert result.tokens == baseline(target, prompt, tokens).tokens
    assert (auto.last_drafter.counts["tree"] > 0) == reads and (draft.committed != []) == reads


def test_memory_drafts_when_the_text_repeats(tmp_path) -> None:
    target, _ = tiny_draft_pair(vocab=24, seed=7)
    auto = Auto(make_plan(target, None, {1: 1.0, 2: 1.1, 16: 4.0}), memory=open_memory("t", tmp_path), clock=None)
    result, events = run(target, None, auto)
    assert result.tokens == baseline(target).tokens
    assert {n.source for e in events for n in e.nodes} == {"memory"}
    assert any(e.note.startswith("memory: ") for e in events)


def test_a_remembered_answer_drafts_its_regeneration(tmp_path) -> None:
    target, _ = tiny_draft_pair(vocab=24, seed=9)
    memory = open_memory("t", tmp_path)
    prompt = [5, 1, 9, 2]
    first, _ = run(target, None, Auto(make_plan(target, None, {1: 1.0, 2: 1.1, 16: 4.0}), memory=memory, clock=None),
                   prompt)
    again, events = run(target, None, Auto(make_plan(target, None, {1: 1.0, 2: 1.1, 16: 4.0}), memory=memory,
                                           clock=None), prompt)
    assert again.tokens == first.tokens == baseline(target, prompt).tokens
    assert again.stats.accepted >= len(again.tokens) // 2      # the earlier answer was drafted back
    assert again.stats.target_calls < first.stats.target_calls


class StepClock:
    """A clock a machine would show: each step advances it by what the option taken costs here."""

    def __init__(self, seconds: dict[str, float]) -> None:
        self.seconds, self.now, self.auto = seconds, 0.0, None

    def __call__(self) -> float:
        drafter = self.auto.last_drafter
        self.now += self.seconds[drafter.choice] if drafter is not None else 0.0
        return self.now


def cycle_table(vocab: int, period: int):
    """A target that, after token ``t``, almost surely says ``(t + 1) % period``."""
    def table(ctx: tuple) -> torch.Tensor:
        p = torch.full((vocab,), 0.01 / (vocab - 1), dtype=torch.float64)
        p[(ctx[-1] + 1) % period] = 0.99
        return p
    return table


class WidthClock(StepClock):
    """A clock whose memory steps cost ``narrow`` when they verify two tokens and ``wide`` when more."""

    def __init__(self, plain: float, narrow: float, wide: float) -> None:
        super().__init__({"plain": plain, "tree": plain})
        self.narrow, self.wide = narrow, wide

    def __call__(self) -> float:
        drafter = self.auto.last_drafter
        if drafter is not None and drafter.choice == "memory":
            self.now += self.narrow if drafter.width <= 2 else self.wide
            return self.now
        return super().__call__()


@pytest.mark.parametrize("tree_seconds, drops_tree", [(1.05, False), (8.0, True)])
def test_a_tree_that_costs_more_than_planned_gives_way_to_plain(tree_seconds, drops_tree) -> None:
    target, draft = tiny_draft_pair(vocab=24, seed=7, noise=0.05)
    plan = make_plan(target, draft, {1: 1.0, 16: 1.0})          # a tree step is planned at about one plain step
    clock = StepClock({"plain": 1.0, "tree": tree_seconds, "memory": 1.0})
    auto = clock.auto = Auto(plan, use_memory=False, clock=clock)
    result, events = run(target, draft, auto, prompt=[1, 2, 3], tokens=40)
    assert result.tokens == baseline(target, [1, 2, 3], 40).tokens
    counts = auto.last_drafter.counts
    if drops_tree:
        assert counts["tree"] == MIN_SAMPLES        # each step is charged when the next one is chosen
        plain = [e.note for e in events if e.note.startswith("plain decoding: ")]
        assert counts["plain"] == len(plain) > 0
        # 8 s a step against the plan's ~1 s (the plan's exact figure follows the tree it chose on this CPU)
        slower = re.search(r"its steps take (\d+\.\d+)x the plan's timing", plain[-1])
        assert slower and 6.0 < float(slower.group(1)) < 8.5
    else:
        assert counts["plain"] == 1 and counts["tree"] > 0          # the first token alone, then trees


def test_step_costs_follow_the_median_of_measured_steps() -> None:
    costs = StepCosts(window=5)
    for _ in range(MIN_SAMPLES - 1):
        costs.observe("tree", 0.1, 0.2)
    assert costs.factor("tree") == 1.0                  # too few steps: the plan's cost stands
    costs.observe("tree", 0.1, 5.0)                     # one stalled step ...
    assert costs.factor("tree") == pytest.approx(2.0)   # ... does not move the median
    for _ in range(5):
        costs.observe("tree", 0.1, 0.13)
    assert costs.factor("tree") == pytest.approx(1.3)   # the window forgets older steps
    assert costs.factor("plain") == 1.0                 # options are measured apart
    costs.observe("plain", 0.1, float("nan"))
    costs.observe("plain", 0.0, 0.1)
    assert costs.samples("plain") == 0


def test_an_option_not_yet_measured_stands_to_plain_as_the_plan_says() -> None:
    costs = StepCosts()
    for _ in range(MIN_SAMPLES):
        costs.observe("plain", 0.077, 0.046)            # the machine runs faster than when the plan was timed
    assert costs.factor("memory") == costs.factor("plain") == pytest.approx(0.046 / 0.077)
    for _ in range(MIN_SAMPLES):
        costs.observe("memory", 0.15, 0.12)
    assert costs.factor("memory") == pytest.approx(0.8)  # then its own steps


def test_wide_steps_are_costed_by_their_own_width() -> None:
    costs = StepCosts()
    for _ in range(MIN_SAMPLES):
        costs.observe("plain", 0.10, 0.11)
        costs.observe("memory", 0.30, 0.45, width=16)
    assert costs.factor("memory", 16) == costs.factor("memory", 12) == pytest.approx(1.5)   # one class from 9 up
    assert costs.factor("memory", 2) == pytest.approx(1.1)      # narrower, unmeasured: plain's, not the wide ones'
    for _ in range(MIN_SAMPLES):
        costs.observe("memory", 0.12, 0.15, width=3)
    assert costs.factor("memory", 4) == pytest.approx(1.25)
    assert costs.factor("memory", 6) == pytest.approx(1.25)     # 5-8 unmeasured: the nearest narrower class
    assert costs.factor("memory", 2) == pytest.approx(1.1)
    assert costs.factor("memory") == pytest.approx((1.25 + 1.5) / 2) and costs.samples("memory") == 2 * MIN_SAMPLES


def test_memory_drafts_narrow_when_wide_ones_cost_more_than_planned(tmp_path) -> None:
    # the plan says a 16-token verification costs two plain steps; here every verification of more than two tokens
    # costs six. Auto drafts wide at first, then only what its measured widths pay for
    target = TableBackend(cycle_table(vocab=24, period=7), 24)     # its text repeats: memory matches every step
    plan = make_plan(target, None, {1: 1.0, 2: 1.1, 16: 2.0})
    clock = WidthClock(plain=1.0, narrow=1.1, wide=6.0)
    auto = clock.auto = Auto(plan, memory=open_memory("t", tmp_path), clock=clock)
    prompt = [1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3]
    result, events = run(target, None, auto, prompt=prompt, tokens=60)
    assert result.tokens == baseline(target, prompt, 60).tokens
    widths = [len(e.nodes) + 1 for e in events if e.nodes]
    assert max(widths) > 2 and widths.count(2) > 0
    wide = [i for i, w in enumerate(widths) if w > 2]
    assert len(wide) <= 2 * MIN_SAMPLES and wide[-1] < len(widths) - 1   # the last drafts are narrow ones


@pytest.mark.parametrize("widest", [16, 64])
def test_memory_drafts_are_as_wide_as_the_plan_measured_and_no_wider(tmp_path, widest) -> None:
    # a machine where a call on `widest` tokens costs little more than one: a long exact copy is drafted in calls as
    # wide as were measured there (a cap of a fixed 15 nodes chosen on another CPU would stop it at 16)
    target = TableBackend(cycle_table(vocab=24, period=7), 24)
    plan = make_plan(target, None, {1: 1.0, 2: 1.05, widest: 1.3})
    auto = Auto(plan, memory=open_memory("t", tmp_path), clock=None)
    prompt = [1, 2, 3, 4, 5, 6, 0] * 12
    result, events = run(target, None, auto, prompt=prompt, tokens=200)
    assert result.tokens == baseline(target, prompt, 200).tokens
    widths = [len(e.nodes) + 1 for e in events if e.nodes]
    assert max(widths) == widest


def test_the_first_token_comes_alone_and_a_copy_follows_it(tmp_path) -> None:
    # a regeneration's earlier answer, recorded at greedy, is certain: copied from the first step, its first token
    # would show only once the whole copy is verified; it comes alone, as plain decoding's, and the copy follows
    target = TableBackend(cycle_table(vocab=24, period=7), 24)
    plan = make_plan(target, None, {1: 1.0, 2: 1.05, 64: 1.3})
    memory = open_memory("t", tmp_path)
    prompt = [1, 2, 3]
    earlier = baseline(target, prompt, 40).tokens
    memory.add_answer(prompt, earlier, [1.0] * len(earlier), GREEDY.distribution_key)
    auto = Auto(plan, memory=memory, clock=None)
    result, events = run(target, None, auto, prompt=prompt, tokens=40)
    assert result.tokens == earlier
    assert events[0].nodes == () and len(events[0].tokens) == 1 and result.stats.first_tokens == 1
    assert len(events[1].tokens) == 39 and len(events) == 2
    assert auto.last_drafter.counts == {"plain": 1, "memory": 1, "tree": 0}


def test_a_copy_under_way_is_looked_up_every_step_however_dear_its_lookups(tmp_path, monkeypatch) -> None:
    # every lookup costs a tenth of a plain step (fruitless ones back off) and a draft pays only once the copy has
    # held for a while: the answer copies its prompt from its first token, and each step past a match of
    # COPY_UNDER_WAY tokens looks the copy up, so that it is drafted as soon as it pays
    ticks = iter(range(10**6))
    monkeypatch.setattr(policy, "time", SimpleNamespace(perf_counter=lambda: 0.1 * next(ticks)))
    target = TableBackend(cycle_table(vocab=24, period=23), 24)
    plan = make_plan(target, None, {1: 1.0, 2: 1.9, 4: 3.6, 16: 9.0})
    auto = Auto(plan, memory=open_memory("t", tmp_path), clock=None)
    prompt = list(range(23))
    looked_up = []
    propose = MemoryDrafter.propose

    def counted(self, context, *args, **kwargs):
        looked_up.append(len(context) - len(prompt))
        return propose(self, context, *args, **kwargs)

    monkeypatch.setattr(MemoryDrafter, "propose", counted)
    result, events = run(target, None, auto, prompt=prompt, tokens=60)
    assert result.tokens == baseline(target, prompt, 60).tokens
    first_memory = next(e.step for e in events if e.nodes)
    copying = range(policy.COPY_UNDER_WAY + 1, first_memory)      # steps whose context's match is that long
    assert set(copying) <= set(looked_up) and len(copying) > 0
    assert result.stats.drafted > 0


def test_a_copy_that_keeps_holding_is_drafted_in_wider_calls(tmp_path) -> None:
    # a machine where a call on 16 tokens costs 8.9 plain steps and one on 64 costs 25.5 (a 2-core Zen 4): at the
    # cap of MAX_PROB a node, 16 pays best; once this text has shown its copies holding for some 70 nodes in a row,
    # its record lifts the cap, and the calls grow to 64
    target = TableBackend(cycle_table(vocab=24, period=7), 24)
    plan = make_plan(target, None, {1: 1.0, 2: 1.9, 16: 8.9, 32: 20.0, 64: 25.5})
    auto = Auto(plan, memory=open_memory("t", tmp_path), clock=None)
    prompt = [1, 2, 3, 4, 5, 6, 0] * 12
    result, events = run(target, None, auto, prompt=prompt, tokens=300)
    assert result.tokens == baseline(target, prompt, 300).tokens
    widths = [len(e.nodes) + 1 for e in events if e.nodes]
    assert max(widths[:2]) <= 16 and max(widths) == 64


def test_only_a_long_clean_record_lifts_the_cap() -> None:
    rates = PromptRates(MemoryStats())
    assert rates.cap(20) == MAX_PROB
    for _ in range(15):
        rates.observe(20, True)
    assert rates.cap(20) == MAX_PROB        # fifteen in a row from a long match's prior: not yet surer than the cap
    for _ in range(15):
        rates.observe(20, True)
    assert MAX_PROB < rates.cap(20) < 1.0 and rates.cap(5) == MAX_PROB   # ... thirty are, at that length only
    missed = PromptRates(MemoryStats())
    missed.observe(20, False)
    for _ in range(60):
        missed.observe(20, True)
    assert missed.cap(20) == MAX_PROB       # one miss among them keeps it


class BusyThenIdleClock(StepClock):
    """Plain steps cost ``busy`` for the first ``busy_steps`` steps, then 1; a memory step verifying w tokens costs
    ``per_token * w`` throughout (cheaper than plain per token while busy, dearer once idle)."""

    def __init__(self, busy: float, busy_steps: int, per_token: float) -> None:
        super().__init__({})
        self.busy, self.busy_steps, self.per_token = busy, busy_steps, per_token

    def __call__(self) -> float:
        drafter = self.auto.last_drafter
        if drafter is not None:
            steps = sum(drafter.counts.values())
            if drafter.choice == "memory":
                self.now += self.per_token * drafter.width
            else:
                self.now += self.busy if steps <= self.busy_steps else 1.0
        return self.now


def test_plain_steps_are_re_timed_when_drafting_has_left_them_stale(tmp_path, monkeypatch) -> None:
    # plain is timed while the machine is busy (3 s a token), memory then wins (2 s per verified token) and plain is
    # not measured again; once idle, plain is 1 s a token. Its stale record would keep memory drafting for good
    monkeypatch.setattr("core.auto.step_costs.STALE", 6)
    target = TableBackend(cycle_table(vocab=24, period=7), 24)
    plan = make_plan(target, None, {1: 1.0, 2: 1.1, 16: 2.0})
    clock = BusyThenIdleClock(busy=3.0, busy_steps=10, per_token=2.0)
    auto = clock.auto = Auto(plan, memory=open_memory("t", tmp_path), clock=clock)
    prompt = [1, 2, 3]
    result, events = run(target, None, auto, prompt=prompt, tokens=150)
    assert result.tokens == baseline(target, prompt, 150).tokens
    notes = [e.note for e in events]
    retimed = [i for i, n in enumerate(notes) if "re-timing a plain step" in n]
    assert retimed and any(n.startswith("memory: ") for n in notes[:retimed[0]])
    assert all(n.startswith("plain decoding: ") for n in notes[-100:])    # re-timed, plain wins from there


def test_memory_is_drafted_when_the_machine_runs_faster_than_its_plan(tmp_path) -> None:
    # a plan timed on a slower machine: every step takes 60% of what it says. Plain is measured at 0.6 at once;
    # memory, judged by the plan's cost alone, would look 1.7x dearer than plain and never be tried
    target, _ = tiny_draft_pair(vocab=24, seed=7)
    plan = make_plan(target, None, {1: 1.0, 2: 1.2, 16: 2.0})
    clock = StepClock({"plain": 0.6, "memory": 0.6 * 1.2, "tree": 0.6})
    auto = clock.auto = Auto(plan, memory=open_memory("t", tmp_path), clock=clock)
    prompt = [1, 2, 3]                                # no match at first: plain's steps are measured before any
    result, _ = run(target, None, auto, prompt=prompt, tokens=40)
    assert result.tokens == baseline(target, prompt, 40).tokens
    assert auto.last_drafter.counts["memory"] > 0


def test_a_few_rejections_stop_memory_for_this_prompt() -> None:
    stats = MemoryStats()
    rates = PromptRates(stats)
    assert rates.factor(12) == pytest.approx(1.0)
    for _ in range(3):
        rates.observe(12, False)
    assert rates.factor(12) <= 0.5          # three misses halve the estimate at that match length ...
    assert rates.factor(2) == pytest.approx(1.0)   # ... and leave other lengths alone
    for _ in range(20):
        rates.observe(12, True)
    assert rates.factor(12) > 1.0


def test_what_shorter_matches_show_is_a_floor_for_longer_ones() -> None:
    unrelated = PromptRates(MemoryStats())
    for _ in range(10):
        unrelated.observe(1, True)          # one matching token is no sign of copying ...
        unrelated.observe(3, False)         # ... and misses at shorter lengths lower nothing longer
    assert unrelated.factor(12) == pytest.approx(1.0)
    copying = PromptRates(MemoryStats())
    for _ in range(20):
        copying.observe(3, True)            # a prompt that copies: right at 3-token matches
    raised = (20 / (20 + PromptRates.PRIOR_WEIGHT)) / MemoryStats().rate(12)
    assert copying.factor(12) == pytest.approx(raised) and raised > 1.0
    for _ in range(3):
        copying.observe(12, False)          # a long match breaks at each edit: its misses do not stop it here
    assert copying.factor(12) == pytest.approx(raised)
    assert copying.factor(2) == pytest.approx(1.0)   # nothing shorter than 2 tokens carries a floor


def test_guesses_of_where_a_copy_resumes_stop_after_their_own_misses() -> None:
    rates = PromptRates(MemoryStats())
    for _ in range(5):
        rates.observe(4, True)              # the copies of this prompt hold ...
    assert rates.factor(RESUMED) * MemoryStats().rate(RESUMED) > 0.6
    for _ in range(3):
        rates.observe(RESUMED, False)       # ... but its resumption guesses keep missing
    assert rates.factor(RESUMED) * MemoryStats().rate(RESUMED) < 0.4


def test_the_gate_is_the_measured_noise() -> None:
    target, _ = tiny_draft_pair(vocab=24, seed=7)
    # memory on this repetitive text predicts about 1.2x at these costs: taken with no noise, refused with 30%

    def step_after(prompt: list[int], noise: float) -> tuple[TokenTree, str]:
        auto = Auto(make_plan(target, None, {1: 1.0, 2: 1.6, 4: 2.8, 16: 12.0}, noise=noise), use_memory=False,
                    clock=None)
        auto.bind(target, None, GREEDY)
        drafter = auto.make_drafter(None, GREEDY, None)
        drafter.start(prompt[:-1])          # the prompt's last token as the target's first
        return drafter.draft(prompt, 8, 8), drafter.note

    quiet, _ = step_after(REPETITIVE, 0.0)
    noisy, note = step_after(REPETITIVE, 0.3)
    assert len(quiet) > 0
    assert len(noisy) == 0 and "drafting needs 1.30x" in note


def test_lookups_are_scored_while_decoding_plainly() -> None:
    target, _ = tiny_draft_pair(vocab=24, seed=7)
    auto = Auto(make_plan(target, None, {1: 1.0, 2: 10.0, 16: 100.0}), use_memory=False, clock=None)
    auto.bind(target, None, GREEDY)
    drafter = auto.make_drafter(None, GREEDY, None)
    drafter.start([1, 2, 3, 1])
    assert len(drafter.draft([1, 2, 3, 1, 2], 8, 8)) == 0          # plain: the proposal (3 1 2) is only remembered
    drafter.draft([1, 2, 3, 1, 2, 3], 8, 8)                         # the target then wrote 3: the proposal was right
    assert sum(drafter.rates.accepted) == 1 and sum(drafter.rates.tested) == 1


def test_plan_is_measured_once_then_cached(monkeypatch) -> None:
    target, draft = tiny_draft_pair(vocab=24, seed=8)
    monkeypatch.setattr(calibrate, "CALIBRATION_TOKENS", 8)
    monkeypatch.setattr(calibrate, "VERIFY_SIZES", (1, 2, 4))
    monkeypatch.setattr(calibrate, "DRAFT_SIZES", (1, 2))
    run(target, draft, Auto(use_memory=False), tokens=6)
    path = plan_path(plan_key(target, draft, GREEDY))
    saved = json.loads(path.read_text())
    assert saved["key"] == plan_key(target, draft, GREEDY) and saved["version"] == PLAN_VERSION
    assert len(saved["acceptance"]) == calibrate.WIDTH and set(saved["latencies"]["verify"]) == {"1", "2", "4"}

    def no_measuring(*args, **kwargs):
        raise AssertionError("the cached plan should have been used")

    monkeypatch.setattr("core.auto.strategy.measure_plan", no_measuring)
    again = Auto(use_memory=False)
    run(target, draft, again, tokens=6)
    cached = Plan.from_json(saved)
    assert (again.plan.latencies, again.plan.acceptance, again.plan.tree) == (cached.latencies, cached.acceptance,
                                                                              cached.tree)


@pytest.mark.parametrize("damage", [
    lambda d: d["latencies"]["verify"].update({"1": 0.0}),           # a zero latency
    lambda d: d["tree"].update(parents=[-1, 5]),                      # a parent out of range
    lambda d: d.update(acceptance=[0.9, 0.9]),                        # probabilities summing over 1
    lambda d: d.update(version=1),
    lambda d: d.pop("latencies"),
])
def test_a_damaged_cached_plan_is_measured_again(damage) -> None:
    target, draft = tiny_draft_pair(vocab=24, seed=8)
    plan = make_plan(target, draft, {1: 1.0, 16: 1.0})
    path = save_plan(plan)
    data = json.loads(path.read_text())
    damage(data)
    path.write_text(json.dumps(data))
    assert load_plan(plan.key) is None
    path.write_text("{not json")
    assert load_plan(plan.key) is None


def test_drift_replans_the_tree() -> None:
    target, draft = tiny_draft_pair(vocab=24, seed=7, noise=1.5)   # a poor draft
    plan = make_plan(target, draft, {1: 1.0, 16: 1.0}, acceptance=(0.95, 0.04))
    planned = plan.tree.parents
    saved = []
    auto = Auto(plan, use_memory=False, clock=None)
    auto._replanned = saved.append
    result, events = run(target, draft, auto, prompt=[1, 2, 3], tokens=60)
    assert saved, "the measured acceptance is far below the plan's: it must re-plan"
    assert plan.acceptance[0] < 0.9
    assert plan.tree.parents != planned
    assert sum(e.plan is not None for e in events) >= 2          # the re-plan reached the views as an event
    assert result.tokens == baseline(target, [1, 2, 3], 60).tokens


def test_acceptance_tracker_counts_hazards() -> None:
    tracker = AcceptanceTracker((0.0, 0.0), prior_weight=0.0)
    tree = TokenTree()
    for tok in (1, 2):
        tree.add(tok, -1, Proposal())
    tracker.observe(tree, Verdict(accepted=(1,), extra=3, bonus=False, accept_probs={0: 0.0, 1: 1.0}))
    tracker.observe(tree, Verdict(accepted=(0,), extra=3, bonus=False, accept_probs={0: 1.0}))
    # rank 1 accepted once in two tests; rank 2 accepted in its one test: a = (1/2, 1/2 * 1)
    assert tracker.vector() == (0.5, 0.5)


def test_speclens_plan_prints_everything(capsys, monkeypatch) -> None:
    monkeypatch.setattr(calibrate, "CALIBRATION_TOKENS", 8)
    assert plan_main(["--pair", "tiny"]) == 0
    out = capsys.readouterr().out
    for part in ("Acceptance vector", "Sequoia DP", "target forward of n tokens", "Plan:", "predicted",
                 "timing noise", "memory drafts"):
        assert part in out
    assert plan_main(["--pair", "tiny", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["version"] == PLAN_VERSION


@pytest.mark.parametrize("bonus, after, tested, accepted", [(True, 1, 2, 2), (True, 9, 2, 1), (False, 9, 1, 0)])
def test_the_target_s_token_past_a_short_draft_scores_the_proposal_s_next_node(bonus, after, tested, accepted) -> None:
    """A copy drafted one node at a time learns from two tokens a step: the drafted node, and the proposal's next
    one against the target's bonus token (drawn at an accepted leaf, it has the target's own distribution). A
    correction token, drawn from the residual after a rejection, scores nothing."""
    target, _ = tiny_draft_pair(vocab=24, seed=7)
    auto = Auto(make_plan(target, None, {1: 1.0, 2: 1.05, 16: 100.0}), use_memory=False, clock=None)
    auto.bind(target, None, GREEDY)
    drafter = auto.make_drafter(None, GREEDY, None)
    context = [1, 2, 3, 4, 1, 2, 5, 6, 1, 2, 3, 4, 1, 2, 3]
    drafter.start(context[:-1])
    tree = drafter.draft(context, 8, 8)
    assert drafter.choice == "memory" and tree.tokens == [4]        # the proposal goes on: 4 1 2 ...
    assert drafter.memory.last_proposal.tree.tokens[:2] == [4, 1]
    verdict = (Verdict((0,), after, True, {0: 1.0}) if bonus else Verdict((), after, False, {0: 0.0}))
    drafter.feedback(tree, verdict)
    assert sum(drafter.rates.tested) == tested and sum(drafter.rates.accepted) == accepted


def test_speclens_plan_names_a_bad_pair(capsys) -> None:
    assert plan_main(["--pair", "nonesuch"]) == 2
    assert "nonesuch" in capsys.readouterr().err


def test_one_stalled_lookup_changes_nothing(tmp_path, monkeypatch) -> None:
    # a lookup costs a tenth of a millisecond against plain steps of a second, but the first one stalls for ten
    # seconds (as the first lookup of a benchmark run once did): what a lookup costs is what lookups usually cost
    import core.auto.policy as policy
    from core.memory import MemoryDrafter

    now = [0.0]
    monkeypatch.setattr(policy, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: now[0])}))
    propose = MemoryDrafter.propose

    def timed(stall: float):
        def lookup(self, *args, **kwargs):
            now[0] += stall if not lookups else 1e-4
            lookups.append(1)
            return propose(self, *args, **kwargs)
        return lookup

    target = TableBackend(cycle_table(vocab=24, period=7), 24)
    prompt = list(range(10, 21))     # the answer, 0 1 2 ... 6 0 1 ..., repeats only itself: the first lookups find none
    drafted = {}
    for stall in (1e-4, 10.0):
        lookups: list[int] = []
        monkeypatch.setattr(MemoryDrafter, "propose", timed(stall))
        auto = Auto(make_plan(target, None, {1: 1.0, 2: 1.1, 16: 4.0}), memory=open_memory(f"t{stall}", tmp_path),
                    clock=None)
        result, _ = run(target, None, auto, prompt=prompt, tokens=40)
        assert result.tokens == baseline(target, prompt, 40).tokens
        drafted[stall] = (result.stats.drafted, len(lookups))
    assert drafted[10.0] == drafted[1e-4] and drafted[1e-4][0] > 0, drafted
