"""Token trees: the shape every drafter produces and every backend evaluates in one forward pass.

Nodes are stored in topological order (a parent always comes before its children) and the children of a node are
kept in drafting order, which the verifier relies on. Parent ``-1`` means "child of the root", the last token the
model has committed. Depth is 1 for the root's children; a node's position id is ``prefix_len + depth - 1``.
A chain is a tree whose nodes each have one child.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch


@dataclass(frozen=True)
class Proposal:
    """The distribution a drafted token was actually drawn from.

    ``dist`` is the draft's processed distribution at the parent (shared by siblings); ``exclude`` lists the sibling
    tokens drawn before this one when children are sampled without replacement, so the real distribution is ``dist``
    with those zeroed and renormalised. ``dist=None`` declares a deterministic choice: ``q`` is one-hot on the token.
    """

    dist: torch.Tensor | None = None
    exclude: tuple[int, ...] = ()

    def distribution(self, token: int, vocab_size: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """The normalised distribution this token was drawn from, as a dense vector."""
        if self.dist is None:
            d = torch.zeros(vocab_size, dtype=dtype)
            d[token] = 1.0
            return d
        d = self.dist.detach().to("cpu", dtype).clone()
        if self.exclude:
            d[list(self.exclude)] = 0.0
        return d / d.sum()

    def prob(self, token: int) -> float:
        """q(token) under the distribution it was drawn from."""
        if self.dist is None:
            return 1.0
        d = self.dist.detach().to("cpu", torch.float64)
        mass = 1.0 - float(d[list(self.exclude)].sum()) if self.exclude else 1.0
        return float(d[token]) / mass if mass > 0 else 0.0


@dataclass
class TokenTree:
    """A token tree; see the module docstring for the conventions. Build it with :meth:`add`."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    proposals: list[Proposal] = field(default_factory=list)
    source: list[str] = field(default_factory=list)

    @classmethod
    def chain(cls, tokens: Sequence[int], source: str = "") -> "TokenTree":
        """A tree of width one holding ``tokens`` in order, each declared deterministic."""
        tree = cls()
        for i, tok in enumerate(tokens):
            tree.add(int(tok), i - 1, Proposal(), source)
        return tree

    def add(self, token: int, parent: int, proposal: Proposal | None = None, source: str = "") -> int:
        """Append a node under ``parent`` (-1 for the root) and return its index."""
        if not -1 <= parent < len(self.tokens):
            raise ValueError(f"parent {parent} does not exist yet (tree has {len(self.tokens)} nodes)")
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.depths.append(1 if parent < 0 else self.depths[parent] + 1)
        self.proposals.append(proposal or Proposal())
        self.source.append(source)
        return len(self.tokens) - 1

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def max_depth(self) -> int:
        return max(self.depths, default=0)

    def children(self, node: int) -> list[int]:
        """Children of ``node`` (-1 = root) in drafting order."""
        return [i for i, p in enumerate(self.parents) if p == node]

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's child down to ``node`` inclusive."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def ancestor_mask(self) -> torch.Tensor:
        """Boolean (n, n) matrix: ``mask[i, j]`` is True when node i may attend to node j (j is i or an ancestor)."""
        n = len(self.tokens)
        mask = torch.zeros((n, n), dtype=torch.bool)
        for i, p in enumerate(self.parents):
            mask[i, i] = True
            if p >= 0:
                mask[i] |= mask[p]
        return mask

    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def attached_below(self, chain: Sequence[int]) -> "TokenTree":
        """A new tree: ``chain`` as a path from the root, with this tree hung under its last token.

        Engines use it to put the tokens a model has not cached yet in front of the drafted nodes; drafted node ``j``
        becomes node ``len(chain) + j``.
        """
        out = TokenTree.chain(chain, "pending")
        offset = len(chain)
        for tok, par, prop, src in zip(self.tokens, self.parents, self.proposals, self.source):
            out.add(tok, offset - 1 if par < 0 else par + offset, prop, src)
        return out

    def truncated(self, max_nodes: int | None = None, max_depth: int | None = None) -> "TokenTree":
        """The subtree of nodes kept by a node budget (earliest first) and a depth limit; order is preserved."""
        out = TokenTree()
        remap: dict[int, int] = {}
        for i, (tok, par) in enumerate(zip(self.tokens, self.parents)):
            if max_nodes is not None and len(out) >= max_nodes:
                break
            if max_depth is not None and self.depths[i] > max_depth:
                continue
            if par >= 0 and par not in remap:
                continue
            remap[i] = out.add(tok, remap.get(par, -1), self.proposals[i], self.source[i])
        return out


def shape_from_parents(parents: Sequence[int]) -> list[int]:
    """Validate a static tree shape given as parent indices (-1 = child of the root) and return it as a list."""
    parents = [int(p) for p in parents]
    if not parents:
        raise ValueError("a tree shape needs at least one node")
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"node {i} has parent {p}: parents must come before their children (-1 = root)")
    return parents


def depths_of(parents: Sequence[int]) -> list[int]:
    """Depth of every node of a shape (root children have depth 1)."""
    depths: list[int] = []
    for p in parents:
        depths.append(1 if p < 0 else depths[p] + 1)
    return depths
