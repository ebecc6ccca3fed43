"""Renames carried to other tokens (core.memory.spelling, core.memory.substitutions): a name a learnt substitution
renames is spelt anew in the other tokens that hold it (``(p`` -> ``(price`` once `` p`` -> `` price`` is learnt),
never inside a longer name or as an attribute, dropped where the text keeps the old token; the trees it drafts stay
exact (tests/test_memory_substitutions.py's ``respelt`` setup) and a decode through it is the target's greedy one."""
from __future__ import annotations

import numpy as np
import torch

from core.auto import Auto
from core.auto.costs import Latencies
from core.auto.plan import Plan
from core.drafting import Baseline
from core.engine import SpeculativeEngine
from core.memory import SuffixMemory
from core.memory.index import SEP
from core.memory.spelling import Spelling
from core.memory.substitutions import Substitutions, renames
from core.sampling import SamplingParams
from tests.table_backend import TableBackend

TEXTS = ["\n", "def", " calc", "(p", ",", " rate", "):", " return", " p", " *", " price", "(price", " compute",
         "rices", ".items", "()", " items", " records", "(...", "arr", " arr", " prices", "prices", " sum", "(",
         ")"]
ID = {text: i for i, text in enumerate(TEXTS)}


def spelt(*texts: str) -> list[int]:
    return [ID[t] for t in texts]


def tokenize(text: str) -> list[int]:
    """The toy vocabulary's tokens of a text that is one of them (anything else: the tokenizer cannot say)."""
    return [ID[text]]


SPELLING = Spelling(lambda ids: "".join(TEXTS[i] for i in ids), tokenize)


def rows(*lists: list[int], width: int = 6) -> np.ndarray:
    return np.array([r + [SEP] * (width - len(r)) for r in lists], np.int64)


def applied(subs: Substitutions, *lists: list[int]) -> list[list[str]]:
    out = subs.applied(rows(*lists), depth=6, at=0)
    return [[TEXTS[t] for t in row if t != SEP] for row in out.tolist()]


def renamed(old: str, new: str) -> Substitutions:
    subs = Substitutions(SPELLING)
    subs.learn(tuple(spelt(old)), tuple(spelt(new)))
    return subs


def test_the_names_an_edit_renames_are_read_from_its_text() -> None:
    assert renames(" calc(p", " compute(price") == {(False, "calc"): "compute", (False, "p"): "price"}
    assert renames("x.items()", "x.records()") == {(True, "items"): "records"}
    assert renames("...arr", "...prices") == {(False, "arr"): "prices"}, "a spread is no attribute"
    assert renames("0.2", "0.1") == {}, "a value is no name"
    assert renames("return None", 'raise ValueError("')  == {}, "not the same shape: no rename"
    assert renames(" p", " p") == {}


def test_a_rename_reaches_the_other_tokens_that_spell_the_name() -> None:
    subs = renamed(" p", " price")
    assert applied(subs, spelt(" calc", "(p", ",", " rate", "):")) == [[" calc", "(price", ",", " rate", "):"]]
    assert applied(subs, spelt(" return", " p", " *", " rate")) == [[" return", " price", " *", " rate"]]


def test_a_name_inside_a_longer_one_or_an_attribute_is_not_renamed() -> None:
    subs = renamed(" p", " price")
    assert applied(subs, spelt("(p", "rices", ")")) == [["(p", "rices", ")"]], "(p + rices is (prices"
    items = renamed(" items", " records")
    assert applied(items, spelt(" sum", ".items", "()")) == [[" sum", ".items", "()"]], "a method of another name"
    arr = renamed(" arr", " prices")
    assert applied(arr, spelt("(...", "arr", ")")) == [["(...", "prices", ")"]], "a spread of the variable"


def test_a_respelling_the_text_does_not_write_is_dropped_for_good() -> None:
    subs = renamed(" p", " price")
    subs.applied(rows(spelt(" calc", "(p", ",")), depth=6, at=10)
    subs.check(np.array([0] * 10 + spelt(" calc", "(p", ",")))      # the text kept (p here (another function's p)
    assert applied(subs, spelt(" calc", "(p", ",")) == [[" calc", "(p", ","]]
    assert (ID[" p"],) in subs, "the rename learnt from the text stays"


def test_a_respelling_is_a_guess_until_the_text_makes_it() -> None:
    subs = renamed(" p", " price")
    _, starts = subs.edited(rows(spelt(" calc", "(p", ",")), depth=6, at=10)
    assert starts is not None and starts[0].tolist()[:3] == [False, True, False]
    subs.check(np.array([0] * 10 + spelt(" calc", "(price", ",")))     # made
    _, starts = subs.edited(rows(spelt(" calc", "(p", ",")), depth=6, at=20)
    assert starts is None, "made once where it was carried: judged as the copy it continues"


def test_without_a_tokenizer_a_rename_stays_on_its_own_tokens() -> None:
    subs = Substitutions()
    subs.learn(tuple(spelt(" p")), tuple(spelt(" price")))
    assert applied(subs, spelt(" calc", "(p", ",")) == [[" calc", "(p", ","]]
    cannot = Spelling(lambda ids: "", tokenize)
    assert cannot.text(3) == "" and Spelling(str, lambda text: 1 / 0).tokens("x") is None


def test_renames_made_elsewhere_do_not_stay_once_their_edit_is_forgotten() -> None:
    subs = renamed(" p", " price")
    assert applied(subs, spelt("(p", ")")) == [["(price", ")"]]
    subs.applied(rows(spelt(" return", " p")), depth=6, at=10)
    subs.check(np.array([0] * 10 + spelt(" return", " p")))         # the rename itself undone
    assert applied(subs, spelt("(p", ")")) == [["(p", ")"]]


class SpeltTable(TableBackend):
    """A table target whose tokens are the toy vocabulary's texts."""

    def tokenize(self, text: str) -> list[int]:
        return tokenize(text)

    def detokenize(self, ids) -> str:
        return "".join(TEXTS[i] for i in ids)


def test_auto_decodes_a_rename_through_its_other_spellings_as_the_target_does() -> None:
    # given code whose p is renamed price, first as " p" (learnt there), then as "(p" in "calc(p, rate)"
    source = spelt("def", " sum", "(", ")", "):", "\n", " return", " rate", " *", " rate", "\n", " return", " p",
                   " *", " rate", "\n", "def", " calc", "(p", ",", " rate", "):", "\n", " return", " sum", "\n")
    text = [{ID["(p"]: ID["(price"], ID[" p"]: ID[" price"]}.get(t, t) for t in source]
    prompt = source + [ID["\n"]]

    def table(ctx: tuple) -> torch.Tensor:
        p = torch.full((len(TEXTS),), 1e-3, dtype=torch.float64)
        p[text[(len(ctx) - len(prompt)) % len(text)] if len(ctx) >= len(prompt) else 0] = 1.0
        return p / p.sum()

    target = SpeltTable(table, len(TEXTS), "renaming")
    greedy = SamplingParams(temperature=0.0)
    expected = SpeculativeEngine(target, None, Baseline(), greedy).generate(prompt, len(text)).tokens
    cheap = Plan({}, Latencies({1: 1.0, 2: 1.3, 4: 1.9, 16: 6.0}))

    def decoded(spelling: bool):
        auto = Auto(plan=cheap, memory=SuffixMemory("scripted"), clock=None)
        engine = SpeculativeEngine(target, None, auto, greedy)
        if not spelling:        # bound to this target, Auto keeps a spelling that cannot say
            auto.bind(target, None, greedy)
            auto.spelling = Spelling(lambda ids: "", tokenize)
        result = engine.generate(prompt, len(text))
        return result.tokens, result.stats.drafted - result.stats.accepted, result.stats.target_calls

    with_spelling, without = decoded(True), decoded(False)
    print(with_spelling[1:], without[1:])
    assert with_spelling[0] == without[0] == expected
    assert with_spelling[1] < without[1], "(p drafted as (price rather than as itself, to be rejected"
