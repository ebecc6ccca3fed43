"""Sequoia (Chen et al. 2024): the best token tree for a node budget, and the hardware-aware choice of its size.

Pure functions of an acceptance vector ``a_i`` (the probability that the ``i``-th drafted child of a node is the one
the target accepts; ALGORITHMS.md §5): :func:`solve` runs the dynamic program ``c(n, d)`` (best expected accepted
length of a tree of ``n`` tokens, the committed root included, and depth at most ``d``) in ``O(n^2 k d)`` and keeps
the argmax choices, from which :meth:`SequoiaTable.parents` rebuilds the tree shape; :func:`tree_value` scores any
shape. Measuring ``a_i`` and the machine's latencies is core.auto.calibrate's job; choosing the size for a machine
is core.auto.plan's.

Budget convention (Sequoia's): ``n`` counts the committed root, so a tree of budget ``n`` holds ``n - 1`` drafted
nodes and the target evaluates exactly ``n`` tokens per call. With Sequoia's published vector
(.4803, .1104, .0576, .0373, .0265, .0211), ``c(8, d >= 3) = 2.096`` and ``c(64, 6) = 2.761``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


# Sequoia's published acceptance vector (Llama-2 pair): the default when nothing has been measured yet.
PAPER_ACCEPTANCE = (0.4803, 0.1104, 0.0576, 0.0373, 0.0265, 0.0211)


def check_acceptance(acceptance: Sequence[float]) -> tuple[float, ...]:
    """Validate an acceptance vector: non-empty, each entry in [0, 1], total at most 1."""
    a = tuple(float(x) for x in acceptance)
    if not a:
        raise ValueError("the acceptance vector is empty: give at least one a_i")
    if any(not 0.0 <= x <= 1.0 for x in a):
        raise ValueError(f"acceptance entries must lie in [0, 1], got {a}")
    if sum(a) > 1.0 + 1e-9:
        raise ValueError(f"acceptance entries are probabilities of disjoint events and sum to {sum(a):.4f} > 1")
    return a


@dataclass(frozen=True)
class SequoiaTable:
    """The solved dynamic program: ``value[d][n]`` = c(n, d) for 1 <= n <= max_nodes, 0 <= d <= max_depth."""

    acceptance: tuple[float, ...]
    max_nodes: int
    max_depth: int
    value: tuple[tuple[float, ...], ...]           # [d][n]; index n = 0 unused
    split: tuple[tuple[tuple[int, ...], ...], ...]  # [d][i][m]: nodes given to child rank i+1 out of m left (0: stop)

    def c(self, n: int, d: int) -> float:
        """Best expected number of accepted tokens plus one, for ``n`` tokens (root included) and depth <= ``d``."""
        if not 1 <= n <= self.max_nodes or not 0 <= d <= self.max_depth:
            raise ValueError(f"c({n}, {d}) is outside the solved table (n 1..{self.max_nodes}, d 0..{self.max_depth})")
        return self.value[d][n]

    def parents(self, n: int, d: int) -> tuple[int, ...]:
        """Parent indices (-1 = root) of the optimal tree of budget ``n`` and depth <= ``d``, breadth first.

        Breadth-first order keeps every level contiguous and every node's children in rank order, which is what
        the level-by-level model drafter and the verifier expect.
        """
        self.c(n, d)
        parents: list[int] = []
        # queue of (node index or -1, nodes available for its subtree below it, depth limit left below it)
        queue = [(-1, n - 1, d)]
        while queue:
            node, budget, depth = queue.pop(0)
            if depth <= 0:
                continue
            rank = 0
            while budget > 0 and rank < len(self.acceptance):
                size = self.split[depth][rank][budget]
                if size == 0:
                    break
                parents.append(node)
                queue.append((len(parents) - 1, size - 1, depth - 1))
                budget -= size
                rank += 1
        return tuple(parents)


def solve(acceptance: Sequence[float], max_nodes: int, max_depth: int) -> SequoiaTable:
    """Solve c(n, d) for every n <= max_nodes and d <= max_depth.

    ``c(1, d) = 1``; ``c(n, d) = 1 + g_d(1, n - 1)`` with ``g_d(i, m)``, the best value of ``m`` nodes hung under
    children of rank ``i..k``: either stop, or give ``s`` nodes to the rank-``i`` child (value ``a_i c(s, d-1)``) and
    the rest to ranks ``i+1..``. A node budget may be left unused when more nodes cannot add value.
    """
    a = check_acceptance(acceptance)
    if not isinstance(max_nodes, int) or max_nodes < 1:
        raise ValueError(f"max_nodes must be a positive integer, got {max_nodes!r}")
    if not isinstance(max_depth, int) or max_depth < 0:
        raise ValueError(f"max_depth must be a non-negative integer, got {max_depth!r}")
    k = len(a)
    values: list[tuple[float, ...]] = [tuple([0.0] + [1.0] * max_nodes)]
    splits: list[tuple[tuple[int, ...], ...]] = [tuple(tuple([0] * max_nodes) for _ in range(k))]
    for d in range(1, max_depth + 1):
        below = values[d - 1]
        g_next = [0.0] * max_nodes   # g(i + 1, m) for m = 0..max_nodes-1
        split_d: list[tuple[int, ...]] = []
        for i in range(k - 1, -1, -1):
            g = [0.0] * max_nodes
            choice = [0] * max_nodes
            for m in range(1, max_nodes):
                best, arg = 0.0, 0
                for s in range(1, m + 1):
                    v = a[i] * below[s] + g_next[m - s]
                    if v > best + 1e-15:
                        best, arg = v, s
                g[m], choice[m] = best, arg
            g_next = g
            split_d.append(tuple(choice))
        split_d.reverse()
        values.append(tuple([0.0] + [1.0 + g_next[n - 1] for n in range(1, max_nodes + 1)]))
        splits.append(tuple(split_d))
    return SequoiaTable(a, max_nodes, max_depth, tuple(values), tuple(splits))


def sequoia_parents(budget: int, max_depth: int, acceptance: Sequence[float] | None = None) -> tuple[int, ...]:
    """The shape behind ``Tree.sequoia``: the best tree of ``budget`` tokens (root included), depth <= max_depth."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 2:
        raise ValueError(f"a Sequoia budget counts the committed token too and must be an integer >= 2, got {budget!r}")
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1:
        raise ValueError(f"max_depth must be an integer >= 1, got {max_depth!r}")
    table = solve(PAPER_ACCEPTANCE if acceptance is None else acceptance, budget, max_depth)
    parents = table.parents(budget, max_depth)
    if not parents:
        raise ValueError(f"the acceptance vector {tuple(acceptance or ())} gives no drafted node any value")
    return parents


def tree_value(parents: Sequence[int], acceptance: Sequence[float]) -> float:
    """F(T): the root's 1 plus, for each node, the product of a_rank along its path (rank = order among siblings)."""
    a = check_acceptance(acceptance)
    weight: list[float] = []
    seen: dict[int, int] = {}
    for p in parents:
        rank = seen.get(p, 0)
        seen[p] = rank + 1
        edge = a[rank] if rank < len(a) else 0.0
        weight.append(edge * (1.0 if p < 0 else weight[p]))
    return 1.0 + sum(weight)
