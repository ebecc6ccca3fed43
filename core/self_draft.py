"""Self-speculation: the target's first layers draft for it (early exit, as in Draft&Verify, LayerSkip, Kangaroo).

The draft model is the target's embedding, its first ``L`` decoder layers, its final norm and its head: the target's
own modules, no copy (:func:`early_exit_model`). For the committed tokens, the keys and values of those layers are
exactly the target's (same weights, same inputs, same positions), so the draft reads them from the target's static
cache and computes no prefill of its own. It writes the tree it drafts into the target's free slots after the
committed prefix: the engine drafts before the target evaluates a step, and the target commits before the next draft,
so at draft time those slots are scratch that the target's next call overwrites before reading them
(core.backends.hf: ``kv_cache``, ``holds_tree``).

Exact by construction: :class:`SelfDraft` drafts with the ordinary :class:`core.drafting.ModelDrafter` over
:class:`EarlyExit`, so every node carries the processed early-exit distribution its token was sampled from.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Sequence

import torch

from core.backends.base import Backend, BackendError, Progress, check_fits, check_tree_call
from core.backends.cuda_graphs import MAX_ROWS, FixedShapeSteps, evaluate
from core.backends.devices import DECODE_ADVICE, out_of_memory_as_error
from core.backends.hf import HFBackend, cache_keyword
from core.backends.infill import FimTokens
from core.backends.static_cache import StepInputs, forward_into_cache
from core.drafting import SAMPLING_MODES, ModelDrafter
from core.sampling import Rng, SamplingParams
from core.tree import TokenTree, depths_of, shape_from_parents

SOURCE = "self"   # the drafter's name in a tree (TokenTree.source), coloured by the tree view


def decoder_layers(model) -> torch.nn.ModuleList:
    """The list of decoder layers of a transformers causal LM (Llama, Qwen2, Mistral, ... keep it as ``layers``)."""
    layers = getattr(model.get_decoder(), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(f"self-speculation needs a decoder that keeps its layers in a `layers` list (Llama, Qwen2, "
                         f"Mistral, ...); {type(model).__name__} does not")
    return layers


def early_exit_model(model, layers: int):
    """``model`` computing only its first ``layers`` decoder layers, then its final norm and head.

    A shallow copy of the model and of its decoder whose layer list holds the first ``layers`` of the same layer
    modules: every weight is the target's, and the model's own forward (masks, rotary embeddings) runs unchanged.
    """
    decoder = model.get_decoder()
    short = copy.copy(decoder)
    short._modules = dict(decoder._modules)
    short._modules["layers"] = decoder_layers(model)[:layers]
    names = [name for name, module in model._modules.items() if module is decoder]
    if len(names) != 1:
        raise ValueError(f"self-speculation: the decoder of {type(model).__name__} is not one of its direct parts")
    view = copy.copy(model)
    view._modules = dict(model._modules)
    view._modules[names[0]] = short
    return view


class EarlyExit:
    """A Backend over the first ``layers`` layers of an HFBackend's model and KV cache (see the module docstring).

    Its committed tokens are always the target's: :meth:`prefill` checks that the target holds them and
    :meth:`commit` that the target committed the path; neither moves a cache entry. Its trees are written into the
    target's scratch slots, which it refuses to touch while the target holds an uncommitted tree of its own.
    """

    def __init__(self, target: Backend, layers: int) -> None:
        if not isinstance(target, HFBackend):
            raise ValueError(f"self-speculation needs the transformers backend: {target.name} runs on "
                             f"{type(target).__name__}, and llama.cpp gives no access to intermediate layers")
        total = len(decoder_layers(target.model))
        if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers < total:
            raise ValueError(f"SelfDraft: layers must be an integer in 1..{total - 1} ({target.name} has {total} "
                             f"layers), got {layers!r}")
        self.target = target
        self.layers = layers
        self.name = f"{target.name} (first {layers} of {total} layers)"
        self.model = early_exit_model(target.model, layers)
        self._cache_arg = cache_keyword(self.model)
        whole = target.kv_cache
        # the same cache class over a view of the first layers' entries: writes land in the target's tensor
        self._cache = copy.copy(whole)
        self._cache.kv = whole.kv[:layers]
        # the draft runs fixed shapes exactly when the target does: its cache then has room for their padding
        fixed = whole.max_len >= target.context_length + MAX_ROWS
        self._steps = (FixedShapeSteps(self._forward, target.dtype, target.device, whole.max_len,
                                       capture=target.device.startswith("cuda")) if fixed else None)
        self.reset()

    # -- what it shares with the target ----------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.target.vocab_size

    @property
    def eos_ids(self) -> frozenset[int]:
        return self.target.eos_ids

    @property
    def context_length(self) -> int:
        return self.target.context_length

    @property
    def device(self) -> str:
        return self.target.device

    @property
    def committed(self) -> list[int]:
        return self.target.committed

    def tokenize(self, text: str) -> list[int]:
        return self.target.tokenize(text)

    def tokenize_special(self, text: str) -> list[int]:
        return self.target.tokenize_special(text)

    def infill_tokens(self) -> FimTokens | None:
        return self.target.infill_tokens()

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.target.detokenize(ids)

    def special_name(self, token: int) -> str | None:
        return self.target.special_name(token)

    def apply_chat_template(self, messages: Sequence[dict], tools: Sequence[dict] = ()) -> list[int]:
        return self.target.apply_chat_template(messages, tools)

    def fingerprint(self) -> str:
        return self.target.fingerprint()

    # -- the cache discipline --------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Drop the drafted tree (the committed entries are the target's, reset with it)."""
        self._tree: TokenTree | None = None
        self._evaluated = 0
        self._prefix = 0

    def _scratch(self) -> int:
        """The first free slot of the target's cache; refuses while the target's own tree occupies the slots."""
        if self.target.holds_tree:
            raise BackendError(f"{self.name}: the target holds a tree it has not committed; the early-exit draft "
                               "writes the target's cache only between a commit and the target's next call")
        return len(self.target.committed)

    @torch.inference_mode()
    def prefill(self, ids: Sequence[int], cancel=None, progress: Progress | None = None) -> torch.Tensor:
        """Check that the target's cache holds exactly ``ids`` and return the last one's early-exit logits."""
        ids = [int(t) for t in ids]
        if not ids:
            raise BackendError("prefill needs at least one token")
        prefix = self._scratch()
        if self.target.committed != ids:
            raise BackendError(f"{self.name} reads the committed tokens from the target's cache, which holds "
                               f"{prefix} other tokens than these {len(ids)}: prefill the target first")
        check_fits(self, prefix + 1)
        self.reset()
        # the last token is evaluated again at the first free slot, standing in for its committed twin (which it
        # does not see): no committed entry is rewritten
        dtype = self.target.dtype
        inputs = StepInputs.allocate(1, prefix + 1, dtype, self.device)
        inputs.index.copy_(torch.tensor([[ids[-1]], [prefix - 1], [prefix]]))
        inputs.mask[..., prefix - 1] = torch.finfo(dtype).min
        with out_of_memory_as_error(f"evaluating a token with {self.name}", self.device, DECODE_ADVICE):
            logits = self._forward(inputs)[-1]
        if progress is not None:
            progress(len(ids), len(ids))
        return logits

    @torch.inference_mode()
    def forward_tree(self, tree: TokenTree, start: int = 0) -> torch.Tensor:
        n = len(tree)
        check_tree_call(self.name, self._evaluated, start, n)
        prefix = self._scratch()
        if start and prefix != self._prefix:
            raise BackendError(f"{self.name}: the target committed tokens since nodes 0..{start - 1} were evaluated")
        check_fits(self, prefix + n)
        self._tree, self._evaluated = None, 0
        with out_of_memory_as_error(f"drafting {n - start} tokens with {self.name}", self.device, DECODE_ADVICE):
            logits = evaluate(self._steps, self._forward, tree, start, prefix, self.target.dtype, self.device)
        self._tree, self._evaluated, self._prefix = tree, n, prefix
        return logits

    def _forward(self, inputs: StepInputs) -> torch.Tensor:
        """The early-exit logits (rows, vocab) for filled inputs; keys and values go to the shared cache in place."""
        return forward_into_cache(self.model, self._cache, self._cache_arg, inputs)

    def commit(self, path: Sequence[int]) -> None:
        """End the tree, after checking that the target committed ``path`` (the target keeps the entries)."""
        path = [int(i) for i in path]
        if any(not 0 <= i < self._evaluated for i in path):
            raise BackendError(f"{self.name}: commit of nodes {path} but only {self._evaluated} were evaluated")
        tokens = [self._tree.tokens[i] for i in path] if path else []
        held = self.target.committed[self._prefix:self._prefix + len(path)]
        if held != tokens:
            raise BackendError(f"{self.name}: the target did not commit {tokens} (it holds {held} there); the "
                               "early-exit draft keeps what the target keeps, so the target commits first")
        self.reset()


@dataclass(frozen=True)
class SelfDraft:
    """Self-speculation: the target's first ``layers`` layers draft a static tree (default a chain of 4), sampled
    like :class:`core.drafting.Tree` (``without_replacement``, ``iid`` or ``top_k``).

    No draft model: ``SpeculativeEngine(target, None, SelfDraft(layers=8))``. The target must run on the
    transformers backend; :meth:`bind` (the engine calls it) refuses any other.
    """

    layers: int
    parents: tuple[int, ...] = (-1, 0, 1, 2)
    sampling: str = "without_replacement"
    # the early-exit view of the bound target, kept across generations (CUDA graphs are captured once)
    _bound: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.layers, bool) or not isinstance(self.layers, int) or self.layers < 1:
            raise ValueError(f"SelfDraft: layers must be a positive integer, got {self.layers!r}")
        object.__setattr__(self, "parents", tuple(shape_from_parents(self.parents)))
        if self.sampling not in SAMPLING_MODES:
            raise ValueError(f"SelfDraft: unknown sampling {self.sampling!r}; choose one of {SAMPLING_MODES}")

    @property
    def label(self) -> str:
        n = len(self.parents)
        shape = f"chain of {n}" if self.parents == tuple(range(-1, n - 1)) else \
            f"{n} nodes, depth {max(depths_of(self.parents))}"
        return f"SelfDraft({self.layers} layer{'s' if self.layers > 1 else ''}, {shape})"

    def bind(self, target: Backend, draft: Backend | None, sampling: SamplingParams) -> None:
        """Build (once per target) the early-exit view the drafters draft with; ``draft`` is not used."""
        view = self._bound.get("view")
        if view is None or view.target is not target:
            self._bound["view"] = EarlyExit(target, self.layers)

    def make_drafter(self, draft: Backend | None, params: SamplingParams, rng: Rng) -> ModelDrafter:
        view = self._bound.get("view")
        if view is None:
            raise ValueError(f"{self.label} drafts with its target's layers: bind it to the target first "
                             "(SpeculativeEngine does)")
        return ModelDrafter(view, self.parents, self.sampling, params, rng, SOURCE)
