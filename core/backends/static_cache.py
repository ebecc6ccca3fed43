"""A KV cache allocated once, written in place at the slots of a tree's nodes and compacted in place on commit, and
the inputs (token ids, positions, slots, ancestor mask) of one forward call over it.

Slot ``i`` of the cache holds cache position ``i``: the committed tokens fill slots ``0..prefix-1`` and node ``j`` of
the tree being evaluated sits at slot ``prefix + j``. Attention reads the first ``width`` slots through an additive
float mask (0 where visible, the dtype's minimum elsewhere) that gives each node the prefix and its own ancestors.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from transformers.cache_utils import Cache

from core.tree import TokenTree


class TreeKVCache(Cache):
    """Keys and values of every layer in one tensor ``kv`` of shape (layers, 2, kv heads, max_len, head dim).

    Before each forward call the caller names the slots the new tokens go to and how many leading slots attention
    reads (:meth:`use`); the model's attention layers then call :meth:`update`, which writes in place and returns
    views. Nothing is reallocated after construction, so the tensors keep their addresses (CUDA graphs rely on it).
    """

    def __init__(self, config, max_len: int, dtype: torch.dtype, device: str, zeroed: bool) -> None:
        super().__init__(layers=[])
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        # Fixed-shape calls read slots no call has written yet (masked out); zeros keep them finite, since the
        # garbage of torch.empty can hold NaN bit patterns and 0 * NaN is NaN. Calls of exact width never read
        # an unwritten slot, so they skip the cost of touching all of it up front.
        alloc = torch.zeros if zeroed else torch.empty
        self.kv = alloc((config.num_hidden_layers, 2, heads, max_len, head_dim), dtype=dtype, device=device)
        self.max_len = max_len
        self._slots: torch.Tensor | None = None
        self._width = 0

    def use(self, slots: torch.Tensor, width: int) -> None:
        """The next forward writes its tokens' keys and values at ``slots`` and attends over slots ``0..width-1``."""
        self._slots, self._width = slots, width

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        layer = self.kv[layer_idx]
        layer[0].index_copy_(1, self._slots, key_states[0])
        layer[1].index_copy_(1, self._slots, value_states[0])
        return layer[0, :, :self._width].unsqueeze(0), layer[1, :, :self._width].unsqueeze(0)

    def keep(self, start: int, nodes: Sequence[int]) -> None:
        """Move the entries at slots ``start + nodes[i]`` to ``start + i`` in every layer (a gather, then a copy into
        the same tensor): the accepted path lands right after the prefix."""
        nodes = list(nodes)
        if nodes == list(range(len(nodes))):
            return   # already in place
        src = torch.tensor([start + i for i in nodes], device=self.kv.device)
        self.kv[:, :, :, start:start + len(nodes)] = self.kv.index_select(3, src)


@dataclass(frozen=True)
class StepInputs:
    """The input tensors of one forward over ``rows`` new tokens attending over ``width`` cache slots.

    The shapes are fixed at allocation and :meth:`fill` writes in place, so a captured CUDA graph can read them.
    """

    index: torch.Tensor   # (3, rows): token ids, position ids (prefix + depth - 1), the slots the new keys go to
    mask: torch.Tensor    # (1, 1, rows, width) additive attention mask

    @classmethod
    def allocate(cls, rows: int, width: int, dtype: torch.dtype, device: str) -> "StepInputs":
        return cls(torch.zeros((3, rows), dtype=torch.long, device=device),
                   torch.zeros((1, 1, rows, width), dtype=dtype, device=device))

    @property
    def ids(self) -> torch.Tensor:
        return self.index[0:1]

    @property
    def positions(self) -> torch.Tensor:
        return self.index[1:2]

    @property
    def slots(self) -> torch.Tensor:
        return self.index[2]

    @property
    def rows(self) -> int:
        return self.index.shape[1]

    @property
    def width(self) -> int:
        return self.mask.shape[-1]

    def fill(self, tree: TokenTree, start: int, prefix: int) -> int:
        """Load nodes ``start..n-1`` of ``tree`` evaluated after ``prefix`` committed tokens; return their count.

        Rows past that count are padding: token 0 at a slot of its own after the tree, seeing only itself, so it
        never touches a real node's attention and its keys stay finite.
        """
        n = len(tree)
        count, rows = n - start, self.rows
        if not 0 < count <= rows or prefix + start + rows > self.width:
            raise ValueError(f"{count} nodes after {prefix + start} slots do not fit inputs of {rows} rows and "
                             f"{self.width} slots")
        pad = rows - count
        self.index.copy_(torch.tensor([tree.tokens[start:] + [0] * pad,   # one host-to-device copy for all three
                                       [prefix + d - 1 for d in tree.depths[start:]] + [prefix] * pad,
                                       list(range(prefix + start, prefix + start + rows))]))
        low = torch.finfo(self.mask.dtype).min
        block = torch.full((rows, start + rows), low, dtype=self.mask.dtype)   # who sees whom after the prefix
        block[:count, :n].masked_fill_(tree.ancestor_mask()[start:], 0.0)
        if pad:
            padding = torch.arange(count, rows)
            block[padding, start + padding] = 0.0
        end = prefix + start + rows
        mask = self.mask[0, 0]
        mask[:, :prefix] = 0.0
        mask[:, prefix:end] = block
        if end < self.width:
            mask[:, end:] = low
        return count


def forward_into_cache(model, cache, cache_arg: str, inputs: StepInputs) -> torch.Tensor:
    """``model``'s logits (rows, vocab) for filled ``inputs``; keys and values go to ``cache`` in place, at the
    inputs' slots."""
    cache.use(inputs.slots, inputs.width)
    out = model(input_ids=inputs.ids, attention_mask=inputs.mask, position_ids=inputs.positions, use_cache=True,
                **{cache_arg: cache})
    return out.logits[0]
