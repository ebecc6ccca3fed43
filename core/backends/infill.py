"""Fill in the middle: the three control tokens with which a code model writes what goes between a prefix and a
suffix (an editor's completion at the cursor, the rest of the file after it).

A request with OpenAI's ``suffix`` becomes ``<prefix> prefix <suffix> suffix <middle>``, and the model's answer is the
middle (the order llama.cpp's ``/infill`` builds by default). Models spell the three tokens differently; a GGUF may
name them, and where it does not, llama.cpp recognises them by these spellings, as a transformers tokenizer is read
here.
"""
from __future__ import annotations

from typing import Mapping, Sequence

SPELLINGS = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),         # Qwen2.5-Coder, Qwen3-Coder
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),               # StarCoder, StarCoder2
    ("<fim-prefix>", "<fim-suffix>", "<fim-middle>"),
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),            # DeepSeek-Coder
    ("▁<PRE>", "▁<SUF>", "▁<MID>"),                                 # CodeLlama
    ("<PRE>", "<SUF>", "<MID>"),
    ("<|code_prefix|>", "<|code_suffix|>", "<|code_middle|>"),      # GLM-4
)


def spelled(ids: Mapping[str, int]) -> tuple[int, int, int] | None:
    """The (prefix, suffix, middle) token ids of the first spelling whose three tokens are all in the vocabulary
    ``ids`` (token text -> id); None when none is."""
    for names in SPELLINGS:
        if all(name in ids for name in names):
            return ids[names[0]], ids[names[1]], ids[names[2]]
    return None


def infill_prompt(tokens: tuple[int, int, int], prefix: Sequence[int], suffix: Sequence[int]) -> list[int]:
    """The prompt whose answer is the middle between ``prefix`` and ``suffix`` (token ids)."""
    pre, suf, mid = tokens
    return [pre, *prefix, suf, *suffix, mid]
