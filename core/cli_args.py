"""Command-line options shared by `speclens bench` and `speclens plan`: which pair, on which backends."""
from __future__ import annotations

import argparse


def add_pair_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pair", default="default", help="model pair: default (Qwen2.5-Coder 1.5B/0.5B) or tiny")
    parser.add_argument("--target", default=None, metavar="PATH",
                        help="a custom pair instead of --pair: the target's GGUF file (or transformers folder) ...")
    parser.add_argument("--draft", default=None, metavar="PATH", help="... and the draft's, sharing its tokenizer")
    parser.add_argument("--backend", default="llama.cpp", choices=("llama.cpp", "hf"), help="backend of the target")
    parser.add_argument("--draft-backend", default=None, choices=("llama.cpp", "hf"),
                        help="backend of the draft model (default: the target's)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: CUDA when present, else the CPU)")
    parser.add_argument("--no-draft", action="store_true", help="without the draft model (memory drafts only)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")


def open_pair(pair: str, backend: str, draft_backend: str | None = None, device: str | None = None,
              target: str | None = None, draft: str | None = None, context: int | None = None):
    """(target, draft) for the command line: ``tiny`` (random, built in a second), a registered real pair, or the
    custom pair of files ``target`` and ``draft``; ``context`` as core.models.load_pair takes it."""
    from core import models

    if target or draft:
        if not (target and draft):
            raise ValueError("a custom pair needs both --target and --draft")
        return models.load_custom_pair(target, draft, backend=backend, device=device, context=context)
    if pair == "tiny":   # in-process transformers models whatever the backend asked for
        backend = draft_backend = "hf"
    return models.load_pair(pair, backend=backend, draft_backend=draft_backend or backend, device=device,
                            context=context)
