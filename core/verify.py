"""Lossless verification of a drafted token tree (ALGORITHMS.md §3). Pure functions: no model calls.

One algorithm covers chain speculative sampling, SpecInfer's multi-step speculative sampling (children drawn i.i.d.),
Sequoia (children drawn without replacement), deterministic top-k children (one-hot q) and greedy decoding (the
target's distribution is one-hot at its argmax, so the same rule follows the child equal to the argmax, else emits it).
What makes the rule exact for all of them is that each child carries the distribution it was really drawn from,
conditional on its earlier siblings (see :class:`core.tree.Proposal`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Collection

import torch

from core.sampling import Rng
from core.tree import TokenTree


@dataclass(frozen=True)
class Verdict:
    """The outcome of verifying one tree."""

    accepted: tuple[int, ...]          # drafted node indices along the accepted path, root to leaf
    extra: int | None                  # correction or bonus token; None when an accepted token was EOS
    bonus: bool                        # True when ``extra`` was drawn at an accepted leaf (everything below accepted)
    accept_probs: dict[int, float] = field(default_factory=dict)  # node -> min(1, R[x]/D[x]) for each tested node
    target_p: dict[int, float] = field(default_factory=dict)      # node -> P_parent[x], the target's own probability

    @property
    def tested(self) -> set[int]:
        return set(self.accept_probs)


def acceptance_probability(residual: torch.Tensor, drawn_from: torch.Tensor, token: int) -> float:
    """min(1, R[x] / D[x]); a token the drafter could not have drawn (D[x] = 0) is never accepted."""
    d = float(drawn_from[token])
    r = float(residual[token])
    if d <= 0.0:
        return 0.0
    return min(1.0, r / d)


def residual_after_rejection(residual: torch.Tensor, drawn_from: torch.Tensor) -> torch.Tensor:
    """norm(max(R - D, 0)); when that is empty (R <= D everywhere) R is kept as it was."""
    rest = torch.clamp(residual - drawn_from, min=0.0)
    total = float(rest.sum())
    if total <= 0.0:
        return residual
    return rest / total


def verify_tree(
    tree: TokenTree,
    target_dist: Callable[[int], torch.Tensor],
    rng: Rng,
    eos_ids: Collection[int] = (),
    target_prob: Callable[[int, int], float] | None = None,
) -> Verdict:
    """Walk the tree from the root, accepting children by speculative sampling, and draw the extra token.

    ``target_dist(u)`` returns the target's processed distribution for the children of node ``u`` (-1 = root):
    one-hot at the argmax for greedy decoding. It is called only for the nodes the walk reaches.

    ``target_prob(u, x)``, when given, is ``target_dist(u)[x]`` read without building the distribution. A first child
    drafted deterministically (q one-hot) is then tested with it: rule 3 accepts it with probability min(1, P[x] / 1),
    and ``P`` is built only when it is rejected or for the extra token. A copied draft of ten accepted tokens builds
    one distribution instead of eleven.
    """
    u = -1
    accepted: list[int] = []
    accept_probs: dict[int, float] = {}
    target_p: dict[int, float] = {}
    while True:
        children = tree.children(u)
        next_node = None
        quick = target_prob is not None and bool(children) and tree.proposals[children[0]].dist is None
        if quick:
            first = children[0]
            a = accept_probs[first] = target_p[first] = min(1.0, target_prob(u, tree.tokens[first]))
            if rng.accept(a):
                next_node = first
        if next_node is None:
            p = target_dist(u).detach().to("cpu", torch.float64)
            residual = p
            for i, child in enumerate(children):
                x = tree.tokens[child]
                drawn_from = tree.proposals[child].distribution(x, p.shape[-1])
                if not (quick and i == 0):     # the quick test above has drawn its coin already
                    a = accept_probs[child] = acceptance_probability(residual, drawn_from, x)
                    target_p[child] = float(p[x])
                    if rng.accept(a):
                        next_node = child
                        break
                residual = residual_after_rejection(residual, drawn_from)
            if next_node is None:
                bonus = bool(accepted) and not children
                return Verdict(tuple(accepted), rng.sample(residual), bonus, accept_probs, target_p)
        accepted.append(next_node)
        u = next_node
        if tree.tokens[u] in eos_ids:
            return Verdict(tuple(accepted), None, False, accept_probs, target_p)


def verify_greedy(tree: TokenTree, target_argmax: Callable[[int], int], eos_ids: Collection[int] = ()) -> Verdict:
    """Rule 3 when the target's distribution is one-hot at its argmax (temperature 0), without building it.

    Then ``R[x] / D[x]`` is 0 for every child but the argmax (which any drafter that could draw it accepts), and a
    rejection leaves ``R`` one-hot: follow the child whose token is ``target_argmax(u)``, else emit that argmax.
    The output equals :func:`verify_tree`'s with a one-hot target (a test checks it), at the cost of one argmax per
    node reached instead of several vocabulary-sized vectors.
    """
    u = -1
    accepted: list[int] = []
    tested: dict[int, float] = {}
    while True:
        best = target_argmax(u)
        children = tree.children(u)
        next_node = None
        for child in children:
            hit = tree.tokens[child] == best
            tested[child] = 1.0 if hit else 0.0
            if hit:
                next_node = child
                break
        if next_node is None:
            return Verdict(tuple(accepted), best, bool(accepted) and not children, tested)
        accepted.append(next_node)
        u = next_node
        if tree.tokens[u] in eos_ids:
            return Verdict(tuple(accepted), None, False, tested)
