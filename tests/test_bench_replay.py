"""The replay of Auto on recorded greedy answers (core/bench/replay.py): it decodes exactly the recorded answer, its
speed is its calls' cost on the table given, and it reads the cost tables other machines left behind."""
from __future__ import annotations

import pytest

from core.auto.costs import Latencies
from core.auto.plan import Plan
from core.bench.replay import LOOKUP_SECONDS, ScriptedTarget, SimulatedClock, latencies_from_plan_text, replay
from core.drafting import Baseline
from core.engine import SpeculativeEngine

VOCAB = 64
PROMPT = [5, 9, 2, 7] + list(range(10, 50)) + [3, 8]
COPYING = list(range(12, 44)) + [51, 52, 53]        # an answer that copies 32 tokens of its prompt, then goes on
SECONDS = 1.0       # a plain step: long against a lookup's fixed cost on the clock


def plan(verify: dict[int, float]) -> Plan:
    return Plan({}, Latencies({n: SECONDS * t for n, t in verify.items()}))


def test_the_scripted_target_says_the_answer_and_charges_each_call() -> None:
    clock = SimulatedClock()
    costs = Latencies({1: 0.5, 8: 2.0})
    target = ScriptedTarget(PROMPT, COPYING, costs, clock, VOCAB)
    out = SpeculativeEngine(target, None, Baseline()).generate(PROMPT, len(COPYING))
    assert list(out.tokens) == COPYING
    assert target.calls == len(COPYING) and clock.seconds == pytest.approx(0.5 * len(COPYING))


def test_auto_copies_where_calls_are_cheap_and_its_speed_is_their_cost() -> None:
    result = replay(plan({1: 1.0, 2: 1.05, 64: 1.3}), PROMPT, COPYING, VOCAB)
    assert result.drafted_steps > 0 and result.calls < len(COPYING) / 3
    assert result.tokens == len(COPYING)
    # every call cost at least one plain step and at most 1.3 of them, plus at most one lookup each
    assert len(COPYING) / ((1.3 + LOOKUP_SECONDS) * result.calls) <= result.speedup <= len(COPYING) / result.calls


def test_a_replay_is_the_same_every_time() -> None:
    """Lookups are charged a fixed cost, not the seconds they took: Auto weighs its lookups' cost in every choice, and
    timed for real they moved a knife-edge prompt's replay by 12% from one run to the next."""
    dear = plan({1: 1.0, 2: 1.6, 4: 2.8, 16: 8.0, 64: 24.0})
    first = replay(dear, PROMPT, COPYING, VOCAB)
    assert all(replay(dear, PROMPT, COPYING, VOCAB) == first for _ in range(3))


def test_where_a_call_costs_as_many_steps_as_tokens_auto_decodes_plainly() -> None:
    result = replay(plan({1: 1.0, 64: 64.0}), PROMPT, COPYING, VOCAB)
    assert result.drafted_steps == 0 and result.calls == len(COPYING)
    assert 0.95 < result.speedup <= 1.0


def test_a_replayed_draft_ends_at_the_targets_stop_token() -> None:
    """The prompt's copy runs through the end of the user's turn (token 3) into the next; a real decode's drafts end
    at a stop token (the engine passes the target's), so a replay given the stop tokens must not pay for the rest."""
    turn = [5, 9, 2, 7] + list(range(10, 30)) + [3, 8, 4, 6] + list(range(40, 60))
    answer = list(range(12, 30)) + list(range(60, 64)) * 3     # copies the user's turn to its end, then goes on
    cheap = plan({1: 1.0, 2: 1.05, 64: 1.3})
    blind, told = replay(cheap, turn, answer, VOCAB), replay(cheap, turn, answer, VOCAB, eos=[3])
    assert told.rejected < blind.rejected


def test_a_regenerated_prompt_copies_its_earlier_answer_and_actual_costs_are_charged() -> None:
    answer = [60, 61, 62, 63] * 6
    cheap = plan({1: 1.0, 2: 1.05, 64: 1.3})
    again = replay(cheap, PROMPT, answer, VOCAB, earlier=answer)
    assert again.calls < replay(cheap, PROMPT, answer, VOCAB).calls
    dear = Latencies({1: SECONDS, 64: 64.0 * SECONDS})    # what the same calls cost on a machine unlike the plan's
    charged = replay(cheap, PROMPT, answer, VOCAB, earlier=answer, actual=dear)
    assert charged.calls == again.calls and charged.speedup < 1.0 < again.speedup


def test_costs_are_read_back_from_what_speclens_plan_printed() -> None:
    costs = Latencies({1: 0.0307, 2: 0.0507, 16: 0.2543, 64: 0.7581})
    text = "Pair: ...\n" + Plan({}, costs).describe()
    read = latencies_from_plan_text(text)
    assert set(read.verify) == set(costs.verify)
    assert all(read.verify[n] == pytest.approx(t, abs=1e-4) for n, t in costs.verify.items())
    with pytest.raises(ValueError, match="speclens plan"):
        latencies_from_plan_text("no plan here")


def test_a_knowing_auto_drafts_only_what_the_target_takes_and_is_no_slower() -> None:
    """Auto's estimates of a fresh copy start low, so it drafts shallowly at first; knowing which of its own
    proposal's nodes hold, it drafts those deep at once, and no verification of it rejects a node."""
    dear = plan({1: 1.0, 2: 1.6, 4: 2.8, 16: 8.0, 64: 24.0})     # a batch costs most of its width, as on a Zen 4
    auto = replay(dear, PROMPT, COPYING, VOCAB)
    knowing = replay(dear, PROMPT, COPYING, VOCAB, knowing=True)
    assert knowing.tokens == auto.tokens == len(COPYING)
    assert knowing.speedup > auto.speedup and knowing.calls < auto.calls
    assert knowing.rejected == 0 < knowing.drafted_steps
    # Auto's two rejected nodes at the copy's end cost it time; charged nothing for them it is faster, and still
    # short of the knowing Auto, which also drafts the copy deep at once
    assert auto.rejected > 0 and auto.speedup < auto.unrejected < knowing.speedup
    assert knowing.unrejected == pytest.approx(knowing.speedup)
    fresh = [60, 61, 62, 63, 59, 58, 57, 56]                       # nothing of it occurs before: nothing to know
    assert replay(dear, PROMPT, fresh, VOCAB, knowing=True).calls == len(fresh)


def test_the_knowing_drafter_follows_the_answer_through_its_proposal() -> None:
    from core.bench.replay import KnowingMemoryDrafter, SimulatedClock
    from core.memory import SuffixMemory

    context = [1, 2, 3, 9, 9, 1, 2, 4, 7, 7, 1, 2]      # "1 2" was followed by 3, then by 4
    drafter = KnowingMemoryDrafter(SuffixMemory("scripted"), SimulatedClock(), context, [3, 9, 9])
    drafter.start(context)
    proposal = drafter.propose(context, 8, 8)
    assert proposal.tree.tokens == [3, 9, 9] and proposal.tree.parents == [-1, 0, 1]
    assert proposal.node_probs == (1.0, 1.0, 1.0)
    off_path = KnowingMemoryDrafter(SuffixMemory("scripted"), SimulatedClock(), context, [5])
    off_path.start(context)
    assert len(off_path.propose(context, 8, 8).tree) == 0


def test_warm_statistics_are_learnt_on_the_other_sets_only() -> None:
    from core.memory import SuffixMemory
    from tools.replay import warm_statistics

    cheap = plan({1: 1.0, 2: 1.05, 64: 1.3})
    prompts = [{"set": "a", "id": "a1", "prompt": PROMPT, "answer": COPYING},
               {"set": "b", "id": "b1", "prompt": PROMPT, "answer": [60, 61, 62, 63] * 6, "earlier": [60, 61] * 4}]
    data = {"vocab_size": VOCAB, "eos": [], "prompts": prompts}
    for own, other in (("a", prompts[1]), ("b", prompts[0])):
        alone = SuffixMemory("scripted")
        replay(cheap, other["prompt"], other["answer"], VOCAB, other.get("earlier"), memory=alone)
        learnt = warm_statistics(cheap, data, own, None)
        assert learnt.to_dict() == alone.stats.to_dict() and sum(learnt.tested) > 0
