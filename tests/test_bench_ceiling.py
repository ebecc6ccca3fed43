"""The speculation ceiling (core/bench/ceiling.py): copy lengths against a brute-force search, the oracle's search
against every way to split an answer into steps, and a real memory drafter reaching it on a regenerated answer."""
from __future__ import annotations

import itertools
import random

import pytest

from core.bench.ceiling import ceiling, copy_lengths, envelope
from core.drafting import Baseline
from core.engine import SpeculativeEngine
from core.memory import Memory, SuffixMemory
from core.sampling import SamplingParams
from tests.tiny_models import tiny_backend

GREEDY = SamplingParams(temperature=0.0)


def occurs(needle: list[int], text: list[int]) -> bool:
    return any(text[j:j + len(needle)] == needle for j in range(len(text) - len(needle) + 1))


@pytest.mark.parametrize("seed", range(6))
def test_copy_lengths_are_the_longest_stretches_seen_before(seed) -> None:
    rnd = random.Random(seed)
    known = [rnd.randrange(4) for _ in range(rnd.randint(0, 12))]
    answer = [rnd.randrange(4) for _ in range(rnd.randint(1, 12))]
    seen = known + answer
    for i, length in enumerate(copy_lengths(known, answer)):
        before = seen[:len(known) + i]
        assert length == max((k for k in range(len(answer) - i + 1) if occurs(answer[i:i + k], before)), default=0)


def brute_force(lengths, cost, max_call, draft_call) -> float:
    """Plain decoding's time over the least time of any split of the answer into steps."""
    n = len(lengths)
    best = float("inf")
    for cuts in itertools.product((False, True), repeat=n - 1):
        bounds = [0] + [i + 1 for i, cut in enumerate(cuts) if cut] + [n]
        total = 0.0
        for a, b in zip(bounds, bounds[1:]):
            k = b - a - 1           # drafted tokens of the step, the last token of each step being the bonus
            if k + 1 > max_call:
                break
            # the fewest drafted tokens no copy covers: copies chain from a, a stretch of lengths[j] at a time
            uncovered = min(sum(1 for j in range(a, a + k) if not covered[j]) for covered in _coverings(lengths, a, k))
            if uncovered and draft_call is None:
                break
            total += min(cost(m) for m in range(k + 1, max_call + 1)) + uncovered * (draft_call or 0.0)
        else:
            best = min(best, total)
    return n * min(cost(m) for m in range(1, max_call + 1)) / best


def _coverings(lengths, a, k):
    """Every marking of positions a..a+k-1 as copied (True) by chains of copies of allowed lengths."""
    out = []

    def walk(j, marks):
        if j == a + k:
            out.append(dict(marks))
            return
        walk(j + 1, {**marks, j: False})
        for length in range(1, min(lengths[j], a + k - j) + 1):
            walk(j + length, {**marks, **{p: True for p in range(j, j + length)}})
    walk(a, {})
    return out


@pytest.mark.parametrize("seed", range(12))
def test_the_oracle_finds_the_fastest_split(seed) -> None:
    rnd = random.Random(seed)
    n = rnd.randint(1, 8)
    lengths = [rnd.randint(0, n - i) for i in range(n)]
    table = {m: 1.0 + rnd.uniform(0.2, 1.2) * (m - 1) for m in range(1, 6)}
    draft_call = rnd.choice([None, 0.1, 0.4])
    speedup, steps = ceiling(lengths, table.__getitem__, 5, draft_call)
    assert speedup == pytest.approx(brute_force(lengths, table.__getitem__, 5, draft_call))
    assert sum(steps) == n and all(1 <= s <= 5 for s in steps)


def test_a_call_that_costs_its_length_leaves_nothing_to_gain() -> None:
    lengths = [20 - i for i in range(20)]
    assert ceiling(lengths, lambda m: 0.05 * m, 16, draft_call=0.0)[0] == pytest.approx(1.0)


def test_free_calls_give_one_call_per_max_call_tokens() -> None:
    speedup, steps = ceiling([40 - i for i in range(40)], lambda m: 1.0, 16)
    assert sorted(steps) == [8, 16, 16] and speedup == pytest.approx(40 / 3)
    # nothing copyable and no model: plain decoding
    assert ceiling([0] * 10, lambda m: 1.0, 16) == (1.0, [1] * 10)


def test_the_envelope_pads_a_call_to_a_cheaper_size() -> None:
    table = {1: 1.0, 2: 1.5, 3: 3.0, 4: 2.0}
    least = envelope(table.__getitem__, 4)
    assert [least(m) for m in range(1, 5)] == [1.0, 1.5, 2.0, 2.0]


def test_regenerating_from_memory_reaches_the_ceiling_and_no_further() -> None:
    """Regenerate remembered answers with memory drafts on a tiny model, charge every step the cost of its call on
    a made-up table: a copy of the whole answer is what the oracle drafts too, so the two times agree."""
    target = tiny_backend("qwen2", vocab=48, seed=3)
    rnd = random.Random(7)
    table = {m: 1.0 + 0.3 * (m - 1) for m in range(1, 17)}
    for _ in range(6):
        motif = [rnd.randrange(48) for _ in range(rnd.randint(2, 5))]
        prompt = (motif * 6)[: rnd.randint(8, 24)]
        answer = list(SpeculativeEngine(target, None, Baseline(), GREEDY).generate(prompt, 24).tokens)
        memory = SuffixMemory("tiny")
        memory.add_answer(prompt, answer)
        run = SpeculativeEngine(target, None, Memory(15, 15, min_match=1).attached(memory), GREEDY).generate(prompt, 24)
        assert list(run.tokens) == answer
        achieved = len(answer) * table[1] / sum(table[len(step.nodes) + 1] for step in run.steps)
        bound, _ = ceiling(copy_lengths(prompt + answer, answer), table.__getitem__, 16)
        assert achieved == pytest.approx(bound) and achieved > 2.0
