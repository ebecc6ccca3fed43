"""Tiny GGUF models written in-process with the ``gguf`` package, for llama.cpp backend and registry tests.

The tokenizer is a byte-level BPE (the GPT-2/Qwen kind llama.cpp accepts): the 256 byte symbols, a few merges
learned from a fixed text, and ChatML control tokens with a chat template. Weights are random float32, so the model
talks nonsense, but every byte string can be tokenized, multi-byte characters split over byte tokens, and two files
written with the same seed and a small ``noise`` make a draft that often agrees with its target.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from core.backends.byte_level import byte_symbols

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MERGE_TEXT = "the theory of the thing is that the other three think there then in on and an"


def _merges(symbols: list[str], count: int) -> list[tuple[str, str]]:
    """The ``count`` most frequent adjacent pairs of MERGE_TEXT, merged greedily like BPE training."""
    words = [[symbols[b] for b in (" " + w).encode()] for w in MERGE_TEXT.split()]
    merges: list[tuple[str, str]] = []
    for _ in range(count):
        pairs = Counter((w[i], w[i + 1]) for w in words for i in range(len(w) - 1))
        if not pairs:
            break
        best = max(pairs, key=lambda p: (pairs[p], p))
        merges.append(best)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if (w[i], w[i + 1]) == best:
                    w[i:i + 2] = [w[i] + w[i + 1]]
                i += 1
    return merges


def tiny_vocab(n_merges: int = 24, extra_tokens: tuple[str, ...] = ()) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of the tiny byte-level tokenizer; ``extra_tokens`` are appended as control tokens."""
    import gguf

    symbols = list(byte_symbols())
    merges = _merges(symbols, n_merges)
    tokens = symbols + [a + b for a, b in merges]
    types = [gguf.TokenType.NORMAL] * len(tokens)
    for special in SPECIALS + tuple(extra_tokens):
        tokens.append(special)
        types.append(gguf.TokenType.CONTROL)
    return tokens, [int(t) for t in types], [f"{a} {b}" for a, b in merges]


def write_tiny_gguf(path: str | Path, seed: int = 0, noise: float = 0.0, noise_seed: int = 1, arch: str = "llama",
                    layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2, context: int = 256,
                    extra_tokens: tuple[str, ...] = (), n_merges: int = 24, weight_std: float = 0.25,
                    add_bos: bool = False, chat_template: str = CHAT_TEMPLATE) -> Path:
    """Write a random ``arch`` ("llama" or "qwen2") model with the tiny tokenizer to ``path`` and return it.

    Weights are drawn from ``seed``; ``noise`` adds Gaussian noise (relative to each tensor's scale) drawn from
    ``noise_seed``, so ``write_tiny_gguf(p, seed=0, noise=0.05)`` is a draft for ``write_tiny_gguf(q, seed=0)``.
    """
    import gguf

    if arch not in ("llama", "qwen2"):
        raise ValueError(f"tiny GGUF architecture must be llama or qwen2, not {arch!r}")
    path = Path(path)
    tokens, types, merges = tiny_vocab(n_merges, extra_tokens)
    vocab = len(tokens)
    ff = 2 * hidden
    head_dim = hidden // heads
    rng = np.random.default_rng(seed)
    noise_rng = np.random.default_rng(noise_seed)

    def tensor(*shape: int, std: float = weight_std, mean: float = 0.0) -> np.ndarray:
        w = mean + std * rng.standard_normal(shape)
        if noise:
            w = w + noise * max(std, 0.1) * noise_rng.standard_normal(shape)
        return w.astype(np.float32)

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-{arch}-{seed}")
    writer.add_context_length(context)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(head_dim)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_add_bos_token(add_bos)
    writer.add_chat_template(chat_template)

    writer.add_tensor("token_embd.weight", tensor(vocab, hidden, std=1.0))
    for i in range(layers):
        blk = f"blk.{i}"
        writer.add_tensor(f"{blk}.attn_norm.weight", tensor(hidden, std=0.05, mean=1.0))
        writer.add_tensor(f"{blk}.attn_q.weight", tensor(hidden, hidden))
        writer.add_tensor(f"{blk}.attn_k.weight", tensor(kv_heads * head_dim, hidden))
        writer.add_tensor(f"{blk}.attn_v.weight", tensor(kv_heads * head_dim, hidden))
        if arch == "qwen2":
            writer.add_tensor(f"{blk}.attn_q.bias", tensor(hidden, std=0.05))
            writer.add_tensor(f"{blk}.attn_k.bias", tensor(kv_heads * head_dim, std=0.05))
            writer.add_tensor(f"{blk}.attn_v.bias", tensor(kv_heads * head_dim, std=0.05))
        writer.add_tensor(f"{blk}.attn_output.weight", tensor(hidden, hidden))
        writer.add_tensor(f"{blk}.ffn_norm.weight", tensor(hidden, std=0.05, mean=1.0))
        writer.add_tensor(f"{blk}.ffn_gate.weight", tensor(ff, hidden))
        writer.add_tensor(f"{blk}.ffn_up.weight", tensor(ff, hidden))
        writer.add_tensor(f"{blk}.ffn_down.weight", tensor(hidden, ff))
    writer.add_tensor("output_norm.weight", tensor(hidden, std=0.05, mean=1.0))
    writer.add_tensor("output.weight", tensor(vocab, hidden, std=0.5))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
