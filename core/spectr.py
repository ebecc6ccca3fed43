"""SpecTr's multi-draft verification: k-sequential selection, K-SEQ (Sun et al., "SpecTr: Fast Speculative Decoding
via Optimal Transport", NeurIPS 2023, arXiv 2310.15141, section 4: the draft-selection algorithm K-SEQ, whose
acceptance is within a factor 1 - 1/e of the optimal transport plan's). Pure functions: no model calls.

One node. The candidates ``X_1..X_m`` are independent draws, ``X_i ~ q_i`` (SpecTr's i.i.d. drafts: every
``q_i = q``). With one divisor ``rho >= 1``, test them in order: accept ``X_i`` with probability
``min(1, p(X_i) / (rho q_i(X_i)))``; if all are rejected, draw the token from a residual. Why the output is exactly p:

    P(candidate i is reached, accepted and equals x) = prod_{j<i} (1 - beta_j) * min(q_i(x), p(x) / rho),
    beta_j = sum_x min(q_j(x), p(x) / rho)   (candidate j's draw is independent of the earlier ones), so
    alpha(x) = sum_i prod_{j<i} (1 - beta_j) min(q_i(x), p(x) / rho)   is P(x is emitted by an acceptance),
    sum_x alpha(x) = 1 - prod_j (1 - beta_j), and the residual  p_res = (p - alpha) / prod_j (1 - beta_j)
    gives P(emit x) = alpha(x) + (p(x) - alpha(x)) = p(x),

provided ``alpha <= p`` (then ``p_res`` is a distribution: ``rho`` is *valid*). For i.i.d. drafts this is the
paper's residual ``p_res = (p - min(q, p/rho) (1 - (1 - beta)^k) / beta) / (1 - beta)^k``, and ``rho`` is valid iff
``1 - (1 - beta(rho))^k <= rho beta(rho)``. ``rho = m`` is always valid (``alpha <= sum_i p/m = p``); the acceptance
``1 - prod (1 - beta_j)`` falls as ``rho`` grows, so :func:`k_sequential` takes the smallest valid ``rho`` in
``[1, m]`` (bisection that keeps its upper end valid): for i.i.d. drafts the paper's ``rho*`` solving
``1 - (1 - beta)^k = rho beta``. One candidate gets ``rho = 1``: chain speculative sampling, ``min(1, p/q)`` and
``norm(max(p - q, 0))``.

A tree of drafts (SpecTr's k sequences). Verification walks *classes*: the nodes whose token path is the prefix
accepted so far (one token drawn by several sequences is one class). The candidates at a class are the children of
all its members, in node order. Given the accepted prefix they are independent draws, each from its parent's draft
distribution at that prefix: a child is drawn after its parent, with fresh randomness, and the decisions so far used
only the tokens of earlier levels and fresh coins. So K-SEQ applies level by level with however many candidates
survive (the sequences that agree with the accepted prefix), and the output is exactly the target's. Children drawn
*without replacement* are not independent: :func:`verify_spectr` refuses them. Deterministic children (``q``
one-hot) are independent of everything and allowed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection, Sequence

import numpy as np
import torch

from core.sampling import Rng
from core.tree import TokenTree
from core.verify import Verdict, acceptance_probability, residual_after_rejection

RULE3 = "specinfer"     # ALGORITHMS.md rule 3 (SpecInfer's multi-step speculative sampling for i.i.d. children)
KSEQ = "spectr"         # this module's K-SEQ
VERIFIERS = (RULE3, KSEQ)
BISECTION_TOL = 1e-13   # relative width of the search for the smallest valid rho (a saturated token's residual
                        # is then rounding-small, and any valid rho is exact)
SLACK = 1e-14           # alpha may exceed p by rounding this much and still count as valid (the residual clips it)


@dataclass(frozen=True)
class Selection:
    """K-SEQ's plan at one node, before any coin is tossed."""

    rho: float
    accept: tuple[float, ...]    # min(1, p(x_i) / (rho q_i(x_i))) for each candidate, in testing order
    residual: torch.Tensor       # the token's distribution when every candidate is rejected


def _distinct(qs: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], list[int]]:
    """The distinct distributions among the candidates' (siblings share one object) and each candidate's row.

    Rows are told apart by identity only: two equal rows kept apart cost time, never exactness."""
    rows: list[torch.Tensor] = []
    order: list[int] = []
    for q in qs:
        same = next((i for i, r in enumerate(rows) if r is q), None)
        if same is None:
            rows.append(q)
            same = len(rows) - 1
        order.append(same)
    return rows, order


def _emission(p: np.ndarray, rows: np.ndarray, order: Sequence[int], rho: float) -> tuple[np.ndarray, float]:
    """alpha (the chance each token is emitted by an acceptance) and the chance that every candidate is rejected.

    numpy rather than torch: the search for rho calls this some thirty times per node."""
    take = np.minimum(rows, p / rho)             # min(q_r(x), p(x) / rho) for each distinct row r
    beta = take.sum(axis=1)
    weight = np.zeros(len(rows))                 # sum over the candidates using row r of prod_{j<i} (1 - beta_j)
    reach = 1.0
    for r in order:
        weight[r] += reach
        reach *= 1.0 - float(beta[r])
    return weight @ take, reach


def k_sequential(p: torch.Tensor, draws: Sequence[tuple[int, torch.Tensor]]) -> Selection:
    """K-SEQ at one node: ``p`` the target's distribution, ``draws`` the candidates ``(token, q_i)`` in testing order
    (each ``q_i`` the normalised distribution the token was drawn from; candidates drawn from one distribution should
    share the tensor). See the module docstring for the proof."""
    p = p.detach().to("cpu", torch.float64)
    if not draws:
        return Selection(1.0, (), p)
    distinct, order = _distinct([q for _, q in draws])
    rows = np.stack([q.detach().to("cpu", torch.float64).numpy() for q in distinct])
    pn = p.numpy()
    support = (pn > 0) & (rows > 0).any(axis=0)    # elsewhere min(q_r, p / rho) = 0: no part in alpha or validity
    ps, qs = pn[support], rows[:, support]

    def valid(rho: float) -> bool:
        return bool((_emission(ps, qs, order, rho)[0] <= ps + SLACK).all())

    lo, hi = 1.0, float(len(draws))
    if valid(lo):
        hi = lo
    while hi - lo > BISECTION_TOL * hi:        # keeps hi valid: rho = m always is
        mid = (lo + hi) / 2
        if valid(mid):
            hi = mid
        else:
            lo = mid
    rho = hi
    accept = tuple(min(1.0, float(pn[x]) / (rho * float(rows[r, x]))) if rows[r, x] > 0 else 0.0
                   for (x, _), r in zip(draws, order))
    alpha = np.zeros_like(pn)
    alpha[support], rejected = _emission(ps, qs, order, rho)
    rest = np.clip(pn - alpha, 0.0, None)
    total = float(rest.sum())
    # when every candidate is rejected with probability ~0 the residual is never drawn; keep it a distribution
    residual = torch.from_numpy(rest / total) if rejected > 0.0 and total > 0.0 else p
    return Selection(rho, accept, residual)


def _candidates(tree: TokenTree, members: Sequence[int]) -> list[int]:
    """The children of a class's members, in node order (fixed by the tree's shape, not by the drawn tokens)."""
    return sorted(c for u in members for c in tree.children(u))


def _draws(tree: TokenTree, candidates: Sequence[int], vocab: int) -> list[tuple[int, torch.Tensor]]:
    """Each candidate with the distribution it was drawn from; siblings drawn from one distribution share it."""
    shared: dict[int, torch.Tensor] = {}
    draws = []
    for c in candidates:
        proposal, token = tree.proposals[c], tree.tokens[c]
        if proposal.exclude:
            raise ValueError("SpecTr's K-SEQ needs independently drawn children; node "
                             f"{c} was sampled without replacement (use sampling='iid' or the rule-3 verifier)")
        if proposal.dist is None:
            draws.append((token, proposal.distribution(token, vocab)))
        else:
            key = id(proposal.dist)
            if key not in shared:
                shared[key] = proposal.distribution(token, vocab)
            draws.append((token, shared[key]))
    return draws


def verify_spectr(
    tree: TokenTree,
    target_dist: Callable[[int], torch.Tensor],
    rng: Rng,
    eos_ids: Collection[int] = (),
    target_prob: Callable[[int, int], float] | None = None,
) -> Verdict:
    """Verify a tree of independent drafts with K-SEQ, class by class (module docstring); same contract as
    :func:`core.verify.verify_tree`. K-SEQ weighs every candidate against the whole distribution, so ``target_prob``
    (for a deterministic first child) has nothing to save here.

    The accepted path is the root-to-node path ending at the last accepted candidate: its nodes carry the accepted
    tokens. When the token accepted at some depth was drawn by several sequences, the verdict names the node on that
    path (its acceptance is reported there) rather than the duplicate whose coin came up.
    """
    members = [-1]
    chosen: list[int] = []
    accept_probs: dict[int, float] = {}
    target_p: dict[int, float] = {}
    while True:
        p = target_dist(members[0]).detach().to("cpu", torch.float64)
        candidates = _candidates(tree, members)
        selection = k_sequential(p, _draws(tree, candidates, p.shape[-1]))
        taken = None
        for c, a in zip(candidates, selection.accept):
            accept_probs[c] = a
            target_p[c] = float(p[tree.tokens[c]])
            if rng.accept(a):
                taken = c
                break
        if taken is None:
            bonus = bool(chosen) and not candidates
            extra = rng.sample(selection.residual)
            return _on_path(tree, chosen, extra, bonus, accept_probs, target_p)
        chosen.append(taken)
        token = tree.tokens[taken]
        members = [c for c in candidates if tree.tokens[c] == token]
        if token in eos_ids:
            return _on_path(tree, chosen, None, False, accept_probs, target_p)


def _on_path(tree: TokenTree, chosen: list[int], extra: int | None, bonus: bool, accept_probs: dict[int, float],
             target_p: dict[int, float]) -> Verdict:
    """The verdict with the accepted candidates moved onto one root-to-node path (same tokens, same contexts)."""
    path = tree.path_to(chosen[-1]) if chosen else []
    for node, taken in zip(path, chosen):
        if node != taken:
            accept_probs[node] = accept_probs.pop(taken)
            target_p[node] = target_p.pop(taken)
    return Verdict(tuple(path), extra, bonus, accept_probs, target_p)


# -- the two verifiers on the same drafts, without sampling noise --------------------------------------------------

def _rule3_tests(p: torch.Tensor, tree: TokenTree, children: Sequence[int]) -> list[float]:
    """Rule 3's acceptance chance of each child at a node, each given that the earlier ones were rejected."""
    residual, out = p, []
    for c in children:
        drawn_from = tree.proposals[c].distribution(tree.tokens[c], p.shape[-1])
        out.append(acceptance_probability(residual, drawn_from, tree.tokens[c]))
        residual = residual_after_rejection(residual, drawn_from)
    return out


def expected_accepted(tree: TokenTree, target_dist: Callable[[int], torch.Tensor], verifier: str,
                      eos_ids: Collection[int] = ()) -> float:
    """The exact expected number of drafted tokens ``verifier`` (RULE3 or KSEQ) accepts from this very tree.

    The tree's tokens are fixed; only the verifier's coins are random, so the expectation is a finite sum:
    ``E(u) = sum_i prod_{j<i} (1 - a_j) a_i (1 + E(next_i))``, over the candidates tested at ``u`` in order.
    ``target_dist(u)`` must give the target's distribution at every node that has children. Comparing the two
    verifiers this way on recorded drafts tells their acceptance apart with no sampling noise.
    """
    if verifier not in VERIFIERS:
        raise ValueError(f"unknown verifier {verifier!r}; choose one of {VERIFIERS}")

    def probs(u: int) -> torch.Tensor:
        return target_dist(u).detach().to("cpu", torch.float64)

    def value(members: list[int]) -> float:
        if verifier == RULE3:
            children = tree.children(members[0])
            tests, nexts = _rule3_tests(probs(members[0]), tree, children), [[c] for c in children]
        else:
            children = _candidates(tree, members)
            if not children:
                return 0.0
            p = probs(members[0])
            tests = k_sequential(p, _draws(tree, children, p.shape[-1])).accept
            nexts = [[d for d in children if tree.tokens[d] == tree.tokens[c]] for c in children]
        total, reach = 0.0, 1.0
        for c, a, nxt in zip(children, tests, nexts):
            below = 0.0 if tree.tokens[c] in eos_ids else value(nxt)
            total += reach * a * (1.0 + below)
            reach *= 1.0 - a
        return total

    return value([-1])
