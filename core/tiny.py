"""A tiny random model pair with a real tokenizer and chat template, built in-process in about a second.

It exists so that the app, the CLI and the tests can exercise every code path (chat templates, streaming text,
the tree view) on any machine without real weights. Its output is random text, by design.
"""
from __future__ import annotations

import string
from typing import Sequence

import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def tiny_tokenizer(extra_specials: Sequence[str] = ()):
    """A character-level tokenizer over printable ASCII plus ChatML special tokens, and ``extra_specials`` after them
    (fill-in-the-middle tokens, say: the other ids stay as they are)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    chars = [c for c in string.printable if c not in "\x0b\x0c\r"]
    vocab = {tok: i for i, tok in enumerate(SPECIALS + chars + list(extra_specials))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<|endoftext|>"))
    core.add_special_tokens(SPECIALS + list(extra_specials))
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", bos_token=None,
                                   pad_token="<|endoftext|>", unk_token="<|endoftext|>", chat_template=CHAT_TEMPLATE)


def tiny_model(vocab_size: int, seed: int, layers: int = 2, hidden: int = 64, dtype=torch.float64, arch: str = "qwen2",
               eos_id: int | None = None, context: int = 4096,
               init_std: float = 0.3, sharpness: float = 1.0):
    """A random causal LM (``arch`` qwen2 or llama) of a few layers; ``sharpness`` scales its logits."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    classes = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}
    if arch not in classes:
        raise ValueError(f"unknown tiny architecture {arch!r}; choose one of {sorted(classes)}")
    config_cls, model_cls = classes[arch]
    config = config_cls(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=context, eos_token_id=eos_id, bos_token_id=None,
                         pad_token_id=None, tie_word_embeddings=False, initializer_range=init_std)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = model_cls(config)
        with torch.no_grad():
            model.lm_head.weight.mul_(sharpness)
    return model.to(dtype).eval()


def perturb(model, noise: float, seed: int):
    """A copy of ``model`` with Gaussian noise on every weight: a draft that agrees with it often, not always."""
    import copy

    gen = torch.Generator().manual_seed(seed)
    out = copy.deepcopy(model)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(noise * p.std() * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return out.eval()


def tiny_pair(device: str = "cpu", seed: int = 0, noise: float = 0.03, dtype=torch.float64, arch: str = "qwen2"):
    """(target, draft) HF backends sharing the tiny tokenizer; the draft is a perturbed copy of the target."""
    from core.backends.hf import HFBackend

    tok = tiny_tokenizer()
    target = tiny_model(len(tok), seed, dtype=dtype, eos_id=tok.eos_token_id, arch=arch)
    draft = perturb(target, noise, seed + 1)
    return (HFBackend(target, tok, device=device, name="tiny-target"),
            HFBackend(draft, tok, device=device, name="tiny-draft"))
