"""PyTorch + transformers backend: tree attention through SDPA with an ancestor mask over a static KV cache.

The cache (core.backends.static_cache) is allocated once for the whole context; a tree's nodes are written in place
at the slots after the committed prefix and the accepted path is moved down on commit. On CUDA the calls of a
decoding step run in fixed shapes captured as CUDA graphs (core.backends.cuda_graphs); larger calls, such as
prefill chunks, run eagerly with exact shapes.
"""
from __future__ import annotations

import hashlib
import inspect
import logging
from typing import Sequence

import torch

from core.backends.base import (BackendError, Progress, check_fits, check_tree_call, plain_text_template,
                                prefill_chunks, reusable_prefix, tokenizer_digest)
from core.backends.byte_level import symbol_bytes
from core.backends.cuda_graphs import MAX_ROWS, FixedShapeSteps, evaluate
from core.backends.devices import DECODE_ADVICE, LOAD_ADVICE, check_device, out_of_memory_as_error
from core.backends.infill import FimTokens, spelled
from core.backends.static_cache import StepInputs, TreeKVCache, forward_into_cache
from core.tree import TokenTree

log = logging.getLogger(__name__)

# Tokens per prefill forward: Stop is checked between chunks (see core.backends.base.prefill_chunks).
PREFILL_CHUNK = 256


class HFBackend:
    """Wraps any transformers causal LM (Qwen2, Llama, ...) and optionally its tokenizer.

    Without a tokenizer, text is rendered as ``<id>`` markers: enough for tests on tiny random models. The model is
    used in the dtype it comes in (the loader chooses it: core.backends.devices.default_dtype).
    ``static_shapes`` runs the calls of a decoding step in fixed shapes, captured as CUDA graphs on CUDA; None
    turns it on exactly on CUDA. On the CPU, True runs the same fixed-shape calls eagerly (what tests check).
    """

    def __init__(self, model, tokenizer=None, device: str | None = None, name: str | None = None,
                 context_length: int | None = None, static_shapes: bool | None = None) -> None:
        self.device = check_device(device)
        on_cuda = self.device.startswith("cuda")
        static_shapes = on_cuda if static_shapes is None else static_shapes
        self.tokenizer = tokenizer
        config = model.config
        self.name = name or getattr(config, "name_or_path", "") or config.model_type
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.context_length = int(context_length or getattr(config, "max_position_embeddings", 2048))
        slots = self.context_length + (MAX_ROWS if static_shapes else 0)
        with out_of_memory_as_error(f"loading {self.name}", self.device, LOAD_ADVICE):
            self.model = model.to(self.device).eval()
            self.dtype = next(self.model.parameters()).dtype
            self._cache = TreeKVCache(config, slots, self.dtype, self.device, zeroed=static_shapes)
        _use_sdpa(self.model)
        self._cache_arg = cache_keyword(self.model)
        self._steps = (FixedShapeSteps(self._forward, self.dtype, self.device, slots, capture=on_cuda)
                       if static_shapes else None)
        self.eos_ids = frozenset(self._eos_ids())
        self._specials = {int(i): str(t) for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()
                          if getattr(t, "special", False)}
        self._text_cache: dict[int, str] = {}
        self._infill = spelled(tokenizer.get_vocab(), self._begin()) if tokenizer is not None else None
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

    def tokenize_special(self, text: str) -> list[int]:
        return self._tokenize(text, split_special=False, add_special=True)

    def _begin(self) -> int | None:
        """The begin-of-text token the tokenizer puts before a text, None where it puts none."""
        bare = self._tokenize("a", split_special=True)
        whole = self._tokenize("a", split_special=True, add_special=True)
        return whole[0] if len(whole) == len(bare) + 1 and whole[1:] == bare else None

    def infill_tokens(self) -> FimTokens | None:
        return self._infill

    def _tokenize(self, text: str, split_special: bool, add_special: bool = False) -> list[int]:
        if self.tokenizer is None:
            raise BackendError(f"{self.name} has no tokenizer: pass token ids instead of text")
        # lone surrogates cannot be encoded: they become U+FFFD rather than an error deep in the tokenizer
        text = text.encode("utf-8", errors="replace").decode("utf-8")
        ids = self.tokenizer(text, add_special_tokens=add_special, split_special_tokens=split_special)["input_ids"]
        return list(ids)

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

    def piece_bytes(self, token: int) -> bytes:
        """The vocabulary symbol's own bytes (byte-level, byte-fallback, or SentencePiece's with its word mark as a
        space) where they read as the token's text, else that text: a tokenizer's decode shows only U+FFFD for part
        of a character, and drops the space a word's first token begins with."""
        tok = int(token)
        text = self.detokenize([tok])
        if self.tokenizer is None or tok in self._specials:
            return text.encode()
        symbol = self.tokenizer.convert_ids_to_tokens(tok) or ""
        raw = symbol_bytes(symbol)
        if raw is None:
            raw = symbol.replace("\u2581", " ").encode()
        return raw if raw.decode("utf-8", errors="replace").strip() == text.strip() else text.encode()

    def special_name(self, token: int) -> str | None:
        return self._specials.get(int(token))

    @property
    def chat_template(self) -> str | None:
        """The tokenizer's chat template (jinja2), as a llama.cpp model's GGUF holds one."""
        return getattr(self.tokenizer, "chat_template", None)

    def apply_chat_template(self, messages: Sequence[dict], tools: Sequence[dict] = ()) -> list[int]:
        if not self.chat_template:
            raise BackendError(f"{self.name} has no chat template")

        def render(masked: list[dict]) -> str:
            return self.tokenizer.apply_chat_template(masked, tools=list(tools) or None, add_generation_prompt=True,
                                                      tokenize=False)

        return plain_text_template(messages, render, list(self._specials.values()),
                                   lambda markup: self._tokenize(markup, split_special=False),
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
        self._committed: list[int] = []
        self._tree: TokenTree | None = None
        self._evaluated = 0

    def prefill(self, ids: Sequence[int], cancel=None, progress: Progress | None = None) -> torch.Tensor:
        ids = [int(t) for t in ids]
        if not ids:
            raise BackendError("prefill needs at least one token")
        check_fits(self, len(ids))
        self._tree, self._evaluated = None, 0
        del self._committed[reusable_prefix(self._committed, ids):]
        for lo, hi in prefill_chunks(len(self._committed), len(ids), self.prefill_chunk, cancel, progress):
            logits = self.forward_tree(TokenTree.chain(ids[lo:hi]))
            self.commit(range(hi - lo))
        return logits[-1]

    @torch.inference_mode()
    def forward_tree(self, tree: TokenTree, start: int = 0) -> torch.Tensor:
        n = len(tree)
        check_tree_call(self.name, self._evaluated, start, n)
        prefix = len(self._committed)
        check_fits(self, prefix + n)
        # until the call succeeds the tree counts as dropped: after a failure (out of memory) the cache holds the
        # committed prefix, whose slots no call writes, and the chat can go on from there
        self._tree, self._evaluated = None, 0
        with out_of_memory_as_error(f"evaluating {n - start} tokens with {self.name}", self.device, DECODE_ADVICE):
            logits = evaluate(self._steps, self._forward, tree, start, prefix, self.dtype, self.device)
        self._tree, self._evaluated = tree, n
        return logits

    def _forward(self, inputs: StepInputs) -> torch.Tensor:
        """The model's logits (rows, vocab) for filled inputs; keys and values go to the cache in place."""
        try:
            return forward_into_cache(self.model, self._cache, self._cache_arg, inputs)
        except RuntimeError as exc:
            if not _sdpa_kernel_refused(self.model, exc):
                raise
        # torch's CPU flash-attention kernel packs bfloat16 for AMX whenever the CPU has AMX, and refuses when ATen
        # runs below AVX-512 (ATEN_CPU_CAPABILITY=default or avx2 on an AMX Xeon): eager attention takes the same mask.
        # The failed call wrote only these inputs' own cache slots, which the retry writes again.
        log.warning("%s: torch's SDPA kernel is not usable on this CPU setting; using eager attention", self.name)
        self.model.set_attn_implementation("eager")
        return forward_into_cache(self.model, self._cache, self._cache_arg, inputs)

    @torch.inference_mode()
    def commit(self, path: Sequence[int]) -> None:
        path = [int(i) for i in path]
        if any(not 0 <= i < self._evaluated for i in path):
            raise BackendError(f"{self.name}: commit of nodes {path} but only {self._evaluated} were evaluated")
        self._cache.keep(len(self._committed), path)
        if self._tree is not None:
            self._committed += [self._tree.tokens[i] for i in path]
        self._tree, self._evaluated = None, 0

    # -- shared with a draft that runs this model's first layers (core.self_draft) ----------------------------------
    @property
    def kv_cache(self) -> TreeKVCache:
        """The static cache itself. Slots below ``len(committed)`` hold the committed tokens' keys and values; while
        :attr:`holds_tree` is False the slots after them are scratch, which this backend's next call overwrites
        before reading. The early-exit draft of core.self_draft reads the committed entries of the first layers
        and drafts in that scratch."""
        return self._cache

    @property
    def holds_tree(self) -> bool:
        """Whether the slots after the committed prefix hold a tree evaluated since the last commit."""
        return self._evaluated > 0


def cache_keyword(model) -> str:
    """The keyword ``model.forward`` takes its cache by: transformers renamed ``past_key_values`` to ``cache`` during
    5.x, and an unknown keyword would be ignored silently."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _sdpa_kernel_refused(model, exc: RuntimeError) -> bool:
    """Whether ``exc`` is SDPA's CPU kernel refusing to run on this CPU setting (not a bug in the call)."""
    return model.config._attn_implementation == "sdpa" and "pack_vnni" in str(exc)


def _use_sdpa(model) -> None:
    """Attend through torch's scaled_dot_product_attention, which takes the 4D float tree mask as it is."""
    if model.config._attn_implementation == "sdpa":
        return
    try:
        model.set_attn_implementation("sdpa")
    except (ValueError, ImportError) as exc:   # an architecture without SDPA support keeps its own attention
        log.info("%s keeps %s attention: %s", type(model).__name__, model.config._attn_implementation, exc)
