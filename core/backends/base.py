"""The Backend protocol: one model, its tokenizer and its KV cache, behind a few calls the engine needs.

The cache holds the *committed* tokens. ``forward_tree`` appends tree nodes after them (each node sees the committed
prefix and its own ancestors only); ``commit`` keeps the nodes of one root-to-node path, in order, and drops every
other node of the tree. The engine never touches a backend's tensors.
"""
from __future__ import annotations

import hashlib
import json
from typing import Mapping, Protocol, Sequence, runtime_checkable

import torch

from core.tree import TokenTree


class BackendError(RuntimeError):
    """A backend could not do what was asked (bad model file, out of context, inconsistent call)."""


class ContextLengthError(BackendError):
    """The tokens asked for do not fit in the model's context window."""


class ModelLoadError(BackendError):
    """A model could not be loaded; the message names the file or package and what to do about it."""


@runtime_checkable
class Backend(Protocol):
    """What the engine needs from a model. See the module docstring for the cache discipline."""

    name: str
    vocab_size: int
    eos_ids: frozenset[int]
    context_length: int
    device: str

    @property
    def committed(self) -> list[int]:
        """The token ids whose KV entries the cache holds, in order (a copy)."""

    def tokenize(self, text: str) -> list[int]:
        """Token ids of plain text, without special tokens added."""

    def detokenize(self, ids: Sequence[int]) -> str:
        """Text of a sequence of ids (special tokens rendered as text)."""

    def apply_chat_template(self, messages: Sequence[dict]) -> list[int]:
        """Token ids of a chat (``[{"role": ..., "content": ...}]``) ready for the assistant's answer."""

    def fingerprint(self) -> str:
        """A digest of the tokenizer (token list and special tokens) to check that two models can pair."""

    def reset(self) -> None:
        """Drop the whole cache."""

    def prefill(self, ids: Sequence[int]) -> torch.Tensor:
        """Make the cache hold exactly ``ids`` (reusing a common cached prefix) and return the last position's logits."""

    def forward_tree(self, tree: TokenTree, start: int = 0) -> torch.Tensor:
        """Logits (n - start, V) of nodes ``start..n-1`` of ``tree``, evaluated after the committed prefix in one call.

        Nodes ``0..start-1`` must have been evaluated by earlier calls on the same tree since the last commit; their
        KV entries are reused. This is how a drafter grows a tree level by level.
        """

    def commit(self, path: Sequence[int]) -> None:
        """Keep the evaluated nodes ``path`` (a root-to-node path, in order) in the cache; drop all other tree nodes."""


def reusable_prefix(committed: Sequence[int], ids: Sequence[int]) -> int:
    """How many cached tokens a prefill of ``ids`` can keep: the common prefix, leaving at least one token of ``ids``
    to evaluate so that its logits exist."""
    common = 0
    for a, b in zip(committed, ids):
        if a != b:
            break
        common += 1
    return min(common, len(ids) - 1)


def check_tree_call(name: str, evaluated: int, start: int, n: int) -> None:
    """Raise BackendError unless ``forward_tree`` of a tree of ``n`` nodes from ``start`` continues the evaluated ones."""
    if start != evaluated:
        raise BackendError(f"{name}: asked to evaluate from node {start} but {evaluated} are cached")
    if n <= start:
        raise BackendError(f"{name}: nothing to evaluate (tree of {n} nodes from {start})")


def check_fits(backend: Backend, needed: int) -> None:
    """Raise ContextLengthError when ``needed`` cached positions would exceed the backend's context."""
    if needed > backend.context_length:
        raise ContextLengthError(
            f"{backend.name}: {needed} tokens do not fit in the context window of {backend.context_length} tokens"
        )


def tokenizer_digest(pieces: Sequence[str | None], added: Mapping[int, bool]) -> str:
    """A backend-independent digest of a tokenizer, so that HF and llama.cpp loads of one tokenizer compare equal.

    ``pieces`` are the token strings in id order (None for an id the tokenizer does not use); ``added`` maps the ids
    of added tokens to whether they are control (special) tokens. GGUF converters fill unused ids with ``[PAD<id>]``
    that a transformers tokenizer does not have, so such fillers count as unused, and trailing unused ids are dropped.
    """
    normalised = [None if p is None or p == f"[PAD{i}]" else p for i, p in enumerate(pieces)]
    while normalised and normalised[-1] is None:
        normalised.pop()
    h = hashlib.sha256()
    h.update(json.dumps(normalised, ensure_ascii=False).encode())
    h.update(json.dumps(sorted((int(i), bool(c)) for i, c in added.items())).encode())
    return h.hexdigest()
