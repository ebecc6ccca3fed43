"""Several drafters in one tree: how many of a call's tokens each one gets (SpecInfer's merged token tree, each part
sized by Sequoia's dynamic program). Pure functions of acceptance vectors; core.merge drafts the result.

The merged tree hangs every drafter's subtree from the root, in merge order, and rule 3 tests the root's children in
that order: drafter ``i``'s children are reached only when every earlier drafter's root children were rejected.
With ``V_i`` the value of drafter ``i``'s subtree (expected accepted tokens, Sequoia's ``F`` without the root) and
``A_i`` the chance that one of its root children is accepted, the merged tree is worth

    F = 1 + sum_i  prod_{j<i} (1 - A_j)  V_i

*if* drafter ``i``'s acceptance given that the earlier drafters' children were rejected is its acceptance alone.
That is the approximation: in truth rule 3 tests a later drafter against the residual left by the earlier
rejections, which raises its acceptance when the drafters disagree and lowers it when they propose the same tokens.
It disappears when each drafter's vector is measured in its merged position (conditional on being reached there).
Folding a deterministic token into an equal sibling (core.merge) can
only save nodes; the split ignores it.

Drafter models. ``shaped``: a model drafter that drafts any shape; ``acceptance`` is Sequoia's ``a_r`` (the rank-r
child of a node is the accepted one), the same at every node. Not shaped: a lookup (n-gram, memory) that drafts the
chain it finds; ``acceptance[t]`` is the chance that its token at depth ``t + 1`` is accepted given its parent was.

The DP, back to front over the drafters: ``G_i(m) = max(G_{i+1}(m), max over options (s, V, A) of drafter i with
s <= m of V + (1 - A) G_{i+1}(m - s))``; a shaped drafter's options are its best subtree of ``s`` nodes with exactly
``w`` root children, ``H_w(s) = max over s_1..s_w >= 1 of sum_r a_r c(s_r, d - 1)``, from Sequoia's ``c``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from core.sequoia import check_acceptance, solve


@dataclass(frozen=True)
class DrafterModel:
    """What the split knows about one drafter (see the module docstring)."""

    source: str                        # the drafter's name in the tree ("draft", "ngram", "memory", ...)
    acceptance: tuple[float, ...]
    shaped: bool = True

    def __post_init__(self) -> None:
        a = tuple(float(x) for x in self.acceptance)
        if self.shaped:
            check_acceptance(a)
        elif not a or any(not 0.0 <= x <= 1.0 for x in a):
            raise ValueError(f"{self.source}: a chain's acceptance per position must be non-empty, in [0, 1], got {a}")
        object.__setattr__(self, "acceptance", a)


@dataclass(frozen=True)
class Share:
    """One drafter's part of the merged tree."""

    source: str
    parents: tuple[int, ...]           # its subtree's shape (-1 = child of the root); () when it gets nothing
    value: float                       # V: expected accepted tokens of its subtree on its own
    root_acceptance: float             # A: the chance that one of its root children is accepted

    @property
    def nodes(self) -> int:
        return len(self.parents)


@dataclass(frozen=True)
class Split:
    shares: tuple[Share, ...]
    value: float                       # F: expected tokens per target call of the merged tree (root included)


def merged_value(shares: Sequence[Share]) -> float:
    """F = 1 + sum_i prod_{j<i} (1 - A_j) V_i, for shares in merge order."""
    total, reach = 1.0, 1.0
    for share in shares:
        total += reach * share.value
        reach *= 1.0 - share.root_acceptance
    return total


def chain_value(acceptance: Sequence[float], length: int) -> float:
    """Expected accepted tokens of a chain of ``length`` with per-position acceptance (zero past the vector)."""
    total, reach = 0.0, 1.0
    for t in range(length):
        reach *= acceptance[t] if t < len(acceptance) else 0.0
        total += reach
    return total


def breadth_first(parents: Sequence[int]) -> tuple[int, ...]:
    """The same tree renumbered level by level (children in their order), as the model drafter expects."""
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        children.setdefault(p, []).append(i)
    order, new_index, out = list(children.get(-1, [])), {-1: -1}, []
    for node in order:
        new_index[node] = len(out)
        out.append(new_index[parents[node]])
        order += children.get(node, [])
    return tuple(out)


def _options(model: DrafterModel, max_nodes: int, max_depth: int) -> list[Share]:
    """Every share worth considering for one drafter: the best subtree for each (nodes, root width)."""
    if not model.shaped:
        return [Share(model.source, tuple(range(-1, s - 1)), chain_value(model.acceptance, s), model.acceptance[0])
                for s in range(1, min(max_nodes, max_depth) + 1)]
    a = model.acceptance
    table = solve(a, max_nodes, max_depth - 1)
    below = [0.0] + [table.c(t, max_depth - 1) for t in range(1, max_nodes + 1)]
    # best[w][s]: s nodes under exactly w root children; pick[w][s]: nodes given to the w-th child
    best = [[0.0] + [float("-inf")] * max_nodes]
    pick: list[list[int]] = [[0] * (max_nodes + 1)]
    for w in range(1, min(len(a), max_nodes) + 1):
        row, arg = [float("-inf")] * (max_nodes + 1), [0] * (max_nodes + 1)
        for s in range(w, max_nodes + 1):
            for t in range(1, s - w + 2):
                v = best[w - 1][s - t] + a[w - 1] * below[t]
                if v > row[s] + 1e-15:
                    row[s], arg[s] = v, t
        best.append(row)
        pick.append(arg)
    out = []
    for w in range(1, len(best)):
        for s in range(w, max_nodes + 1):
            sizes, left = [], s
            for r in range(w, 0, -1):
                sizes.append(pick[r][left])
                left -= pick[r][left]
            parents: list[int] = []
            for size in reversed(sizes):
                parents.append(-1)
                root = len(parents) - 1
                parents += [root if p < 0 else root + 1 + p for p in table.parents(size, max_depth - 1)]
            out.append(Share(model.source, breadth_first(parents), best[w][s], sum(a[:w])))
    return out


def split_budget(models: Sequence[DrafterModel], budget: int, max_depth: int) -> Split:
    """The shares of ``budget`` tokens per target call (the committed root included) that maximise F."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"the budget counts the committed token too and must be an integer >= 1, got {budget!r}")
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1:
        raise ValueError(f"max_depth must be an integer >= 1, got {max_depth!r}")
    if not models:
        raise ValueError("split_budget needs at least one drafter")
    nodes = budget - 1
    nothing = [Share(m.source, (), 0.0, 0.0) for m in models]
    options = [_options(m, nodes, max_depth) if nodes else [] for m in models]
    after = [0.0] * (nodes + 1)                  # G_{i+1}(m) for m = 0..nodes
    choice: list[list[Share]] = []
    for i in range(len(models) - 1, -1, -1):
        here, chosen = list(after), [nothing[i]] * (nodes + 1)
        for option in options[i]:
            s = option.nodes
            for m in range(s, nodes + 1):
                v = option.value + (1.0 - option.root_acceptance) * after[m - s]
                if v > here[m] + 1e-15:
                    here[m], chosen[m] = v, option
        after = here
        choice.append(chosen)
    choice.reverse()
    shares, left = [], nodes
    for chosen in choice:
        shares.append(chosen[left])
        left -= chosen[left].nodes
    return Split(tuple(shares), merged_value(shares))
