"""Tiny random transformers models built in-process, for tests that need real forward passes."""
from __future__ import annotations

import torch

from core.backends.hf import HFBackend


def tiny_causal_lm(arch: str = "qwen2", vocab: int = 64, seed: int = 0, layers: int = 2, hidden: int = 32,
                   dtype: torch.dtype = torch.float64, eos: int | None = None, context: int = 256):
    """A random causal LM with a few layers; ``eos`` sets the EOS id (None: no EOS at all)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
                  eos_token_id=eos, bos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        raise ValueError(arch)
    # sharpen the random logits a little so that drafts are sometimes accepted and sometimes not
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model.to(dtype).eval()


def tiny_backend(arch: str = "qwen2", **kw) -> HFBackend:
    return HFBackend(tiny_causal_lm(arch, **kw), device="cpu", name=f"tiny-{arch}-{kw.get('seed', 0)}")


def perturbed_draft(target_model, noise: float = 0.5, seed: int = 1, dtype: torch.dtype = torch.float64):
    """A draft that agrees with the target often but not always: the target's weights plus noise."""
    import copy

    torch.manual_seed(seed)
    draft = copy.deepcopy(target_model)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(noise * p.std() * torch.randn_like(p))
    return draft.to(dtype).eval()
