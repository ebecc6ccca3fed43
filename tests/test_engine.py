"""Engine behaviour around the decode loop: events, stop conditions, cancellation and bad input."""
from __future__ import annotations

import subprocess
import sys
import threading

import pytest
import torch

from core.backends.base import ContextLengthError
from core.drafting import Baseline, Chain, Tree
from core.backends.base import IncompatibleModelsError
from core.engine import EmptyPromptError, SpeculativeEngine
from core.events import Fate, GenerationStats, Origin, StopReason
from core.sampling import SamplingError, SamplingParams
from core.tiny import tiny_pair
from tests.table_backend import TableBackend, random_table
from tests.tiny_models import tiny_backend, tiny_draft_pair


@pytest.fixture(scope="module")
def chat_pair():
    return tiny_pair()


def test_events_describe_each_step_consistently(chat_pair) -> None:
    target, draft = chat_pair
    engine = SpeculativeEngine(target, draft, Tree((-1, -1, 0, 0, 1, 2)), SamplingParams(temperature=0.8, seed=5))
    prompt = engine.chat_ids([{"role": "user", "content": "Write a haiku about trees."}])
    events = list(engine.stream(prompt, max_new_tokens=40))
    result = engine.last_result
    assert result is not None and [t for e in events for t in e.tokens] == list(result.tokens)
    assert "".join(e.text for e in events) == result.text
    assert result.text == target.detokenize([t for t in result.tokens if t not in target.eos_ids])
    for i, e in enumerate(events):
        assert e.step == i and e.stats.target_calls == i + 1
        accepted = [n.index for n in e.nodes if n.fate == Fate.ACCEPTED]
        assert tuple(accepted) == e.accepted_path
        assert [e.nodes[j].token for j in e.accepted_path] == list(e.tokens[: len(e.accepted_path)])
        assert e.origins[: len(e.accepted_path)] == (Origin.DRAFT,) * len(e.accepted_path)
        for n in e.nodes:
            assert (n.p is None) == (n.fate == Fate.NOT_REACHED) and 0 < n.q <= 1
            if n.parent >= 0:
                assert n.depth == e.nodes[n.parent].depth + 1
        if e.accepted_path and len(e.tokens) > len(e.accepted_path):
            assert e.origins[-1] in (Origin.BONUS, Origin.CORRECTION)
    # the emitted tokens' character spans tile the answer's text, in order
    spans = [span for e in events for span in e.spans]
    assert len(spans) == len(result.tokens)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])) and spans[0][0] == 0 and spans[-1][1] == len(result.text)
    assert all(e.greedy is False and e.root_text == (events[i - 1].token_texts[-1] if i else "\n")
               for i, e in enumerate(events))
    stats = result.stats
    assert stats.new_tokens == len(result.tokens) == 40
    assert stats.accepted == sum(len(e.accepted_path) for e in events)
    assert stats.tokens_per_call == pytest.approx(40 / len(events))
    assert sum(stats.accepted_by_depth) == stats.accepted
    assert all(a <= t for a, t in zip(stats.accepted_by_depth, stats.attempted_by_depth))
    assert stats.time_to_first_token == events[0].timestamp and stats.seconds == events[-1].timestamp


def test_cancel_keeps_what_was_generated(chat_pair) -> None:
    target, draft = chat_pair
    cancel = threading.Event()
    engine = SpeculativeEngine(target, draft, Chain(3), SamplingParams())
    got = []
    for event in engine.stream([5, 6, 7], max_new_tokens=200, cancel=cancel):
        got += event.tokens
        if event.step == 2:
            cancel.set()
    result = engine.last_result
    assert result.stop_reason == StopReason.CANCELLED and list(result.tokens) == got and len(got) >= 3


def test_stops_when_the_context_is_full() -> None:
    target, draft = tiny_draft_pair(context=24)
    for strategy in (Baseline(), Chain(5)):
        result = SpeculativeEngine(target, draft, strategy).generate(list(range(1, 11)), max_new_tokens=100)
        assert result.stop_reason == StopReason.CONTEXT
        assert len(result.tokens) == 24 - 10


def test_prompt_over_the_context_is_a_clear_error() -> None:
    target = tiny_backend(context=16)
    with pytest.raises(ContextLengthError, match="16"):
        SpeculativeEngine(target).generate(list(range(16)), 4)


def test_empty_prompt_and_bad_budget() -> None:
    engine = SpeculativeEngine(tiny_backend())
    with pytest.raises(EmptyPromptError):
        engine.generate([], 4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate([1], 0)
    with pytest.raises(ValueError, match="out of the vocabulary"):
        engine.generate([1, 10_000], 4)
    for bad in ([1, 3.7], [1, "5"], [1, True]):     # not ids, even where int() would accept them
        with pytest.raises(ValueError, match="must be integers"):
            engine.generate(bad, 4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate([1, 2], True)


def test_mismatched_vocabularies_are_refused() -> None:
    with pytest.raises(IncompatibleModelsError, match="vocabulary"):
        SpeculativeEngine(tiny_backend(vocab=64), tiny_backend(vocab=72), Chain(2))


def test_mismatched_tokenizers_are_refused() -> None:
    a = TableBackend(random_table(5, 1), 5)
    b = TableBackend(random_table(5, 2), 5)
    b.fingerprint = lambda: "another tokenizer"
    with pytest.raises(IncompatibleModelsError, match="tokenizers"):
        SpeculativeEngine(a, b, Chain(2))


@pytest.mark.parametrize("kwargs,needle", [
    (dict(temperature=-0.1), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=1e6), "absurd"), (dict(top_k=-1), "top_k"), (dict(top_k=2.5), "top_k"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(seed=-3), "seed"), (dict(min_p=1.0), "min_p"),
    (dict(min_p=-0.1), "min_p"),
])
def test_bad_sampling_values(kwargs, needle) -> None:
    with pytest.raises(SamplingError, match=needle):
        SamplingParams(**kwargs)


def test_strategies_validate_their_shape() -> None:
    with pytest.raises(ValueError, match="Chain"):
        Chain(0)
    with pytest.raises(ValueError, match="parents"):
        Tree((0, -1))
    with pytest.raises(ValueError, match="sampling"):
        Tree((-1,), "beam")
    with pytest.raises(ValueError, match="draft model"):
        SpeculativeEngine(tiny_backend(), None, Chain(2)).generate([1, 2], 3)


def test_import_core_never_imports_qt() -> None:
    code = ("import importlib, pkgutil, sys, core\n"
            "for m in pkgutil.walk_packages(core.__path__, 'core.'): importlib.import_module(m.name)\n"
            "bad = [m for m in sys.modules if m.startswith(('PySide6', 'shiboken6', 'pyqtgraph'))]\n"
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_greedy_fast_path_equals_rule_3_with_a_one_hot_target() -> None:
    import random

    from core.sampling import Rng, greedy_token, logits_to_probs
    from core.tree import Proposal, TokenTree
    from core.verify import verify_greedy, verify_tree

    rnd = random.Random(3)
    for trial in range(300):
        vocab = rnd.randint(2, 6)
        tree = TokenTree()
        for _ in range(rnd.randint(0, 7)):
            parent = rnd.randint(-1, len(tree) - 1)
            siblings = {tree.tokens[c] for c in tree.children(parent)}
            free = [t for t in range(vocab) if t not in siblings]
            if free:
                tree.add(rnd.choice(free), parent, Proposal())
        logits = {u: torch.randn(vocab, generator=torch.Generator().manual_seed(trial * 10 + u + 1))
                  for u in range(-1, len(tree))}
        eos = {rnd.randrange(vocab)} if rnd.random() < 0.3 else set()
        greedy = SamplingParams(temperature=0.0)
        fast = verify_greedy(tree, lambda u: greedy_token(logits[u]), eos)
        rule = verify_tree(tree, lambda u: logits_to_probs(logits[u], greedy), Rng(trial), eos)
        assert (fast.accepted, fast.extra, fast.bonus, fast.accept_probs) == \
            (rule.accepted, rule.extra, rule.bonus, rule.accept_probs)


def test_control_tokens_never_reach_the_text() -> None:
    from core.tiny import tiny_pair

    target, _ = tiny_pair()
    im_start = target.tokenizer.convert_tokens_to_ids("<|im_start|>")
    evaluate = target.forward_tree

    def says_im_start(tree, start=0):   # a model that says <|im_start|> (a control token, not an end) every time
        rows = evaluate(tree, start).clone()
        rows[:, im_start] = rows.max() + 10.0
        return rows

    target.forward_tree = says_im_start
    result = SpeculativeEngine(target).generate(target.apply_chat_template([{"role": "user", "content": "x"}]), 5)
    assert result.tokens == (im_start,) * 5
    assert result.text == "" and "<|" not in "".join(t for e in result.steps for t in e.token_texts)
    assert all(e.specials == ("<|im_start|>",) and e.spans == ((0, 0),) for e in result.steps)


def test_cancel_during_a_long_prefill_stops_at_a_chunk() -> None:
    target = tiny_backend(context=512)
    target.prefill_chunk = 16
    cancel = threading.Event()
    seen = []

    def progress(done, total):
        seen.append(done)
        cancel.set()          # Stop pressed while the first chunk was being read

    result = SpeculativeEngine(target).generate(list(range(1, 60)) * 5, 8, cancel, progress)
    assert result.stop_reason == StopReason.CANCELLED and result.tokens == ()
    assert seen == [16] and len(target.committed) == 16    # one chunk read, the rest never started
    again = SpeculativeEngine(target).generate(list(range(1, 60)) * 5, 3)   # and the cache is reused after
    assert len(again.tokens) == 3


def test_decode_speed_counts_what_the_first_step_emitted_with_the_first_token() -> None:
    stats = GenerationStats(prefill_seconds=0.5)
    for now, emitted in ((1.0, 5), (1.5, 1), (2.0, 2)):
        stats = stats.after_step(now=now, emitted=emitted, drafted=0, accepted=[], reached=[], draft_seconds=0.0,
                                 verify_seconds=0.0, target_seconds=0.0)
    assert stats.time_to_first_token == 1.0 and stats.first_tokens == 5
    assert stats.tokens_per_second == pytest.approx(3 / 1.0), "the 4 drafted with the first came in no decode time"
    one = GenerationStats().after_step(now=1.0, emitted=1, drafted=0, accepted=[], reached=[], draft_seconds=0.0,
                                       verify_seconds=0.0, target_seconds=0.0)
    assert one.after_step(now=2.0, emitted=4, drafted=3, accepted=[1, 2, 3], reached=[1, 2, 3], draft_seconds=0.0,
                          verify_seconds=0.0, target_seconds=0.0).tokens_per_second == pytest.approx(4.0)
