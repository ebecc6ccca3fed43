"""A Backend whose next-token distribution is a fixed random table of the context: exact and instant.

It implements the whole Backend protocol (cache discipline included) without a neural network, so the real engine,
drafters and verifier can be run through every random path and their output distribution computed exactly.
"""
from __future__ import annotations

import hashlib
from typing import Callable, Sequence

import torch

from core.tree import TokenTree


def random_table(vocab: int, seed: int, holes: float = 0.0, sharp: float = 1.0) -> Callable[[tuple], torch.Tensor]:
    """context -> a probability vector, fixed per context; ``holes`` is the chance that a token gets probability 0."""
    cache: dict[tuple, torch.Tensor] = {}

    def table(ctx: tuple) -> torch.Tensor:
        if ctx not in cache:
            digest = hashlib.sha256(repr((seed, ctx)).encode()).digest()
            gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
            p = torch.rand(vocab, generator=gen, dtype=torch.float64) ** sharp
            if holes:
                mask = torch.rand(vocab, generator=gen, dtype=torch.float64) < holes
                mask[int(torch.argmax(p))] = False
                p[mask] = 0.0
            cache[ctx] = p / p.sum()
        return cache[ctx]

    return table


class TableBackend:
    def __init__(self, table: Callable[[tuple], torch.Tensor], vocab: int, name: str = "table",
                 eos: Sequence[int] = (), context_length: int = 1024) -> None:
        self.table = table
        self.vocab_size = vocab
        self.name = name
        self.eos_ids = frozenset(eos)
        self.context_length = context_length
        self.device = "cpu"
        self.calls = 0
        self.reset()

    @property
    def committed(self) -> list[int]:
        return list(self._committed)

    def tokenize(self, text: str) -> list[int]:
        return [int(t) for t in text.split()]

    def tokenize_special(self, text: str) -> list[int]:
        return self.tokenize(text)      # a table has no special tokens

    def infill_tokens(self) -> None:
        return None

    def detokenize(self, ids: Sequence[int]) -> str:
        return "".join(f"<{i}>" for i in ids)

    def piece_bytes(self, token: int) -> bytes:
        return self.detokenize([token]).encode()

    def apply_chat_template(self, messages, tools=()) -> list[int]:
        return [int(t) for m in messages for t in m["content"].split()]

    def fingerprint(self) -> str:
        return f"table-vocab-{self.vocab_size}"

    def reset(self) -> None:
        self._committed: list[int] = []
        self._tree: TokenTree | None = None
        self._evaluated = 0

    def logits_for(self, ctx: Sequence[int]) -> torch.Tensor:
        return torch.log(self.table(tuple(ctx)))

    def special_name(self, token: int) -> str | None:
        return None

    def prefill(self, ids: Sequence[int], cancel=None, progress=None) -> torch.Tensor:
        self.reset()
        self._committed = [int(t) for t in ids]
        return self.logits_for(self._committed)

    def forward_tree(self, tree: TokenTree, start: int = 0) -> torch.Tensor:
        assert start == self._evaluated, (start, self._evaluated)
        self.calls += 1
        rows = []
        for j in range(start, len(tree)):
            rows.append(self.logits_for(self._committed + [tree.tokens[i] for i in tree.path_to(j)]))
        self._tree, self._evaluated = tree, len(tree)
        return torch.stack(rows)

    def commit(self, path: Sequence[int]) -> None:
        assert all(0 <= i < self._evaluated for i in path), (path, self._evaluated)
        expected = self._tree.path_to(path[-1]) if path else []
        assert list(path) == expected, f"commit path {path} is not a root-to-node path {expected}"
        self._committed += [self._tree.tokens[i] for i in path]
        self._tree, self._evaluated = None, 0
