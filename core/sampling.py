"""Sampling parameters and the logits -> probability transform shared by every mode.

The same transform is applied to the target and to the draft, in baseline, chain and tree decoding alike: that is
what makes the verifier's ``p`` and ``q`` comparable and keeps speculative output distributed exactly as baseline.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
import torch

MAX_TEMPERATURE = 100.0


class SamplingError(ValueError):
    """A sampling setting is out of range."""


@dataclass(frozen=True)
class SamplingParams:
    """Temperature 0 means greedy (argmax, ties to the lowest token id). top_k 0, top_p 1.0 and min_p 0 disable those
    filters. ``min_p`` keeps the tokens at least ``min_p`` times as likely as the likeliest before temperature (a
    logit within ``ln(min_p)`` of the largest), as llama.cpp's min-p sampler does in its default chain, where it comes
    before temperature.

    ``min_tokens``: end-of-text is kept out of the first ``min_tokens`` new tokens (its logits are -inf there, before
    temperature and the filters), as vLLM's ``min_tokens`` and llama.cpp's ``ignore_eos`` do: an answer of a known
    length for benchmarks and tests, whatever a model would say. The target's distribution is then that masked one,
    and speculative decoding keeps it exactly (the mask is part of the target's processing, like top-p).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    min_tokens: int = 0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise SamplingError(f"temperature must be a finite number >= 0, got {t!r}")
        if t > MAX_TEMPERATURE:
            raise SamplingError(f"temperature {t} is absurd: the maximum is {MAX_TEMPERATURE}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise SamplingError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) or not 0 < p <= 1:
            raise SamplingError(f"top_p must be in (0, 1], got {p!r}")
        floor = self.min_p
        if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not math.isfinite(floor) or not (
                0 <= floor < 1):
            raise SamplingError(f"min_p must be in [0, 1) (0 disables it), got {floor!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise SamplingError(f"seed must be a non-negative integer or None, got {self.seed!r}")
        m = self.min_tokens
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise SamplingError(f"min_tokens must be an integer >= 0 (0: end-of-text allowed at once), got {m!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def distribution_key(self) -> str:
        """The settings the sampling distribution depends on (not the seed, which only picks a sample from it): two
        generations with equal keys draw each token from the same distribution after the same context."""
        key = f"temperature={self.temperature:g} top_k={self.top_k} top_p={self.top_p:g} min_tokens={self.min_tokens}"
        return key + (f" min_p={self.min_p:g}" if self.min_p else "")    # the keys of answers kept before min-p


def without_tokens(logits: torch.Tensor, ids) -> torch.Tensor:
    """A copy of a row of logits in which ``ids`` can never be chosen (-inf)."""
    out = logits.clone()
    out[list(ids)] = float("-inf")
    return out


def _as_numpy(logits: torch.Tensor) -> np.ndarray:
    # numpy's argmax and max are ~20x faster than torch's on one 150k-entry row (measured on the 2-core CPU)
    if not isinstance(logits, torch.Tensor):
        return np.asarray(logits)
    logits = logits.detach().to("cpu")
    return (logits if logits.dtype in (torch.float32, torch.float64) else logits.float()).numpy()


def greedy_token(logits: torch.Tensor) -> int:
    """The argmax of one row of logits; ties go to the lowest id, identically in every mode."""
    return int(_as_numpy(logits).argmax())


def top2_margin(logits: torch.Tensor) -> float:
    """Gap between the two largest logits: how close a greedy choice was to a tie."""
    x = _as_numpy(logits)
    best = int(x.argmax())
    second = max(x[:best].max(initial=-np.inf), x[best + 1:].max(initial=-np.inf))
    return float(x[best]) - float(second)


def _working(logits: torch.Tensor) -> torch.Tensor:
    """Logits in the dtype the transform computes in: float32, or float64 when they are float64 (so that exact tests
    stay exact)."""
    return logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32)


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Turn logits (..., V) into the sampling distribution after min-p, temperature, top-k and top-p.

    Computed in float32 (float64 when the logits are float64, so that exact tests stay exact). For greedy params
    the result is one-hot at the argmax of each row.
    """
    x = _working(logits)
    if params.greedy:
        out = torch.zeros_like(x)
        out.scatter_(-1, torch.argmax(x, dim=-1, keepdim=True), 1.0)
        return out
    if params.min_p > 0:
        floor = x.max(dim=-1, keepdim=True).values + math.log(params.min_p)
        x = x.masked_fill(x < floor, float("-inf"))
    x = x / params.temperature
    vocab = x.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if params.top_p < 1.0:
        keep = nucleus_mask(probs, params.top_p) if probs.dim() == 1 else torch.stack(
            [nucleus_mask(row, params.top_p) for row in probs])
        probs = torch.where(keep, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def token_probability(logits: torch.Tensor, token: int, params: SamplingParams) -> float:
    """``logits_to_probs(logits, params)[token]`` for one row. Without a filter (top-k, top-p, min-p) it is
    ``exp(x[token] - logsumexp(x))`` with ``x = logits / temperature``: one pass over the row, where the distribution
    takes several and a vocabulary-sized result (measured on the 2-core Xeon, a 150k row fresh from the target: 0.4 ms
    against 0.6-0.9 ms with the verifier's float64 copy)."""
    if params.greedy or 0 < params.top_k < logits.shape[-1] or params.top_p < 1.0 or params.min_p > 0:
        return float(logits_to_probs(logits, params)[token])
    x = _working(logits) / params.temperature
    return math.exp(float(x[token]) - float(torch.logsumexp(x, -1)))


def nucleus_mask(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Top-p's support: the smallest prefix of tokens, by falling probability, whose mass reaches ``top_p``.

    A token stays when the mass before it (in that order, ties broken towards the lower id as a stable sort would)
    is still short of ``top_p``. A nucleus is usually a few dozen tokens, so the largest ``k`` are looked at first
    (``k`` doubling until the mass is reached) instead of sorting all 150k.
    """
    vocab = probs.shape[-1]
    k = min(64, vocab)
    while True:
        values = torch.topk(probs, k).values
        before = torch.cumsum(values, 0) - values
        kept = int((before < top_p).sum())
        if kept < k or k == vocab:
            break
        k = min(2 * k, vocab)
    cut = values[kept - 1]
    ties = int((values[:kept] == cut).sum())
    keep = probs > cut
    equal = torch.nonzero(probs == cut).flatten()[:ties]
    keep[equal] = True
    return keep


class Rng:
    """The random source of one generation: uniform draws for acceptance tests, categorical draws for tokens.

    Verification and drafting take an ``Rng`` rather than calling torch directly, so that tests can substitute an
    enumerating source and compute output distributions exactly.
    """

    def __init__(self, seed: int | None = None) -> None:
        self.seed = seed if seed is not None else int.from_bytes(os.urandom(6), "little")
        self._gen = torch.Generator().manual_seed(self.seed)

    def accept(self, prob: float) -> bool:
        """True with probability ``prob`` (clamped to [0, 1])."""
        return float(torch.rand((), generator=self._gen, dtype=torch.float64)) < prob

    def sample(self, probs: torch.Tensor) -> int:
        """One token id drawn from a probability vector (need not be normalised, must have positive mass).

        Inverse CDF over float64 cumulative sums: exact up to rounding, and 20x faster than torch.multinomial on a
        150k vocabulary. A token of probability 0 is never drawn (its cumulative sum equals its predecessor's).
        """
        cdf = torch.cumsum(probs.detach().to("cpu", torch.float64).flatten(), 0)
        u = float(torch.rand((), generator=self._gen, dtype=torch.float64)) * float(cdf[-1])
        token = int(torch.searchsorted(cdf, torch.tensor([u], dtype=torch.float64), right=True))
        if token >= len(cdf):  # u rounded up onto the total: the last token that has any mass
            token = int(torch.nonzero(torch.diff(cdf, prepend=cdf.new_zeros(1))).max())
        return token
