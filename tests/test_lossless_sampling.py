"""End-to-end chi-square tests: speculative sampling with tiny random models has the target's exact distribution.

For each strategy and sampling setting, N = 2000 generations (seeds 0..N-1) give the joint distribution of the first
two tokens over a vocabulary of 8 (64 cells; cells expected below 5 are pooled), compared with the target's exact
joint computed from its own forward passes. Significance alpha = 0.001 per test. Power: the same test on the same N
rejects a deliberately broken verifier (correction drawn from p instead of the residual) with p < 1e-6
(``test_chi_square_detects_broken_verifier``). Results are deterministic: the seeds are fixed.
"""
from __future__ import annotations

import pytest

from core.backends.hf import HFBackend
from core.drafting import Chain, MultiDraft, Tree
from core.sampling import SamplingParams
from core.tiny import perturb, tiny_model
from tests.chi_square import ALPHA, N, VOCAB, chi_square_p, exact_joint, sampled_joint

@pytest.fixture(scope="module")
def pair():
    target_model = tiny_model(VOCAB, seed=7, hidden=32, sharpness=0.5)
    draft_model = perturb(target_model, noise=0.4, seed=8)
    return HFBackend(target_model, device="cpu", name="t"), HFBackend(draft_model, device="cpu", name="d")


STRATEGIES = [
    ("chain3", Chain(3)),
    ("multidraft2x2", MultiDraft(2, 2)),
    ("sequoia-like", Tree((-1, -1, -1, 0, 0, 1, 3), "without_replacement")),
    ("wide-iid", Tree((-1, -1, -1, -1, 0, 1), "iid")),
]
SETTINGS = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9),
            SamplingParams(temperature=0.9, min_p=0.3)]


@pytest.mark.slow
@pytest.mark.parametrize("name,strategy", STRATEGIES, ids=[n for n, _ in STRATEGIES])
@pytest.mark.parametrize("params", SETTINGS, ids=["t1.0", "t0.7-p0.9", "t0.9-m0.3"])
def test_first_two_tokens_match_target(pair, name, strategy, params) -> None:
    target, draft = pair
    counts = sampled_joint(target, draft, strategy, params)
    p = chi_square_p(counts, exact_joint(target, params))
    print(f"\nchi-square {name} T={params.temperature} top_p={params.top_p} min_p={params.min_p}: p = {p:.4f} (N={N})")
    assert p > ALPHA, f"{name}: speculative samples differ from the target's distribution (p = {p:.2e})"


@pytest.mark.slow
def test_chi_square_detects_broken_verifier(pair, monkeypatch) -> None:
    import core.verify as verify

    monkeypatch.setattr(verify, "residual_after_rejection", lambda residual, drawn_from: residual)
    target, draft = pair
    params = SamplingParams(temperature=1.0)
    p = chi_square_p(sampled_joint(target, draft, Chain(3), params), exact_joint(target, params))
    print(f"\nchi-square with a broken verifier: p = {p:.2e}")
    assert p < 1e-6
