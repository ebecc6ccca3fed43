"""Resuming a copy after an edit (core.memory.resume): where the guesses point, that the trees they make keep decoding
exact (enumeration, greedy identity, chi-square), and that an edited copy is drafted across its edits."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from core.drafting import Baseline
from core.engine import SpeculativeEngine
from core.memory import Memory, MemoryDrafter, SuffixMemory
from core.memory.index import LiveIndex
from core.memory.resume import MAX_GAP, MAX_KEPT_GAP, CopyAnchor
from core.memory.stats import BUCKET_LABELS, EDITED, RESUMED, MemoryStats, bucket, key
from core.sampling import SamplingParams
from tests.exact import first_two_tokens_exact
from tests.table_backend import TableBackend, random_table
from tests.tiny_models import tiny_backend

GREEDY = SamplingParams(temperature=0.0)
SOURCE = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]


def resumed_at(context: list[int], copied_up_to: int) -> tuple[list[int], list[float]]:
    """The guesses after ``context``, anchored where its first ``copied_up_to`` tokens were a copy."""
    anchor = CopyAnchor()
    live = LiveIndex(context[:copied_up_to])
    anchor.follow(live, *live.longest())
    live.sync(context)
    ends, weights = anchor.resumptions(live)
    return [context[e + 1] for e in ends], weights.tolist()


def test_a_substitution_resumes_as_many_tokens_on() -> None:
    # the copy "10 11 12 13" then 99 in place of 14: the likeliest guess resumes at 15
    context = SOURCE + [0] + [10, 11, 12, 13, 99]
    nexts, weights = resumed_at(context, len(context) - 1)
    assert nexts[int(np.argmax(weights))] == 15
    assert 14 in nexts, "an insertion (resume where the copy stopped) is among the guesses"
    # two new tokens in place of 14: still the copy after 14 is likeliest; one token sooner or later are guessed too
    context = SOURCE + [0] + [10, 11, 12, 13, 98, 99]
    nexts, weights = resumed_at(context, len(context) - 2)
    assert nexts[int(np.argmax(weights))] == 16 and {15, 17} <= set(nexts)


def test_tokens_copied_after_the_anchor_move_it_on() -> None:
    # anchored after "10 11 12 13"; "14 15" were copied later (accepted drafts), then 99 replaced 16
    context = SOURCE + [0] + [10, 11, 12, 13, 14, 15, 99]
    nexts, weights = resumed_at(context, len(context) - 3)
    assert nexts[int(np.argmax(weights))] == 17


def test_no_anchor_or_a_long_gap_means_no_guess() -> None:
    live = LiveIndex(SOURCE + [0, 1, 2])
    assert not len(CopyAnchor().resumptions(live)[0])
    anchor = CopyAnchor()
    context = SOURCE + [0] + [10, 11, 12, 13]
    live = LiveIndex(context)
    anchor.follow(live, *live.longest())
    for gap, kept in ((MAX_GAP + 1, True), (MAX_KEPT_GAP + 1, False)):
        live.sync(context + [90 + i for i in range(gap)])
        assert not len(anchor.resumptions(live)[0]) and (anchor.at is not None) == kept, gap


def test_an_edit_longer_than_the_guesses_reach_is_still_learnt() -> None:
    # 14 written as seven new tokens, found again once "15 16 17 18" agree: eleven tokens after the copy broke off
    written = [91, 92, 93, 94, 95, 96, 97]
    drafter = MemoryDrafter(budget=8, max_depth=4)
    context = SOURCE + [0] + [10, 11, 12, 13]
    drafter.start(context)
    for token in written + [15, 16, 17, 18]:
        drafter.propose(context, 8, 4)
        context = context + [token]
    drafter.propose(context, 8, 4)
    assert (14,) in drafter.substitutions


def test_the_drafter_proposes_resumed_copies_in_their_own_bucket() -> None:
    drafter = MemoryDrafter(budget=8, max_depth=4)
    context = SOURCE + [0] + [10, 11, 12, 13]
    drafter.start(context)
    assert not drafter.propose(context, 8, 4).resumed        # a long match: an ordinary proposal that anchors
    context = context + [14, 99]
    proposal = drafter.propose(context, 8, 4)
    assert proposal.resumed and proposal.node_matches[0] == RESUMED
    best = max(range(len(proposal.tree)), key=lambda j: proposal.path_probs[j] if proposal.tree.parents[j] < 0 else 0)
    assert proposal.tree.tokens[best] == 16
    assert all(m > 0 for m, p in zip(proposal.node_matches, proposal.tree.parents) if p >= 0), \
        "deeper nodes continue a copy and are judged as copies"
    assert "resumes after an edit" in (drafter.draft(context, 4, 8) and drafter.note)
    assert BUCKET_LABELS[bucket(RESUMED)] == "resumed"


def test_a_guess_that_cannot_pay_gives_way_to_a_suffix_match_that_can() -> None:
    # the copy of SOURCE breaks off at 98 99, which the prompt wrote before (followed by 7): the answer writing again
    # what it wrote earlier, between two stretches of copied code
    prompt = SOURCE + [0, 98, 99, 7, 0] + [10, 11, 12, 13]
    context = prompt + [14, 98, 99]
    for least_first, resumed in ((lambda key: math.inf if key == RESUMED else 0.0, False),
                                 (lambda key: math.inf, True), (lambda key: 0.0, True)):
        drafter = MemoryDrafter(budget=8, max_depth=4)
        drafter.start(prompt)
        drafter.propose(prompt, 8, 4, least_first=least_first)   # anchors the copy
        proposal = drafter.propose(context, 8, 4, least_first=least_first)
        assert proposal.resumed == resumed and drafter.last_proposal is proposal
        if not resumed:
            assert proposal.match == 2 and proposal.tree.tokens[0] == 7 and proposal.node_matches[0] == key(2)


def test_statistics_written_before_the_resumed_bucket_still_load() -> None:
    old = {name: [1.0] * 7 for name in ("tested", "accepted", "predicted")}
    stats = MemoryStats.from_dict(old)
    assert stats.tested[:7] == [1.0] * 7 and sum(stats.tested[7:]) == 0.0
    with pytest.raises(ValueError):
        MemoryStats.from_dict({name: [1.0] * 6 for name in ("tested", "accepted", "predicted")})


def test_statistics_written_before_the_remembered_buckets_keep_their_resumed_bucket() -> None:
    old = {name: [1.0] * 7 + [2.0] for name in ("tested", "accepted", "predicted")}
    stats = MemoryStats.from_dict(old)
    assert stats.tested[:7] == [1.0] * 7 and stats.tested[bucket(RESUMED)] == 2.0
    assert sum(stats.tested[bucket(key(1, remembered=True)):bucket(RESUMED)]) == 0.0
    assert stats.tested[bucket(EDITED)] == 0.0


def test_statistics_written_before_the_edited_bucket_keep_every_other() -> None:
    old = {name: [float(i) for i in range(15)] for name in ("tested", "accepted", "predicted")}
    stats = MemoryStats.from_dict(old)
    assert stats.tested[:15] == old["tested"] and stats.tested[bucket(EDITED)] == 0.0


# -- exactness ----------------------------------------------------------------------------------------------------

# ends with a copy of 1..4: the first step drafts 5 from it; whenever the target writes something else instead, the
# second step drafts the guesses of where the copy resumes (a tree whose root has several children)
COPYING = [1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4]


def test_the_second_step_after_an_edit_is_a_resumed_tree() -> None:
    drafter = Memory(6, 1, min_match=1).make_drafter(None, GREEDY, None)
    drafter.start(COPYING)
    assert drafter.draft(COPYING, 1, 6).tokens == [5]
    drafter.draft(COPYING + [8], 1, 6)
    assert drafter.last_proposal.resumed and len(drafter.last_proposal.tree.children(-1)) >= 3


def copying(where: str, depth: int) -> tuple[Memory, list[int]]:
    """A memory strategy of 6 nodes ``depth`` deep and a prompt that ends copying ``1 2 3 4`` of ``1 .. 7``: of
    the prompt itself (``live``), or of a remembered answer that is not in the prompt (``remembered``, as when an
    answer is regenerated)."""
    if where == "live":
        return Memory(6, depth, min_match=1), COPYING
    memory = SuffixMemory("copied")
    memory.add_document([1, 2, 3, 4, 5, 6, 7])
    return Memory(6, depth, min_match=1).attached(memory), [0, 1, 2, 3, 4]


WHERE = ("live", "remembered")


def test_a_remembered_copy_that_breaks_off_is_resumed_and_its_edit_learnt() -> None:
    memory = SuffixMemory("earlier")
    memory.add_document(list(range(1, 12)))               # an earlier answer, not in the prompt
    drafter = Memory(6, 4, min_match=1).attached(memory).make_drafter(None, GREEDY, None)
    context = [0, 1, 2, 3, 4]
    drafter.start(context)
    assert drafter.draft(context, 4, 6).tokens[:1] == [5]
    context += [50]                                         # 50 written where the earlier answer had 5
    drafter.draft(context, 4, 6)
    proposal = drafter.last_proposal
    assert proposal.resumed, "guessed from the remembered text: the live one has no copy of it"
    best = max(range(len(proposal.tree)), key=lambda j: proposal.path_probs[j] if proposal.tree.parents[j] < 0 else 0)
    assert proposal.tree.tokens[best] == 6, "resumed as many tokens on"
    context += [6, 7, 8, 9]                                 # the copy found again
    drafter.draft(context, 4, 6)
    assert (5,) in drafter.substitutions, "what the regenerated answer changed is an edit learnt"


def test_a_regenerated_answer_edited_from_the_earlier_one_is_drafted_across_its_edits() -> None:
    source = list(range(10, 50))
    # the earlier answer is remembered, not in the prompt
    target, prompt = edited_copy_target(source, {8: [60], 20: [61, 62], 31: [63]}, 64, prompt=[0])
    expected = SpeculativeEngine(target, None, Baseline(), GREEDY).generate(prompt, 40).tokens
    calls = {}
    for name, resume in (("resumed", True), ("suffix only", False)):
        memory = SuffixMemory("earlier")
        memory.add_document(source)
        strategy = Memory(8, 8, resume=resume).attached(memory)
        result = SpeculativeEngine(target, None, strategy, GREEDY).generate(prompt, 40)
        assert result.tokens == expected, name
        calls[name] = result.stats.target_calls
    assert calls["resumed"] < calls["suffix only"], calls


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9),
                                    SamplingParams(temperature=1.3, top_k=3)], ids=["t1", "t0.7-p0.9", "t1.3-k3"])
def test_sampled_joint_distribution_is_exact_with_resumed_trees(params, where) -> None:
    vocab = 9
    target = TableBackend(random_table(vocab, seed=4), vocab, "target")
    strategy, prompt = copying(where, 1)
    got, expected = first_two_tokens_exact(target, None, strategy, params, prompt)
    assert float((got - expected).abs().max()) < 1e-9


def edited_copy_target(source: list[int], edits: dict[int, list[int]], vocab: int,
                       prompt: list[int] | None = None) -> tuple[TableBackend, list[int]]:
    """A target that writes ``source`` again with ``edits`` (position -> replacement tokens), then repeats it, after
    ``prompt`` (by default ``source`` itself and a 0)."""
    text = []
    for i, t in enumerate(source):
        text += edits.get(i, [t])
    prompt = source + [0] if prompt is None else prompt

    def table(ctx: tuple) -> torch.Tensor:
        written = len(ctx) - len(prompt)
        p = torch.full((vocab,), 1e-3, dtype=torch.float64)
        p[text[written % len(text)] if written >= 0 else 0] = 1.0
        return p / p.sum()

    return TableBackend(table, vocab, "edited"), prompt


def test_an_edited_copy_is_drafted_across_its_edits_and_stays_greedy_identical() -> None:
    source = list(range(10, 50))
    edits = {8: [60], 20: [61, 62], 31: [63]}     # a rename, a rename into two tokens, another rename
    target, prompt = edited_copy_target(source, edits, 64)
    expected = SpeculativeEngine(target, None, Baseline(), GREEDY).generate(prompt, 40).tokens
    calls = {}
    for name, strategy in (("resumed", Memory(8, 8)), ("suffix only", Memory(8, 8, resume=False))):
        result = SpeculativeEngine(target, None, strategy, GREEDY).generate(prompt, 40)
        assert result.tokens == expected, name
        calls[name] = result.stats.target_calls
    assert calls["resumed"] < calls["suffix only"], calls


def test_greedy_identical_to_baseline_on_edited_prompts() -> None:
    target = tiny_backend("qwen2", vocab=48, seed=11)
    rng = np.random.default_rng(12)
    drafted = 0
    for case in range(8):
        source = rng.integers(1, 48, 12).tolist()
        copy = list(source)
        copy[rng.integers(4, 12)] = int(rng.integers(1, 48))
        prompt = source + [0] + copy[:rng.integers(6, 12)]
        expected = SpeculativeEngine(target, None, Baseline(), GREEDY).generate(prompt, 16).tokens
        result = SpeculativeEngine(target, None, Memory(8, 6, min_match=1), GREEDY).generate(prompt, 16)
        assert result.tokens == expected, f"case {case}"
        drafted += result.stats.drafted
    assert drafted > 0


@pytest.mark.slow
@pytest.mark.parametrize("where", WHERE)
def test_chi_square_first_two_tokens_with_resumed_trees(where) -> None:
    from tests.chi_square import ALPHA, N, chi_square_p, exact_joint, sampled_joint, tiny_target

    target = tiny_target()
    params = SamplingParams(temperature=1.0)
    strategy, prompt = copying(where, 2)
    joint = exact_joint(target, params, prompt)
    assert float(joint[5].sum()) < 0.5, "the target mostly leaves the copy here, so the second step is resumed"
    p = chi_square_p(sampled_joint(target, None, strategy, params, prompt), joint)
    print(f"\nchi-square resumed memory trees ({where}) T=1.0: p = {p:.4f} (N={N})")
    assert p > ALPHA
