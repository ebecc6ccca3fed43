"""Tiny random models for tests: float64 by default so that tree and path computations agree exactly."""
from __future__ import annotations

import torch

from core.backends.hf import HFBackend
from core.tiny import perturb, tiny_model, tiny_pair, tiny_tokenizer

__all__ = ["STREAMS_LONG", "tiny_backend", "tiny_draft_pair", "tiny_model", "tiny_pair", "tiny_tokenizer", "perturb"]

# Window settings for an answer that is still streaming text when a test acts on it, on any CPU: end-of-text barred
# for all 3000 tokens, and sampled, so that a random model cannot lock onto one control token (greedy on a random model
# can loop on any token; which one depends on the CPU's float kernels)
STREAMS_LONG = dict(max_new_tokens=3000, min_new_tokens=3000, temperature=1.0, seed=0)


def tiny_backend(arch: str = "qwen2", vocab: int = 64, seed: int = 0, eos: int | None = None,
                 dtype: torch.dtype = torch.float64, context: int = 512) -> HFBackend:
    """A tokenizer-less tiny model over ``vocab`` ids (text shows as <id> markers)."""
    model = tiny_model(vocab, seed, dtype=dtype, eos_id=eos, arch=arch, context=context)
    return HFBackend(model, device="cpu", name=f"tiny-{arch}-{seed}")


def tiny_draft_pair(arch: str = "qwen2", vocab: int = 64, seed: int = 0, noise: float = 0.05,
                    eos: int | None = None, dtype: torch.dtype = torch.float64, context: int = 512):
    """(target, draft) tokenizer-less backends; the draft is a perturbed copy of the target."""
    target = tiny_model(vocab, seed, dtype=dtype, eos_id=eos, arch=arch, context=context)
    draft = perturb(target, noise, seed + 1000)
    return (HFBackend(target, device="cpu", name=f"tiny-{arch}-{seed}"),
            HFBackend(draft, device="cpu", name=f"tiny-{arch}-{seed}-draft"))
