"""Resuming a copy after an edit (core.memory.resume): where the guesses point, that the trees they make keep decoding
exact (enumeration, greedy identity, chi-square), and that an edited copy is drafted across its edits."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from core.drafting import Baseline
from core.engine import SpeculativeEngine
from core.memory import Memory, MemoryDrafter
from core.memory.index import LiveIndex
from core.memory.resume import ANCHOR_MATCH, MAX_GAP, MAX_KEPT_GAP, CopyAnchor
from core.memory.stats import EDITED, RESUMED, MemoryStats, bucket, key
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
    assert bucket(RESUMED) == len(MemoryStats().tested) - 2


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


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9),
                                    SamplingParams(temperature=1.3, top_k=3)], ids=["t1", "t0.7-p0.9", "t1.3-k3"])
def test_sampled_joint_distribution_is_exact_with_resumed_trees(params) -> None:
    vocab = 9
    target = TableBackend(random_table(vocab, seed=4), vocab, "target")
    got, expected = first_two_tokens_exact(target, None, Memory(6, 1, min_match=1), params, COPYING)
    assert float((got - expected).abs().max()) < 1e-9


def edited_copy_target(source: list[int], edits: dict[int, list[int]], vocab: int) -> tuple[TableBackend, list[int]]:
    """A target that writes ``source`` again with ``edits`` (position -> replacement tokens), then repeats it."""
    text = []
    for i, t in enumerate(source):
        text += edits.get(i, [t])
    prompt = source + [0]

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
def test_chi_square_first_two_tokens_with_resumed_trees() -> None:
    from tests.chi_square import ALPHA, N, chi_square_p, exact_joint, sampled_joint, tiny_target

    prompt = [1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4]
    target = tiny_target()
    params = SamplingParams(temperature=1.0)
    strategy = Memory(6, 2, min_match=1)
    joint = exact_joint(target, params, prompt)
    assert float(joint[5].sum()) < 0.5, "the target mostly leaves the copy here, so the second step is resumed"
    p = chi_square_p(sampled_joint(target, None, strategy, params, prompt), joint)
    print(f"\nchi-square resumed memory trees T=1.0: p = {p:.4f} (N={N})")
    assert p > ALPHA
