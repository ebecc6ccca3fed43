"""``SamplingParams.min_tokens``: end-of-text is barred from the first N new tokens, and speculative decoding keeps
exactly that target distribution (exact enumeration, greedy identity, chi-square), so a test or a benchmark can ask
for an answer of a known length whatever a random model on this CPU's kernels would say."""
from __future__ import annotations

import pytest
import torch

from core.backends.hf import HFBackend
from core.drafting import Baseline, Chain, MultiDraft, Tree
from core.engine import SpeculativeEngine
from core.events import StopReason
from core.sampling import SamplingError, SamplingParams, logits_to_probs
from core.tiny import perturb, tiny_model
from tests.chi_square import ALPHA, VOCAB, chi_square_p, exact_joint, sampled_joint
from tests.exact import enumerate_outcomes
from tests.table_backend import TableBackend, random_table

EOS = 2
STRATEGIES = [("chain2", Chain(2)), ("multidraft2x2", MultiDraft(2, 2)),
              ("tree", Tree((-1, -1, 0, 1), "without_replacement"))]


def barred(logits: torch.Tensor, eos: int) -> torch.Tensor:
    out = logits.clone()
    out[eos] = float("-inf")
    return out


@pytest.mark.parametrize("value", [-1, 1.5, True, "3"])
def test_min_tokens_must_be_a_non_negative_integer(value) -> None:
    with pytest.raises(SamplingError, match="min_tokens"):
        SamplingParams(min_tokens=value)


@pytest.mark.parametrize("min_tokens", [1, 2])
@pytest.mark.parametrize("name,strategy", STRATEGIES, ids=[n for n, _ in STRATEGIES])
def test_first_two_tokens_are_the_barred_targets_exactly(name, strategy, min_tokens) -> None:
    vocab = 3
    # end-of-text is likely under both tables, so drafts propose it and verification has to refuse it
    target = TableBackend(random_table(vocab, seed=1), vocab, "target", eos=[EOS])
    draft = TableBackend(random_table(vocab, seed=2), vocab, "draft", eos=[EOS])
    params = SamplingParams(temperature=1.0, min_tokens=min_tokens)
    prompt = [0, 1]

    def run(rng):
        engine = SpeculativeEngine(target, draft, strategy, params, rng_factory=lambda seed: rng)
        out: list[int] = []
        for event in engine.stream(prompt, max_new_tokens=3):
            out += event.tokens
            if len(out) >= 2:
                break
        return tuple(out[:2])

    got = torch.zeros((vocab, vocab), dtype=torch.float64)
    for (a, b), w in enumerate_outcomes(run).items():
        got[a, b] += w

    def probs(context, position):
        logits = target.logits_for(context)
        return logits_to_probs(barred(logits, EOS) if position < min_tokens else logits, params)

    first = probs(prompt, 0)
    expected = torch.stack([first[a] * probs(prompt + [a], 1) for a in range(vocab)])
    assert float(got[EOS].sum()) == 0.0 and (min_tokens < 2 or float(got[:, EOS].sum()) == 0.0)
    assert float((got - expected).abs().max()) < 1e-9, name


def _eos_pair(eos: int):
    target_model = tiny_model(48, seed=5, eos_id=eos)
    draft_model = perturb(target_model, noise=0.05, seed=6)
    return HFBackend(target_model, device="cpu", name="t"), HFBackend(draft_model, device="cpu", name="d")


def _barred_greedy(backend: HFBackend, prompt: list[int], n: int, min_tokens: int) -> list[int]:
    """The target's own greedy tokens with end-of-text barred from the first ``min_tokens``, computed here from its
    forward passes (no engine)."""
    eos = sorted(backend.eos_ids)
    out: list[int] = []
    with torch.no_grad():
        while len(out) < n:
            logits = backend.model(torch.tensor([prompt + out])).logits[0, -1]
            if len(out) < min_tokens:
                logits = barred(logits, eos[0])
            out.append(int(torch.argmax(logits)))
            if out[-1] in eos:
                break
    return out


def test_greedy_speculation_gives_the_barred_targets_tokens() -> None:
    # which token is end-of-text is chosen from what the model itself says on this machine: the token it emits at once
    probe, _ = _eos_pair(eos=0)
    prompt = [5, 9, 13]
    with torch.no_grad():
        eos = int(torch.argmax(probe.model(torch.tensor([prompt])).logits[0, -1]))
    target, draft = _eos_pair(eos)
    assert _barred_greedy(target, prompt, 30, 0) == [eos]   # unbarred, the answer ends at once
    expected = _barred_greedy(target, prompt, 30, 20)
    assert len(expected) >= 20 and eos not in expected[:20]
    greedy = SamplingParams(temperature=0.0, min_tokens=20)
    base = SpeculativeEngine(target, None, Baseline(), greedy).generate(prompt, 30)
    assert list(base.tokens) == expected
    assert base.stop_reason == (StopReason.EOS if expected[-1] == eos else StopReason.MAX_TOKENS)
    for strategy in (Chain(4), MultiDraft(2, 3), Tree((-1, -1, 0, 1, 2), "top_k")):
        spec = SpeculativeEngine(target, draft, strategy, greedy).generate(prompt, 30)
        assert spec.tokens == base.tokens, strategy.label


def test_min_tokens_equal_to_the_budget_gives_an_answer_of_exactly_that_length() -> None:
    target, draft = _eos_pair(eos=0)
    for eos in range(8):   # whichever token this model favours, none can end the answer early
        target.eos_ids = draft.eos_ids = frozenset({eos})
        result = SpeculativeEngine(target, draft, Chain(3), SamplingParams(min_tokens=25)).generate([1, 2, 3], 25)
        assert len(result.tokens) == 25 and result.stop_reason == StopReason.MAX_TOKENS
        assert eos not in result.tokens


@pytest.mark.slow
@pytest.mark.parametrize("min_tokens", [1, 2])
def test_sampled_joint_under_min_tokens_matches_the_target(min_tokens) -> None:
    target_model = tiny_model(VOCAB, seed=7, hidden=32, sharpness=0.5, eos_id=EOS)
    target = HFBackend(target_model, device="cpu", name="t")
    draft = HFBackend(perturb(target_model, noise=0.4, seed=8), device="cpu", name="d")
    params = SamplingParams(temperature=1.0, min_tokens=min_tokens)
    p = chi_square_p(sampled_joint(target, draft, Chain(3), params), exact_joint(target, params))
    assert p > ALPHA, f"min_tokens={min_tokens}: speculative samples differ from the barred target (p = {p:.2e})"
