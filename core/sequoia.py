"""Sequoia (Chen et al. 2024): the best token tree for a node budget, and the hardware-aware choice of its size.

Three parts (ALGORITHMS.md §5):

* :func:`estimate_acceptance` measures the acceptance vector ``a_i`` (the probability that the ``i``-th drafted child
  of a node is the one the target accepts) by decoding calibration prompts with a one-level tree of width ``W``
  through the real engine, so verification is rule 3 of :mod:`core.verify`, not a reimplementation.
* :func:`solve` runs the dynamic program ``c(n, d)`` (best expected accepted length of a tree of ``n`` tokens, the
  committed root included, and depth at most ``d``) in ``O(n^2 k d)`` and keeps the argmax choices, from which
  :meth:`SequoiaTable.parents` rebuilds the tree shape.
* :func:`profile_latencies` times the target's forward of ``n`` tokens and the draft's forward of a level on the
  current backends; :func:`best_plan` then picks the ``(n, d)`` with the largest predicted speedup
  ``c(n, d) / cost(n, d)`` in units of one plain decode.

Budget convention (Sequoia's): ``n`` counts the committed root, so a tree of budget ``n`` holds ``n - 1`` drafted
nodes and the target evaluates exactly ``n`` tokens per call. With Sequoia's published vector
(.4803, .1104, .0576, .0373, .0265, .0211), ``c(8, d >= 3) = 2.096`` and ``c(64, 6) = 2.761``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

from core.tree import TokenTree, depths_of

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


# -- measured acceptance ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AcceptanceEstimate:
    """The acceptance vector measured with one-level trees of ``width`` children over ``steps`` target calls."""

    vector: tuple[float, ...]
    width: int
    steps: int
    counts: tuple[int, ...]   # times the child of each rank was the accepted one
    texts: tuple[tuple[int, tuple[int, ...]], ...] = ()  # (prompt length, prompt + generated tokens) per prompt


def estimate_acceptance(target, draft, prompts: Sequence[Sequence[int]], sampling, width: int = 4,
                        tokens_per_prompt: int = 32) -> AcceptanceEstimate:
    """Decode each prompt with a one-level tree of ``width`` children and count which rank the target accepted.

    Children are the draft's top-ranked tokens at temperature 0 and samples without replacement otherwise, as in
    the trees Sequoia builds; the engine verifies them with rule 3, so ``a_i`` is exactly the quantity the DP needs.
    """
    from core.drafting import Tree
    from core.engine import SpeculativeEngine

    if not isinstance(width, int) or width < 1:
        raise ValueError(f"width must be a positive integer, got {width!r}")
    if not prompts:
        raise ValueError("estimate_acceptance needs at least one calibration prompt")
    engine = SpeculativeEngine(target, draft, Tree((-1,) * width, "without_replacement", name=f"Level({width})"),
                               sampling)
    counts = [0] * width
    steps = 0
    texts = []
    for prompt in prompts:
        for event in engine.stream(prompt, tokens_per_prompt):
            if not event.nodes:
                continue  # the last step of a generation drafts nothing
            steps += 1
            if event.accepted_path:
                counts[event.accepted_path[0]] += 1
        texts.append((len(prompt), tuple(prompt) + engine.last_result.tokens))
    if steps == 0:
        raise ValueError("the calibration prompts produced no drafted step: give longer generations")
    return AcceptanceEstimate(tuple(c / steps for c in counts), width, steps, tuple(counts), tuple(texts))


# -- measured latencies ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Latencies:
    """Seconds per call on one machine: target forward of ``n`` tokens, draft forward of ``w`` tokens.

    ``verify[n]`` and ``draft[w]`` are the fastest of a few repeats; other sizes are interpolated linearly between the
    measured ones and extrapolated from the last two. ``draft`` is empty when no draft model was profiled.
    """

    verify: dict[int, float]
    draft: dict[int, float] = field(default_factory=dict)

    @property
    def plain(self) -> float:
        """One plain decode step of the target: the unit of every speedup."""
        return self.verify_cost(1)

    def verify_cost(self, n: int) -> float:
        return _interpolate(self.verify, n)

    def draft_cost(self, width: int) -> float:
        if not self.draft:
            raise ValueError("no draft latencies were measured")
        return _interpolate(self.draft, width)

    def tree_cost(self, parents: Sequence[int]) -> float:
        """Predicted seconds of one speculative step with this tree shape drafted by a model, then verified.

        The model drafter makes one call for the root (the token left by the last step) and one per level except the
        deepest; the target evaluates the root and every drafted node at once.
        """
        depths = depths_of(parents) if parents else []
        widths = [depths.count(level) for level in range(1, max(depths, default=0))]
        draft = self.draft_cost(1) + sum(self.draft_cost(w) for w in widths) if parents else 0.0
        return self.verify_cost(len(parents) + 1) + draft

    def to_json(self) -> dict:
        return {"verify": {str(k): v for k, v in self.verify.items()},
                "draft": {str(k): v for k, v in self.draft.items()}}

    @classmethod
    def from_json(cls, data: dict) -> "Latencies":
        return cls({int(k): float(v) for k, v in data["verify"].items()},
                   {int(k): float(v) for k, v in data.get("draft", {}).items()})


def _interpolate(table: dict[int, float], x: int) -> float:
    if x in table:
        return table[x]
    keys = sorted(table)
    if len(keys) == 1:
        return table[keys[0]] * x / keys[0]
    lo = max((k for k in keys if k < x), default=None)
    hi = min((k for k in keys if k > x), default=None)
    if lo is None:
        lo, hi = keys[0], keys[1]
    elif hi is None:
        lo, hi = keys[-2], keys[-1]
    slope = (table[hi] - table[lo]) / (hi - lo)
    return max(table[lo] + slope * (x - lo), 1e-9)


def time_forward(backend, context: Sequence[int], size: int, repeats: int = 5) -> float:
    """Seconds of ``forward_tree`` on a chain of ``size`` tokens after ``context`` (the fastest of ``repeats`` calls:
    on a shared machine the slower ones measure the neighbours, not the model)."""
    backend.prefill(list(context))
    filler = [int(context[i % len(context)]) for i in range(size)]
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        backend.forward_tree(TokenTree.chain(filler))
        times.append(time.perf_counter() - t0)
        backend.commit([])
    return min(times[1:])  # the first call warms buffers up


def _monotone(times: dict[int, float]) -> dict[int, float]:
    # more tokens never cost less: a smaller time for a larger batch is timing noise, not a property to plan on
    out, floor = {}, 0.0
    for size in sorted(times):
        floor = max(floor, times[size])
        out[size] = floor
    return out


VERIFY_SIZES = (1, 2, 3, 4, 6, 8, 12, 16)
DRAFT_SIZES = (1, 2, 4, 8)


def profile_latencies(target, draft, context: Sequence[int], verify_sizes: Sequence[int] = VERIFY_SIZES,
                      draft_sizes: Sequence[int] = DRAFT_SIZES, repeats: int = 5) -> Latencies:
    """Time the target's forward of ``n`` tokens and the draft's of ``w`` tokens after ``context`` on this machine."""
    if len(context) < 2:
        raise ValueError("profiling needs a context of at least 2 tokens")
    verify = _monotone({n: time_forward(target, context, n, repeats) for n in verify_sizes})
    drafted = _monotone({w: time_forward(draft, context, w, repeats) for w in draft_sizes}) if draft is not None else {}
    target.reset()
    if draft is not None:
        draft.reset()
    return Latencies(verify, drafted)


# -- the hardware-aware choice ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class TreePlan:
    """A Sequoia tree chosen for this machine: its shape and the prediction behind it."""

    budget: int                 # tokens per target call, root included
    depth: int
    parents: tuple[int, ...]
    expected_tokens: float      # c(n, d): tokens emitted per target call
    step_seconds: float         # predicted seconds per step (draft + verify)
    speedup: float              # expected_tokens * plain / step_seconds


def best_plan(table: SequoiaTable, latencies: Latencies, budgets: Sequence[int] | None = None,
              depths: Sequence[int] | None = None) -> TreePlan:
    """The (n, d) with the largest predicted speedup c(n, d) * t_plain / cost(tree(n, d))."""
    budgets = budgets or range(2, table.max_nodes + 1)
    depths = depths or range(1, table.max_depth + 1)
    best: TreePlan | None = None
    for n in budgets:
        for d in depths:
            parents = table.parents(n, d)
            if not parents:
                continue
            cost = latencies.tree_cost(parents)
            value = tree_value(parents, table.acceptance)
            plan = TreePlan(len(parents) + 1, max(depths_of(parents)), parents, value, cost,
                            value * latencies.plain / cost)
            if best is None or plan.speedup > best.speedup + 1e-12:
                best = plan
    if best is None:
        raise ValueError("no tree fits the budgets and depths given")
    return best
