"""A memory proposal: the tree of the likeliest continuations of the matched occurrences, best first.

The continuations (one row of tokens per occurrence) are sorted so that every tree node is a block of consecutive
rows sharing its path. Expansion is best-first: the candidate node with the highest estimated path probability is
added next, so the nodes come out in an order where every prefix is the best subtree of its size, parents first.
Every node is a deterministic function of the context and the memory, so it declares ``q`` one-hot
(``Proposal()``): rule 3 then accepts it with the target's residual probability, losslessly at every temperature.
"""
from __future__ import annotations

from dataclasses import dataclass
from heapq import heappop, heappush
from itertools import accumulate, count
from typing import Callable, Collection

import numpy as np

from core.memory.index import SEP
from core.memory.stats import EDITED, RECORDED, MemoryStats, calibrated, confidence, key
from core.tree import Proposal, TokenTree

SOURCE = "memory"


@dataclass(frozen=True)
class MemoryProposal:
    """What memory proposes after a context: the tree and the planner's estimates for each node (tree order)."""

    tree: TokenTree
    match: int                              # longest match of the context's suffix (0: nothing found)
    node_probs: tuple[float, ...] = ()      # P(node accepted | parent accepted), calibrated
    path_probs: tuple[float, ...] = ()      # products of node_probs along each node's path
    occurrences: int = 0                    # earlier occurrences the tree was built from
    node_matches: tuple[int, ...] = ()      # each node's statistics key: match + depth - 1 tokens of agreement behind
                                            # it, in this text or a remembered one (core.memory.stats.key)
    raw_probs: tuple[float, ...] = ()       # the uncalibrated estimates, which calibration compares with outcomes
    blocks: tuple[tuple[int, int], ...] = ()   # rows [a, b) of the sorted occurrences that back each node
    row_documents: tuple[int, ...] = ()     # per sorted occurrence: its remembered document's id, -1 for live text
    resumed: bool = False                   # guesses where a copy resumes after an edit (core.memory.resume)
    substituted: bool = False               # carries an edit seen earlier in the text (core.memory.substitutions)
    cut: bool = False                       # the best first node alone: no tree of these continuations could pay

    def expected_tokens(self, n: int | None = None) -> float:
        """Tokens one target call is expected to emit with the first ``n`` nodes (all when None): the accepted
        drafted tokens plus the target's own."""
        return 1.0 + sum(self.path_probs[:n])

    @property
    def edit_note(self) -> str:
        """What a note adds when the tree carries an earlier edit."""
        return ", applying an edit seen earlier" if self.substituted else ""

    def documents(self, node: int) -> set[int]:
        """Ids of the remembered documents whose continuation includes ``node``'s path."""
        a, b = self.blocks[node]
        return {d for d in self.row_documents[a:b] if d >= 0}


def best_first(rows: np.ndarray, weights: np.ndarray, row_documents: np.ndarray, match: int, stats: MemoryStats,
               max_nodes: int, max_depth: int, first_match: int | None = None,
               least_first: Callable[[int], float] | None = None, remembered: bool = False,
               edits: np.ndarray | None = None, recorded: np.ndarray | None = None,
               stops: Collection[int] = (), own: bool = False) -> MemoryProposal:
    """The best tree of at most ``max_nodes`` nodes and depth ``max_depth`` from continuations ``rows``.

    ``rows`` (occurrences x depth) holds the tokens after each occurrence, ``SEP`` where the text ended; ``weights`` how
    much each occurrence counts. A node's raw estimate is its share of the weight of the parent's occurrences that go
    on, times :func:`core.memory.stats.confidence` of ``n`` such occurrences; calibrated as in
    :meth:`MemoryStats.estimate` for ``match + depth - 1`` tokens of agreement (in a remembered text when
    ``remembered``, in the answer being written when ``own``), or for ``first_match`` at depth 1 when given (a resumed
    copy). ``edits`` (occurrences x depth, when given) marks where a row starts an edit the text has made once
    (core.memory.substitutions): a node that starts one in any of its rows is keyed ``EDITED``, a guess about an edit
    that no match length describes (a substitution made once, then drafted through 15 copied tokens at a long match's
    estimate, was an insertion the text did not repeat: ``):`` -> ``, encoding="utf-8"):``).
    ``recorded`` (occurrences x depth, when given) holds the probability each row's token was drawn with, where a
    remembered answer recorded it under the sampling settings at hand (0 elsewhere): a node any of whose rows
    recorded one is estimated at the weighted mean of those, keyed ``RECORDED``. After the same context that is the
    probability that a deterministic draft of the token is accepted, so a regeneration sampled anew sees where the
    earlier sample forked (a 63-node call drafted across such a fork was lost at its first node); the node's other
    rows, after other contexts, add nothing to it (an answer that repeats its own lines backs its nodes with them).
    A node whose token is one of ``stops`` has no children: the generation ends there, and a text copied from the
    prompt goes on past its end of turn into the next turn's header (a rename's copy drafted 15 such nodes, 31 in all,
    on a call that could emit 16).
    ``least_first(m)``: the least estimate a first node of ``m`` tokens of agreement needs for any tree to be worth
    drafting; below it the tree is the best first node alone (what a planner still learns from).
    A few dozen rows at most: plain Python lists beat numpy's per-call overhead at this size.
    """
    depth_cap = min(rows.shape[1], max_depth)
    if not len(rows) or max_nodes <= 0 or depth_cap <= 0:
        return MemoryProposal(TokenTree(), match, occurrences=len(rows))
    table = rows[:, :depth_cap].tolist()
    order = sorted(range(len(table)), key=table.__getitem__)   # a node's occurrences become consecutive rows
    table = [table[i] for i in order]
    edited = [edits[i, :depth_cap].tolist() for i in order] if edits is not None else None
    drawn = [recorded[i, :depth_cap].tolist() for i in order] if recorded is not None else None
    weight = weights.tolist()
    cumulative = list(accumulate((weight[i] for i in order), initial=0.0))
    heap: list[tuple] = []
    ties = count()
    scales: dict[int, float] = {}     # statistics key -> the calibration of its nodes

    def node_match(depth: int) -> int:
        return first_match if depth == 1 and first_match is not None else key(match + depth - 1, remembered, own)

    def group_match(a: int, b: int, depth: int) -> int:
        """The statistics key of the node backed by sorted rows [a, b) at ``depth``."""
        if edited is not None and not (depth == 1 and first_match is not None) and \
                any(edited[i][depth - 1] for i in range(a, b)):
            return EDITED
        return node_match(depth)

    def push_children(parent: int, lo: int, hi: int, depth: int, path_prob: float) -> None:
        col = depth - 1
        first = lo
        while first < hi and table[first][col] == SEP:   # rows whose text ended sort first
            first += 1
        if first == hi:
            return
        total = cumulative[hi] - cumulative[first]
        a = first
        while a < hi:
            token, b = table[a][col], a + 1
            while b < hi and table[b][col] == token:
                b += 1
            stats_key = group_match(a, b, depth)
            raw = (cumulative[b] - cumulative[a]) / total * confidence(hi - first, stats_key)
            if drawn is not None and stats_key != EDITED:
                fit = [i for i in range(a, b) if drawn[i][col] > 0]
                if fit:
                    raw = sum(weight[order[i]] * drawn[i][col] for i in fit) / sum(weight[order[i]] for i in fit)
                    stats_key = RECORDED
            if stats_key not in scales:
                scales[stats_key] = stats.scale(stats_key)
            p = calibrated(scales[stats_key], raw, stats_key)
            heappush(heap, (-path_prob * p, next(ties), parent, a, b, depth, token, p, raw, stats_key))
            a = b

    tree = TokenTree()
    node_probs: list[float] = []
    path_probs: list[float] = []
    matches: list[int] = []
    raws: list[float] = []
    blocks: list[tuple[int, int]] = []
    push_children(-1, 0, len(table), 1, 1.0)
    cut = bool(heap) and least_first is not None and heap[0][7] < least_first(heap[0][9])
    if cut:
        max_nodes = 1
    while heap and len(tree) < max_nodes:
        neg_path, _, parent, a, b, depth, token, p, raw, stats_key = heappop(heap)
        node = tree.add(token, parent, Proposal(), SOURCE)
        node_probs.append(p)
        path_probs.append(-neg_path)
        matches.append(stats_key)
        raws.append(raw)
        blocks.append((a, b))
        if depth < depth_cap and token not in stops:
            push_children(node, a, b, depth + 1, -neg_path)
    return MemoryProposal(tree, match, tuple(node_probs), tuple(path_probs), len(rows), tuple(matches),
                          tuple(raws), tuple(blocks), tuple(np.asarray(row_documents)[order].tolist()), cut=cut)
