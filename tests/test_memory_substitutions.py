"""Substitutions (core.memory.substitutions): an edit seen once where a copy broke off and resumed is applied where the
copy meets the same source tokens again; the trees it drafts keep decoding exact (enumeration, greedy identity,
chi-square), and a rename used several times is drafted through at its later uses."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from core.drafting import Baseline
from core.engine import SpeculativeEngine
from core.events import Origin
from core.memory import Memory, MemoryDrafter
from core.memory.index import SEP, LiveIndex
from core.memory.resume import CopyAnchor
from core.memory.spelling import Spelling
from core.memory.stats import EDITED, key
from core.memory.substitutions import MAX_KEPT, MAX_TOKENS, Substitutions
from core.sampling import SamplingParams
from tests.exact import first_two_tokens_exact, greedy_identical_on_random_tables
from tests.test_memory_resume import edited_copy_target
from tests.table_backend import TableBackend, random_table

GREEDY = SamplingParams(temperature=0.0)
SOURCE = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]


def edit_closed(context: list[int], copied_up_to: int):
    """What the anchor says when ``context`` finds its copy again, having anchored after ``copied_up_to`` tokens."""
    anchor = CopyAnchor()
    live = LiveIndex(context[:copied_up_to])
    assert anchor.follow(live, *live.longest()) is None, "the first anchor closes nothing"
    live.sync(context)
    return anchor.follow(live, *live.longest())


def test_a_copy_found_again_after_a_change_says_what_changed() -> None:
    # "10 11 12 13" copied, 99 written where the source has 14, then "15 16 17 18" copied again
    assert edit_closed(SOURCE + [0, 10, 11, 12, 13, 99, 15, 16, 17, 18], 15) == ((14,), (99,))
    # a name of one token written as two, and two source tokens written as one
    assert edit_closed(SOURCE + [0, 10, 11, 12, 13, 98, 99, 15, 16, 17, 18], 15) == ((14,), (98, 99))
    assert edit_closed(SOURCE + [0, 10, 11, 12, 13, 99, 16, 17, 18, 19], 15) == ((14, 15), (99,))


def test_a_line_that_repeats_in_the_source_is_not_taken_for_the_copy_resuming_further_on() -> None:
    # source "1 2 3 4 c 7 8 9 5 / t 7 8 9 5 / 6": c renamed to 99; what follows it also follows t a line later
    source = [1, 2, 3, 4, 21, 7, 8, 9, 5, 22, 7, 8, 9, 5, 6]
    context = source + [0, 1, 2, 3, 4, 99, 7, 8, 9, 5]
    assert edit_closed(context, len(source) + 5) == ((21,), (99,)), "not 'c 7 8 9 5 t' -> 99"


def test_an_edit_of_as_many_tokens_is_learnt_as_each_change_in_it() -> None:
    subs = Substitutions()
    subs.learn((14, 3, 4, 14, 5), (99, 3, 4, 99, 5))      # "(item), []).append(item)" -> "(record) ... (record)"
    assert (14,) in subs and (14, 3, 4, 14) not in subs
    got = subs.applied(rows([2, 14, 6], width=3), depth=3, at=0)
    assert got.tolist() == [[2, 99, 6]], "the change applies where the rest of the edit does not recur"
    subs.learn((15, 16, 3), (98, 97, 3))                   # a run of two changed tokens stays one substitution
    assert (15, 16) in subs and (15,) not in subs


def test_an_unbroken_copy_or_an_insertion_is_no_substitution() -> None:
    assert edit_closed(SOURCE + [0, 10, 11, 12, 13, 14, 15, 16, 17], 15) is None
    # 99 inserted before 14: the copy resumes where it stopped, no source token was replaced
    assert edit_closed(SOURCE + [0, 10, 11, 12, 13, 99, 14, 15, 16, 17], 15) is None


def rows(*lists: list[int], width: int) -> np.ndarray:
    return np.array([r + [SEP] * (width - len(r)) for r in lists], np.int64)


def test_rows_carry_the_new_tokens_wherever_the_source_has_the_old() -> None:
    subs = Substitutions()
    subs.learn((14,), (98, 99))
    subs.learn((16, 17), (7,))
    got = subs.applied(rows([13, 14, 15, 16, 17, 18, 19], [14, 14, 1, 2], [1, 2, 3], width=7), depth=5, at=0)
    assert got.tolist() == [[13, 98, 99, 15, 7], [98, 99, 98, 99, 1], [1, 2, 3, SEP, SEP]]
    assert subs.widest == 1, "a shorter new needs one more source token to fill the row"


def carried(written: list[int], new: tuple[int, ...] = (99,)) -> list[int]:
    """The continuation ``13 14 15`` drafted after ``14 -> new``, carried by that same continuation after a context of
    10 tokens, met the text then writing ``written`` there."""
    subs = Substitutions()
    subs.learn((14,), new)
    subs.applied(rows([13, 14, 15], width=3), depth=3, at=10)
    subs.check(np.array([0] * 10 + written))
    return [t for t in subs.applied(rows([13, 14, 15], width=3), depth=3, at=20)[0].tolist() if t != SEP]


def test_a_substitution_is_judged_by_what_the_text_wrote_where_it_was_carried() -> None:
    assert carried([13, 99, 15]) == [13, 99, 15], "made: kept"
    assert carried([13, 14, 15]) == [13, 14, 15], "the old tokens written (a rename in one function only): forgotten"
    assert carried([50, 51]) == [13, 99, 15], "the text left the continuation before the substitution: it says nothing"
    assert carried([13]) == [13, 99, 15], "not reached yet: kept"


def test_an_edit_made_each_time_another_way_keeps_what_it_wrote_each_time_and_ends_the_draft_there() -> None:
    # "return None" -> 'raise ValueError("Invalid port")', then 'raise ValueError("Port out of range")'
    assert carried([13, 99, 98, 77], new=(99, 98, 97)) == [13, 99, 98], "the start both wrote, then nothing"
    assert carried([13, 77]) == [13], "nothing in common (values that change line by line): the draft ends before"
    assert carried([13, 99, 98, 96], new=(99, 98, 97, 95)) == [13, 99, 98]
    # the open substitution is judged in turn: the old tokens written, it goes
    subs = Substitutions()
    subs.learn((14,), (99, 98))
    for at, written in ((10, [13, 99, 77]), (20, [13, 14, 15])):
        subs.applied(rows([13, 14, 15], width=3), depth=3, at=at)
        subs.check(np.array([0] * at + written))
    assert (14,) not in subs


def test_an_edit_made_again_the_way_it_varies_keeps_its_open_start() -> None:
    subs = Substitutions()
    subs.learn((14,), (99, 98, 97))
    subs.applied(rows([13, 14, 15], width=3), depth=3, at=10)
    subs.check(np.array([0] * 10 + [13, 99, 98, 77]))
    subs.learn((14,), (99, 98, 76))         # the next edit found again: its tail is new again
    assert subs.applied(rows([13, 14, 15], width=3), depth=3, at=20).tolist() == [[13, 99, 98]]
    subs.learn((14,), (55,))                # made another way altogether: learnt afresh
    assert subs.applied(rows([13, 14, 15], width=3), depth=3, at=20).tolist() == [[13, 55, 15]]


def test_a_guess_of_where_a_copy_resumes_that_the_text_did_not_take_forgets_nothing() -> None:
    def kept(guessed: bool) -> bool:
        subs = Substitutions()
        subs.learn((14,), (99,))
        subs.applied(rows([14, 15], width=2), depth=2, at=10, guessed=guessed)     # the guess starts at the old name
        subs.check(np.array([0] * 10 + [40, 41]))          # the copy resumed elsewhere
        return subs.applied(rows([14, 15], width=2), depth=2, at=20).tolist() == [[99, 15]]

    assert kept(guessed=True)
    assert not kept(guessed=False), "after a match, the text reaching the old name and writing else is evidence"


def test_an_edit_made_again_is_kept_over_edits_made_once_since() -> None:
    subs = Substitutions()
    subs.learn((1000,), (2000,))
    for k in range(1, MAX_KEPT):
        subs.learn((1000 + k,), (2000 + k,))
    subs.learn((1000,), (2000,))                        # the first edit made again: now the latest
    subs.learn((1000 + MAX_KEPT,), (2000 + MAX_KEPT,))   # one more than are kept: the oldest goes
    assert (1000,) in subs and (1001,) not in subs and len(subs) == MAX_KEPT
    assert subs.proven((1000,))


def test_only_substitutions_are_learnt() -> None:
    subs = Substitutions()
    for old, new in (((), (1,)), ((3,), ()), ((3,), (3,)), (tuple(range(MAX_TOKENS + 1)), (1,))):
        subs.learn(old, new)
        assert old not in subs, (old, new)


def test_the_drafter_drafts_a_renamed_name_at_its_next_use() -> None:
    name, renamed = 14, 60
    source = [10, 11, 12, 13, name, 15, 16, 17, 18, 19, 20, 21, name, 22, 23, 24]
    drafter = MemoryDrafter(budget=8, max_depth=8)
    written = [0, 10, 11, 12, 13]
    drafter.start(source + written)
    drafter.propose(source + written, 8, 8)
    for token in [renamed, 15, 16, 17, 18]:       # the first use renamed, then the copy found again
        written.append(token)
        drafter.propose(source + written, 8, 8)
    assert (name,) in drafter.substitutions
    written += [19, 20]
    proposal = drafter.propose(source + written, 8, 8)
    assert proposal.tree.tokens[:4] == [21, renamed, 22, 23], "the copy runs through the next use of the new name"


def test_a_copy_is_followed_through_its_edits_past_the_new_name_s_first_use() -> None:
    """After ``name`` -> ``renamed`` is learnt, the text's latest tokens ``renamed 15 16 17`` match best where the new
    name was first written (followed by 40), but the line being copied goes on with 50: the copy, followed through
    the edit, agrees for longer."""
    name, renamed = 14, 60
    source = [9, 10, 11, 12, name, 15, 16, 17, 40, 41, 42, 43, name, 15, 16, 17, 50, 51]
    written = [0, 9, 10, 11, 12]
    drafter = MemoryDrafter(budget=8, max_depth=8)
    drafter.start(source + written)
    drafter.propose(source + written, 8, 8)
    for token in [renamed, 15, 16, 17, 40, 41, 42, 43, renamed, 15, 16, 17]:
        written.append(token)
        proposal = drafter.propose(source + written, 8, 8)
    assert drafter.live.longest()[0] >= 4, "the new name's first use is a match of its own"
    assert proposal.tree.tokens[:2] == [50, 51] and proposal.substituted
    assert proposal.node_matches[0] > 8, "keyed by the copy's agreement, edits included"


def test_the_anchor_goes_through_learnt_edits_only() -> None:
    subs = Substitutions()
    subs.learn((14,), (60, 61))                     # one source token written as two
    source = [9, 10, 11, 12, 14, 15, 16]
    live = LiveIndex(source + [0, 9, 10, 11, 12])
    anchor = CopyAnchor()
    anchor.follow(live, *live.longest())
    live.extend([60, 61, 15])
    assert anchor.through(live, subs) == (4 + 3, 5), "the copy goes on after source token 15 (index 5)"
    live.extend([77])
    assert anchor.through(live, subs) is None, "77 is no copy of 16"
    plain = CopyAnchor()
    live = LiveIndex(source + [0, 9, 10, 11, 12])
    plain.follow(live, *live.longest())
    live.extend([14, 15])
    assert plain.through(live, subs) is None, "a copy with no edit made is the suffix match's"


def drafted_renames(target, prompt: list[int], renamed: int) -> tuple[tuple[int, ...], int]:
    """(tokens, how many times the new name was a drafted token the target accepted) of a greedy Memory decode."""
    engine = SpeculativeEngine(target, None, Memory(8, 8), GREEDY)
    accepted = sum(token == renamed and origin is Origin.DRAFT
                   for event in engine.stream(prompt, 60) for token, origin in zip(event.tokens, event.origins))
    return engine.last_result.tokens, accepted


def test_a_rename_used_often_is_drafted_through_and_stays_greedy_identical(monkeypatch) -> None:
    source = list(range(10, 70))
    name, renamed = 5, 70
    for at in (6, 18, 30, 42, 54):
        source[at] = name
    target, prompt = edited_copy_target(source, {i: [renamed] for i, t in enumerate(source) if t == name}, 72)
    expected = SpeculativeEngine(target, None, Baseline(), GREEDY).generate(prompt, 60).tokens
    tokens, drafted = drafted_renames(target, prompt, renamed)
    assert tokens == expected and drafted >= 2, drafted
    monkeypatch.setattr(Substitutions, "learn", lambda self, old, new: None)
    tokens, drafted = drafted_renames(target, prompt, renamed)
    assert tokens == expected and drafted == 0, "without substitutions the new name is only ever the target's own"


def test_an_edit_made_once_is_drafted_as_a_guess_until_it_is_made_again() -> None:
    # "10 .. 19 / 10 11 12 13 99 15": 14 -> 99 learnt; the copy of "12 13 14" comes again at the end
    drafter = MemoryDrafter(budget=8, max_depth=4)
    context = SOURCE + [0, 10, 11, 12, 13, 99, 15, 16, 17, 18, 1, 12, 13]
    drafter.start(context)
    drafter.substitutions.learn((14,), (99,))

    def edited_key() -> int:
        proposal = drafter.propose(context, 8, 4)
        return proposal.node_matches[proposal.tree.tokens.index(99)]

    assert edited_key() == EDITED
    drafter.substitutions.learn((14,), (99,))           # made again (the copy found once more after it)
    assert edited_key() == key(2), "a proven edit is judged as the copy it continues"


# -- exactness of trees drafted through a substitution -------------------------------------------------------------

OLD, NEW = (5,), (2,)
TAUGHT_PROMPT = [1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4]    # ends copying 1..4: the copy goes on with 5 -> 2
THROUGH_PROMPT = [1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 2, 6]     # ... and has made it: the copy goes on after 6
THROUGH_ANCHOR = 12         # the suffix match anchored the copy after "0 1 2 3 4"


RESPELT_PROMPT = [1, 2, 3, 4, 6, 0, 1, 2, 3, 4]     # ends copying 1..4: the copy goes on with 6, "(p"
# the tokens' texts for the ``respelt`` setup: OLD " p" -> NEW " price" renames p, which token 6 "(p" also spells
SPELLING = Spelling(lambda ids: "".join(["\n", " a", " price", " =", " b", " p", "(p", "(price"][i] for i in ids),
                    lambda text: {"(price": [7]}[text])


@dataclass(frozen=True)
class Taught(Memory):
    """Memory drafts from a drafter that has already learnt ``OLD -> NEW`` (as after an earlier rename), its copy
    anchored after the prompt's first ``anchored`` tokens when given (then followed through the edit), or, when
    ``opened``, an edit of ``OLD`` made twice in different ways, that starts with ``NEW``; ``respelt``: with the
    tokenizer's spelling, by which the rename reaches another token (core.memory.substitutions)."""

    anchored: int = 0
    opened: bool = False
    respelt: bool = False

    def make_drafter(self, draft, params, rng) -> MemoryDrafter:
        drafter = super().make_drafter(draft, params, rng)
        drafter.spelling = SPELLING if self.respelt else None
        start = drafter.start

        def taught(prompt, cancel=None, stops=()) -> None:
            start(prompt, cancel, stops)
            if self.opened:     # made as "2 6", then as "2 8": the copy's draft ends after 2
                drafter.substitutions.learn(OLD, NEW + (6,))
                drafter.substitutions.applied(rows([5, 6], width=2), depth=2, at=0)
                drafter.substitutions.check(np.array(NEW + (8,)))
            else:
                drafter.substitutions.learn(OLD, NEW)
            if self.anchored:
                live = LiveIndex(prompt[:self.anchored])
                drafter.anchor.follow(live, *live.longest())

        drafter.start = taught
        return drafter


TAUGHT = {"substituted": (0, TAUGHT_PROMPT, False, False), "through": (THROUGH_ANCHOR, THROUGH_PROMPT, False, False),
          "open": (0, TAUGHT_PROMPT, True, False), "respelt": (0, RESPELT_PROMPT, False, True)}


def taught(setup: str, depth: int) -> tuple[Taught, list[int]]:
    """The strategy of a ``TAUGHT`` setup drafting 6 nodes ``depth`` deep, and its prompt."""
    anchored, prompt, opened, respelt = TAUGHT[setup]
    return Taught(6, depth, min_match=1, anchored=anchored, opened=opened, respelt=respelt), prompt


def test_the_taught_drafter_drafts_the_substitution_first() -> None:
    drafter = Taught(6, 2, min_match=1).make_drafter(None, GREEDY, None)
    drafter.start(TAUGHT_PROMPT)
    assert drafter.draft(TAUGHT_PROMPT, 2, 6).tokens[:2] == [2, 6]


def test_the_opened_drafter_drafts_the_edit_s_start_and_ends_there() -> None:
    drafter = Taught(6, 2, min_match=1, opened=True).make_drafter(None, GREEDY, None)
    drafter.start(TAUGHT_PROMPT)
    assert drafter.draft(TAUGHT_PROMPT, 2, 6).tokens == [2]


def test_the_respelling_drafter_drafts_the_new_name_in_the_other_token_first() -> None:
    strategy, prompt = taught("respelt", 2)
    drafter = strategy.make_drafter(None, GREEDY, None)
    drafter.start(prompt)
    assert drafter.draft(prompt, 2, 6).tokens[:2] == [7, 0], "(p drafted as (price"


def test_the_anchored_drafter_follows_the_copy_through_the_edit() -> None:
    drafter = Taught(6, 2, min_match=1, anchored=THROUGH_ANCHOR).make_drafter(None, GREEDY, None)
    drafter.start(THROUGH_PROMPT)
    assert drafter.draft(THROUGH_PROMPT, 2, 6).tokens[:2] == [7, 0]
    assert drafter.last_proposal.match == 4 + 2 and drafter.last_proposal.substituted


@pytest.mark.parametrize("setup", TAUGHT)
@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9),
                                    SamplingParams(temperature=1.3, top_k=3)], ids=["t1", "t0.7-p0.9", "t1.3-k3"])
def test_sampled_joint_distribution_is_exact_through_substitutions(params, setup) -> None:
    vocab = 9
    strategy, prompt = taught(setup, 2)
    target = TableBackend(random_table(vocab, seed=5), vocab, "target")
    got, expected = first_two_tokens_exact(target, None, strategy, params, prompt)
    assert float((got - expected).abs().max()) < 1e-9


@pytest.mark.parametrize("setup", TAUGHT)
def test_greedy_identical_through_substitutions_on_random_targets(setup) -> None:
    assert greedy_identical_on_random_tables(*taught(setup, 4)) > 0


@pytest.mark.slow
@pytest.mark.parametrize("setup", TAUGHT)
def test_chi_square_first_two_tokens_through_substitutions(setup) -> None:
    from tests.chi_square import ALPHA, N, chi_square_p, exact_joint, sampled_joint, tiny_target

    strategy, prompt = taught(setup, 2)
    target, params = tiny_target(), SamplingParams(temperature=1.0)
    joint = exact_joint(target, params, prompt)
    p = chi_square_p(sampled_joint(target, None, strategy, params, prompt), joint)
    print(f"\nchi-square memory trees {setup} T=1.0: p = {p:.4f} (N={N})")
    assert p > ALPHA


def test_a_tree_carrying_an_edit_says_so() -> None:
    drafter = Taught(6, 2, min_match=1).make_drafter(None, GREEDY, None)
    drafter.start(TAUGHT_PROMPT)
    drafter.draft(TAUGHT_PROMPT, 2, 6)
    assert drafter.last_proposal.substituted and drafter.note.endswith("applying an edit seen earlier")
    plain = MemoryDrafter(budget=6, max_depth=2, min_match=1)
    plain.start(TAUGHT_PROMPT)
    plain.draft(TAUGHT_PROMPT, 2, 6)
    assert not plain.last_proposal.substituted and "edit" not in plain.note
