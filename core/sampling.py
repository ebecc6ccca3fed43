"""Sampling parameters and the logits -> probability transform shared by every mode.

The same transform is applied to the target and to the draft, in baseline, chain and tree decoding alike: that is
what makes the verifier's ``p`` and ``q`` comparable and keeps speculative output distributed exactly as baseline.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

MAX_TEMPERATURE = 100.0


class SamplingError(ValueError):
    """A sampling setting is out of range."""


@dataclass(frozen=True)
class SamplingParams:
    """Temperature 0 means greedy (argmax, ties to the lowest token id). top_k 0 and top_p 1.0 disable those filters."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

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
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise SamplingError(f"seed must be a non-negative integer or None, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def greedy_token(logits: torch.Tensor) -> int:
    """The argmax of one row of logits; ties go to the lowest id, identically in every mode."""
    return int(torch.argmax(logits).item())


def top2_margin(logits: torch.Tensor) -> float:
    """Gap between the two largest logits: how close a greedy choice was to a tie."""
    top = torch.topk(logits.double(), 2).values
    return float(top[0] - top[1])


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Turn logits (..., V) into the sampling distribution after temperature, top-k and top-p.

    Computed in float32 (float64 when the logits are float64, so that exact tests stay exact). For greedy params
    the result is one-hot at the argmax of each row.
    """
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    x = logits.to(dtype)
    if params.greedy:
        out = torch.zeros_like(x)
        out.scatter_(-1, torch.argmax(x, dim=-1, keepdim=True), 1.0)
        return out
    x = x / params.temperature
    vocab = x.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        # Keep the smallest prefix whose mass reaches top_p: a token stays if the mass before it is still short.
        keep_sorted = before < params.top_p
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        probs = torch.where(keep, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


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
        """One token id drawn from a probability vector (need not be normalised, must have positive mass)."""
        p = probs.detach().to("cpu", torch.float64)
        return int(torch.multinomial(p, 1, generator=self._gen).item())
