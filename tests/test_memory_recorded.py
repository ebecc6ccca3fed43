"""Recorded probabilities: a remembered answer keeps the probability each token was drawn with, and a regeneration
under the same sampling settings estimates the copy's nodes at them where the whole context agrees; the trees it then
drafts keep decoding exact (enumeration, greedy identity, chi-square)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from core.auto.estimates import PromptRates
from core.drafting import Baseline
from core.engine import SpeculativeEngine
from core.memory import Memory, MemoryDrafter, SuffixMemory
from core.memory.index import MAX_MATCH
from core.memory.stats import MAX_PROB, RECORDED, MemoryStats, bucket
from core.memory.store import open_memory
from core.sampling import SamplingParams, logits_to_probs, without_tokens
from tests.exact import first_two_tokens_exact, greedy_identical_on_random_tables
from tests.table_backend import TableBackend, random_table

GREEDY = SamplingParams(temperature=0.0)
SAMPLED = SamplingParams(temperature=0.7, top_p=0.9)
PROMPT = [1, 2, 3, 4, 0]
ANSWER = [5, 6, 7, 8, 5, 6]
DRAWN = [0.9, 0.3, 0.99, 0.6, 0.8, 0.7]


def drafter_for(memory: SuffixMemory, sampling: SamplingParams | None = SAMPLED) -> MemoryDrafter:
    return MemoryDrafter(memory, budget=8, max_depth=8, min_match=1, sampling=sampling)


def remembered(sampling: SamplingParams = SAMPLED, prompt: list[int] = PROMPT) -> SuffixMemory:
    memory = SuffixMemory("recorded")
    memory.add_answer(prompt, ANSWER, DRAWN, sampling.distribution_key)
    return memory


# -- what the engine reports -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("strategy", [Baseline(), Memory(6, 4, min_match=1)], ids=["baseline", "memory"])
def test_each_token_comes_with_the_probability_it_was_drawn_with(strategy) -> None:
    vocab = 9
    target = TableBackend(random_table(vocab, seed=3, sharp=2.0), vocab, "target", eos=[8])
    params = SamplingParams(temperature=0.7, top_p=0.9, seed=5, min_tokens=12)   # end-of-text barred
    prompt = [1, 2, 3, 4, 5, 1, 2, 3, 4]        # copies itself, so memory drafts, accepts and corrects
    result = SpeculativeEngine(target, None, strategy, params).generate(prompt, 12)
    assert len(result.token_probs) == len(result.tokens) == 12
    for i, token in enumerate(result.tokens):
        logits = target.logits_for(prompt + list(result.tokens[:i]))
        if i < params.min_tokens:
            logits = without_tokens(logits, target.eos_ids)
        assert result.token_probs[i] == pytest.approx(float(logits_to_probs(logits, params)[token]), abs=1e-9)
    greedy = SpeculativeEngine(target, None, strategy, SamplingParams(min_tokens=12)).generate(prompt, 12)
    assert greedy.token_probs == (1.0,) * 12, "the greedy distribution is one-hot"


def test_a_drafter_remembers_the_answer_with_its_probabilities_under_its_settings() -> None:
    memory = SuffixMemory("recorded")
    SpeculativeEngine(TableBackend(random_table(9, seed=1), 9, "t"), None, Memory(4, 4).attached(memory),
                      SAMPLED).generate(PROMPT, 6)
    assert memory.state.samplings == (SAMPLED.distribution_key,)
    assert np.count_nonzero(memory.state.index.probs) == 6, "the answer's tokens, not the prompt's"


def test_the_distribution_key_ignores_the_seed_only() -> None:
    assert SamplingParams(0.7, seed=1).distribution_key == SamplingParams(0.7, seed=2).distribution_key
    keys = {p.distribution_key for p in (SamplingParams(0.7), SamplingParams(0.8), SamplingParams(0.7, top_k=5),
                                         SamplingParams(0.7, top_p=0.9), SamplingParams(0.7, min_tokens=3), GREEDY)}
    assert len(keys) == 6


# -- storage ---------------------------------------------------------------------------------------------------------

def test_probabilities_stay_beside_their_tokens_through_eviction_and_files(tmp_path) -> None:
    memory = open_memory("fp", tmp_path)
    memory.add_document([9] * 30, source="conversation")
    memory.add_answer(PROMPT, ANSWER, DRAWN, SAMPLED.distribution_key)
    memory.state.stamps[:] = [0, 5]
    memory._state = memory.state.evicted(memory.nbytes - 1)          # the conversation was used least recently
    assert memory.documents == 1
    memory.save()
    reopened = open_memory("fp", tmp_path, read_only=True)
    state = reopened.state
    assert reopened is not memory and state.samplings == (SAMPLED.distribution_key,)
    ends = np.array([int(state.index.starts[0]) + len(PROMPT) - 1])
    assert state.recorded(ends, 6, SAMPLED.distribution_key)[0] == pytest.approx(DRAWN, abs=0.5 / 255)
    assert not state.recorded(ends, 6, GREEDY.distribution_key).any(), "drawn under other settings"


def saved_and_rewritten(folder, change) -> None:
    """Save a memory of one recorded answer in ``folder``, then rewrite its file's arrays after ``change(arrays)``."""
    memory = open_memory("fp", folder)
    memory.add_answer(PROMPT, ANSWER, DRAWN, SAMPLED.distribution_key)
    memory.save()
    path = next(folder.glob("*.npz"))
    with np.load(path) as data:
        arrays = {name: data[name] for name in data.files}
    change(arrays)
    np.savez(path, **arrays)


def test_a_memory_file_written_before_probabilities_were_recorded_loads_without_them(tmp_path) -> None:
    saved_and_rewritten(tmp_path, lambda arrays: arrays.pop("probs"))
    state = open_memory("fp", tmp_path, read_only=True).state
    assert state.documents == 1 and not state.index.probs.any()


def test_a_corrupt_probability_array_gives_an_empty_memory_and_a_notice(tmp_path) -> None:
    saved_and_rewritten(tmp_path, lambda arrays: arrays.update(probs=arrays["probs"][:-1]))
    reopened = open_memory("fp", tmp_path)
    assert reopened.documents == 0 and "recorded probabilities" in reopened.notice


@pytest.mark.parametrize("probs, sampling", [([0.5] * 5, "k"), ([0.5] * 6, ""), ([1.5] + [0.5] * 5, "k"),
                                             ([float("nan")] * 6, "k")])
def test_bad_probabilities_are_refused(probs, sampling) -> None:
    memory = SuffixMemory("recorded")
    with pytest.raises(ValueError):
        memory.add_answer(PROMPT, ANSWER, probs, sampling)
    assert memory.documents == 0


# -- estimates -------------------------------------------------------------------------------------------------------

def test_a_regeneration_is_estimated_at_the_probabilities_the_earlier_answer_was_drawn_with() -> None:
    drafter = drafter_for(remembered())
    drafter.start(PROMPT)
    proposal = drafter.propose(PROMPT, 8, 8)
    assert proposal.tree.tokens == ANSWER
    assert proposal.node_matches == (RECORDED,) * 6
    assert proposal.node_probs == pytest.approx(DRAWN, abs=0.5 / 255)
    assert proposal.path_probs[1] == pytest.approx(proposal.node_probs[0] * proposal.node_probs[1])


def test_a_greedy_answer_regenerated_is_certain_where_a_copy_never_is() -> None:
    recorded, plain = SuffixMemory("recorded"), SuffixMemory("plain")
    recorded.add_answer(PROMPT, ANSWER, [1.0] * len(ANSWER), GREEDY.distribution_key)
    plain.add_answer(PROMPT, ANSWER)
    drafter = drafter_for(recorded, GREEDY)
    drafter.start(PROMPT)
    assert drafter.propose(PROMPT, 8, 8).node_probs == (1.0,) * len(ANSWER)
    drafter = drafter_for(plain, GREEDY)
    drafter.stats.accepted[:] = drafter.stats.tested[:] = [1000.0] * len(drafter.stats.tested)   # always held
    drafter.start(PROMPT)
    assert max(drafter.propose(PROMPT, 8, 8).node_probs) == MAX_PROB


@pytest.mark.parametrize("drafting", [SamplingParams(temperature=1.0), GREEDY, None], ids=["t1", "greedy", "none"])
def test_probabilities_drawn_under_other_settings_or_none_are_not_used(drafting) -> None:
    drafter = drafter_for(remembered(), drafting)
    drafter.start(PROMPT)
    proposal = drafter.propose(PROMPT, 8, 8)
    assert proposal.tree.tokens == ANSWER and RECORDED not in proposal.node_matches


def test_probabilities_need_the_context_to_agree_as_far_back_as_memory_looks() -> None:
    prompt = list(range(10, 10 + MAX_MATCH + 8)) + [0]
    drafter = drafter_for(remembered(prompt=prompt))
    elsewhere = [99, 98] + prompt[-3:]                      # only the prompt's last three tokens agree
    drafter.start(elsewhere)
    assert RECORDED not in drafter.propose(elsewhere, 8, 8).node_matches
    drafter.start(prompt)                                   # the prompt again: MAX_MATCH tokens agree
    assert drafter.propose(prompt, 8, 8).node_matches == (RECORDED,) * 6
    short = drafter_for(remembered(prompt=prompt[-3:]))      # the whole remembered prompt agrees
    short.start(elsewhere)
    assert short.propose(elsewhere, 8, 8).node_matches == (RECORDED,) * 6


def test_an_answer_that_repeats_its_prompt_is_still_estimated_at_its_recorded_probabilities() -> None:
    # the whole context [1, 2, 3, 4] is met twice in the remembered text: at its start, after the same context, and
    # inside the answer, after another; both go on with the same tokens, and the first says what they were drawn with
    prompt, answer = [1, 2, 3], [4, 1, 2, 3, 4, 1, 2, 3]
    drawn = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]
    memory = SuffixMemory("recorded")
    memory.add_answer(prompt, answer, drawn, SAMPLED.distribution_key)
    drafter = drafter_for(memory)
    drafter.start(prompt)
    proposal = drafter.propose(prompt + answer[:1], 8, 8)
    assert proposal.occurrences == 2 and proposal.tree.tokens == answer[1:]
    assert proposal.node_matches == (RECORDED,) * 7
    assert proposal.node_probs == pytest.approx(drawn[1:], abs=0.5 / 255)


def test_two_recorded_answers_are_branched_by_their_probabilities() -> None:
    memory = remembered()
    memory.add_answer(PROMPT, [5, 7, 7], [0.9, 0.6, 0.9], SAMPLED.distribution_key)
    drafter = drafter_for(memory)
    drafter.start(PROMPT)
    proposal = drafter.propose(PROMPT, 3, 8)
    assert proposal.tree.tokens == [5, 7, 7], "after 5, 7 (drawn at 0.6) before 6 (drawn at 0.3)"
    assert proposal.node_probs[0] == pytest.approx(0.9, abs=0.01)


def test_a_prompt_s_record_does_not_rescale_a_recorded_probability() -> None:
    rates = PromptRates(MemoryStats())
    for _ in range(6):
        rates.observe(RECORDED, False)
    assert rates.factor(RECORDED) == 1.0 and rates.cap(RECORDED) == 1.0
    stats = MemoryStats()
    assert stats.scale(RECORDED) == 1.0, "calibrated from 1: the probability is the acceptance itself"
    stats.observe(RECORDED, True, 0.5)
    assert stats.tested[bucket(RECORDED)] == 1.0 and sum(stats.tested) == 1.0


def test_statistics_written_before_the_recorded_bucket_keep_every_other() -> None:
    old = {name: [float(i) for i in range(16)] for name in ("tested", "accepted", "predicted")}
    stats = MemoryStats.from_dict(old)
    assert stats.tested[:16] == old["tested"] and stats.tested[bucket(RECORDED)] == 0.0


# -- exactness -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Recalled(Memory):
    """Memory drafts from two earlier answers to ``PROMPT`` recorded under ``recorded_under`` (a fresh memory per
    generation, so every random path drafts from the same one)."""

    recorded_under: SamplingParams = SAMPLED

    def make_drafter(self, draft, params, rng) -> MemoryDrafter:
        memory = remembered(self.recorded_under)
        memory.add_answer(PROMPT, [5, 7, 7, 2], [0.9, 0.6, 0.9, 0.4], self.recorded_under.distribution_key)
        return MemoryDrafter(memory, self.budget, self.max_depth, self.min_match, sampling=params)


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9),
                                    SamplingParams(temperature=1.3, top_k=3)], ids=["t1", "t0.7-p0.9", "t1.3-k3"])
def test_sampled_joint_distribution_is_exact_with_recorded_probabilities(params) -> None:
    vocab = 9
    target = TableBackend(random_table(vocab, seed=6), vocab, "target")
    strategy = Recalled(3, 2, min_match=1, recorded_under=params)
    drafter = strategy.make_drafter(None, params, None)
    drafter.start(PROMPT)
    assert RECORDED in drafter.propose(PROMPT, 3, 2).node_matches
    got, expected = first_two_tokens_exact(target, None, strategy, params, PROMPT)
    assert float((got - expected).abs().max()) < 1e-9


def test_greedy_identical_with_recorded_probabilities_on_random_targets() -> None:
    assert greedy_identical_on_random_tables(Recalled(6, 4, min_match=1, recorded_under=GREEDY), PROMPT) > 0


@pytest.mark.slow
def test_chi_square_first_two_tokens_with_recorded_probabilities() -> None:
    from tests.chi_square import ALPHA, N, chi_square_p, exact_joint, sampled_joint, tiny_target

    target, params = tiny_target(), SamplingParams(temperature=1.0)
    strategy = Recalled(3, 2, min_match=1, recorded_under=params)
    joint = exact_joint(target, params, PROMPT)
    p = chi_square_p(sampled_joint(target, None, strategy, params, PROMPT), joint)
    print(f"\nchi-square memory trees with recorded probabilities T=1.0: p = {p:.4f} (N={N})")
    assert p > ALPHA
