"""PyTorch + transformers backend: tree attention with a 4D mask and position ids, KV compaction with index_select."""
from __future__ import annotations

import hashlib
from typing import Sequence

import torch

from core.backends.base import (BackendError, Progress, check_fits, check_tree_call, plain_text_template,
                                prefill_chunks, reusable_prefix, tokenizer_digest)
from core.tree import TokenTree


# Tokens per prefill forward: Stop is checked between chunks (see core.backends.base.prefill_chunks).
PREFILL_CHUNK = 256


def default_device() -> str:
    """CUDA when present, else CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"


class HFBackend:
    """Wraps any transformers causal LM (Qwen2, Llama, ...) and optionally its tokenizer.

    Without a tokenizer, text is rendered as ``<id>`` markers: enough for tests on tiny random models.
    """

    def __init__(self, model, tokenizer=None, device: str | None = None, name: str | None = None,
                 context_length: int | None = None) -> None:
        from transformers import DynamicCache  # imported lazily: `import core` stays light

        self._cache_cls = DynamicCache
        self.device = device or default_device()
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        config = model.config
        self.name = name or getattr(config, "name_or_path", "") or config.model_type
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.context_length = int(context_length or getattr(config, "max_position_embeddings", 2048))
        self.eos_ids = frozenset(self._eos_ids())
        self._specials = {int(i): str(t) for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()
                          if getattr(t, "special", False)}
        self._text_cache: dict[int, str] = {}
        self.prefill_chunk = PREFILL_CHUNK
        self.reset()

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (self.model.config, getattr(self.model, "generation_config", None), self.tokenizer):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        return ids

    # -- tokenizer ---------------------------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        """Token ids of plain ``text``: special-token text such as ``<|im_end|>`` stays text."""
        return self._tokenize(text, split_special=True)

    def _tokenize(self, text: str, split_special: bool) -> list[int]:
        if self.tokenizer is None:
            raise BackendError(f"{self.name} has no tokenizer: pass token ids instead of text")
        # lone surrogates cannot be encoded: they become U+FFFD rather than an error deep in the tokenizer
        text = text.encode("utf-8", errors="replace").decode("utf-8")
        return list(self.tokenizer(text, add_special_tokens=False, split_special_tokens=split_special)["input_ids"])

    def detokenize(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` as a reader sees it: control tokens render as nothing."""
        if self.tokenizer is None:
            return "".join(f"<{int(i)}>" for i in ids)
        if len(ids) == 1:
            tok = int(ids[0])
            if tok not in self._text_cache:
                self._text_cache[tok] = "" if tok in self._specials else self.tokenizer.decode([tok])
            return self._text_cache[tok]
        return self.tokenizer.decode([int(t) for t in ids if int(t) not in self._specials])

    def special_name(self, token: int) -> str | None:
        return self._specials.get(int(token))

    def apply_chat_template(self, messages: Sequence[dict]) -> list[int]:
        if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
            raise BackendError(f"{self.name} has no chat template")

        def render(masked: list[dict]) -> str:
            return self.tokenizer.apply_chat_template(masked, add_generation_prompt=True, tokenize=False)

        return plain_text_template(messages, render, lambda markup: self._tokenize(markup, split_special=False),
                                   self.tokenize)

    def fingerprint(self) -> str:
        if self.tokenizer is None:
            return hashlib.sha256(f"no-tokenizer:{self.vocab_size}".encode()).hexdigest()
        vocab = self.tokenizer.get_vocab()
        pieces: list[str | None] = [None] * (max(vocab.values(), default=-1) + 1)
        for piece, i in vocab.items():
            pieces[i] = piece
        added = {int(i): bool(t.special) for i, t in self.tokenizer.added_tokens_decoder.items()}
        return tokenizer_digest(pieces, added)

    # -- cache -------------------------------------------------------------------------------------------------
    @property
    def committed(self) -> list[int]:
        return list(self._committed)

    def reset(self) -> None:
        self._cache = self._cache_cls(config=self.model.config)
        self._committed: list[int] = []
        self._tree: TokenTree | None = None
        self._evaluated = 0

    def prefill(self, ids: Sequence[int], cancel=None, progress: Progress | None = None) -> torch.Tensor:
        ids = [int(t) for t in ids]
        if not ids:
            raise BackendError("prefill needs at least one token")
        check_fits(self, len(ids))
        self._drop_tree()
        common = reusable_prefix(self._committed, ids)
        if common < len(self._committed):
            self._cache.crop(common - len(self._committed))
            del self._committed[common:]
        for lo, hi in prefill_chunks(common, len(ids), self.prefill_chunk, cancel, progress):
            logits = self.forward_tree(TokenTree.chain(ids[lo:hi]))
            self.commit(list(range(hi - lo)))
        return logits[-1]

    def _drop_tree(self) -> None:
        if self._evaluated:
            self._cache.crop(-self._evaluated)
        self._tree, self._evaluated = None, 0

    @torch.inference_mode()
    def forward_tree(self, tree: TokenTree, start: int = 0) -> torch.Tensor:
        n = len(tree)
        check_tree_call(self.name, self._evaluated, start, n)
        prefix = len(self._committed)
        check_fits(self, prefix + n)
        new = range(start, n)
        dtype = next(self.model.parameters()).dtype
        visible = torch.zeros((n - start, prefix + n), dtype=torch.bool)
        visible[:, :prefix] = True
        visible[:, prefix:] = tree.ancestor_mask()[start:]
        mask = torch.zeros(visible.shape, dtype=dtype)
        mask.masked_fill_(~visible, torch.finfo(dtype).min)
        ids = torch.tensor([[tree.tokens[i] for i in new]], device=self.device)
        positions = torch.tensor([[prefix + tree.depths[i] - 1 for i in new]], device=self.device)
        out = self.model(input_ids=ids, attention_mask=mask[None, None].to(self.device), position_ids=positions,
                         cache=self._cache, use_cache=True)
        self._tree, self._evaluated = tree, n
        return out.logits[0].detach()

    def commit(self, path: Sequence[int]) -> None:
        path = [int(i) for i in path]
        if any(not 0 <= i < self._evaluated for i in path):
            raise BackendError(f"{self.name}: commit of nodes {path} but only {self._evaluated} were evaluated")
        prefix = len(self._committed)
        tree = self._tree
        if path == list(range(len(path))):
            # the accepted nodes already sit right after the prefix: dropping the tail is enough
            if self._evaluated > len(path):
                self._cache.crop(len(path) - self._evaluated)
        else:
            keep = torch.tensor(list(range(prefix)) + [prefix + i for i in path], device=self.device)
            for layer in self._cache.layers:
                layer.keys = layer.keys.index_select(-2, keep)
                layer.values = layer.values.index_select(-2, keep)
        if tree is not None:
            self._committed += [tree.tokens[i] for i in path]
        self._tree, self._evaluated = None, 0
