"""Chi-square on the joint distribution of the first two generated tokens, shared by the lossless tests.

N = 2000 generations (seeds 0..N-1) over a vocabulary of 8 (64 cells; cells expected below 5 are pooled) against
the target's exact joint computed from its own forward passes; significance ALPHA per test.
"""
from __future__ import annotations

from dataclasses import replace

import torch
from scipy.stats import chisquare

from core.engine import SpeculativeEngine
from core.sampling import SamplingParams, logits_to_probs, without_tokens

VOCAB = 8
N = 2000
ALPHA = 1e-3
PROMPT = [3, 1, 4, 1, 5]


def tiny_target():
    """The tiny float model the memory drafters' chi-square tests sample from: soft enough that a copy often breaks."""
    from core.backends.hf import HFBackend
    from core.tiny import tiny_model

    return HFBackend(tiny_model(VOCAB, seed=7, hidden=32, sharpness=0.5), device="cpu", name="t")


def exact_joint(backend, params: SamplingParams, prompt: list[int] = PROMPT) -> torch.Tensor:
    """The target's own joint of its first two tokens; end-of-text is barred from the first ``params.min_tokens``."""
    model = backend.model

    def probs(context: list[int], position: int) -> torch.Tensor:
        logits = model(torch.tensor([context])).logits[0, -1]
        if position < params.min_tokens:
            logits = without_tokens(logits, backend.eos_ids)
        return logits_to_probs(logits, params)

    with torch.no_grad():
        first = probs(prompt, 0)
        joint = torch.zeros((VOCAB, VOCAB), dtype=torch.float64)
        for a in range(VOCAB):
            joint[a] = first[a] * probs(prompt + [a], 1)
    return joint


def sampled_joint(target, draft, strategy, params: SamplingParams, prompt: list[int] = PROMPT) -> torch.Tensor:
    counts = torch.zeros((VOCAB, VOCAB), dtype=torch.float64)
    for seed in range(N):
        engine = SpeculativeEngine(target, draft, strategy, replace(params, seed=seed))
        out: list[int] = []
        for event in engine.stream(prompt, max_new_tokens=4):
            out += event.tokens
            if len(out) >= 2:
                break
        counts[out[0], out[1]] += 1
    return counts


def chi_square_p(counts: torch.Tensor, joint: torch.Tensor) -> float:
    expected = (joint * counts.sum()).flatten()
    observed = counts.flatten()
    assert float(observed[expected == 0].sum()) == 0, "a token pair the target can never produce was emitted"
    big = expected >= 5
    obs = observed[big].tolist() + [float(observed[~big & (expected > 0)].sum())]
    exp = expected[big].tolist() + [float(expected[~big & (expected > 0)].sum())]
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    assert len(exp) >= 10, "the target distribution is too peaked for a meaningful test"
    return float(chisquare(obs, exp).pvalue)
