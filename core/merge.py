"""SpecInfer's merge: the trees of several drafters as one token tree, verified in one target call.

Every node keeps the proposal it was drafted with, so rule 3 stays lossless provided each child's proposal is its
distribution given the siblings verified before it. Two rules guarantee that:

* trees are appended in the order given, so the siblings from one drafter stay in their drafting order and come after
  those of earlier drafters, whose draws they do not depend on;
* a node of a later tree whose token already sits among its merged siblings is folded into that sibling (its own
  children hang below it) only when it is deterministic (``q`` one-hot): its token is then fixed by the path alone,
  so whether it appears as a separate sibling tells nothing about any random draw. A sampled node is never folded:
  dropping it when it collided would bias the law of the tokens drawn after it.

Put sampling drafters (the draft model) first and deterministic ones (n-gram lookup) after them.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from core.backends.base import Backend
from core.drafting import DrafterBase, StaticStrategy
from core.sampling import Rng, SamplingParams
from core.tree import TokenTree
from core.verify import Verdict


def merge_trees(trees: Sequence[TokenTree]) -> tuple[TokenTree, list[list[int]]]:
    """The merged tree and, for each input tree, the merged index of each of its nodes."""
    merged = TokenTree()
    maps: list[list[int]] = []
    for tree in trees:
        own: list[int] = []
        for tok, par, prop, src in zip(tree.tokens, tree.parents, tree.proposals, tree.source):
            parent = own[par] if par >= 0 else -1
            twin = None
            if prop.dist is None:
                twin = next((c for c in merged.children(parent) if merged.tokens[c] == tok), None)
            own.append(twin if twin is not None else merged.add(tok, parent, prop, src))
        maps.append(own)
    return merged, maps


def verdict_for(verdict: Verdict, node_map: Sequence[int]) -> Verdict:
    """The verdict on a merged tree, told in the node indices of one input tree.

    Its accepted path is the longest prefix of the merged path that this tree also holds.
    """
    back = {m: j for j, m in enumerate(node_map) if m >= 0}
    accepted: list[int] = []
    for m in verdict.accepted:
        if m not in back:
            break
        accepted.append(back[m])
    full = len(accepted) == len(verdict.accepted)
    return replace(verdict, accepted=tuple(accepted), bonus=verdict.bonus and full,
                   accept_probs={back[m]: a for m, a in verdict.accept_probs.items() if m in back},
                   target_p={back[m]: p for m, p in verdict.target_p.items() if m in back})


class MergedDrafter(DrafterBase):
    """Runs several drafters on the same context and verifies their trees as one."""

    def __init__(self, drafters: Sequence) -> None:
        if not drafters:
            raise ValueError("a merged drafter needs at least one drafter")
        self.drafters = list(drafters)
        self._trees: list[TokenTree] = []
        self._maps: list[list[int]] = []

    def start(self, prompt: Sequence[int], cancel=None) -> None:
        for d in self.drafters:
            d.start(prompt, cancel)

    @property
    def note(self) -> str:
        return "; ".join(d.note for d in self.drafters if d.note)

    def draft(self, tokens: Sequence[int], max_depth: int, max_nodes: int) -> TokenTree:
        self._trees = [d.draft(tokens, max_depth, max_nodes) for d in self.drafters]
        merged, self._maps = merge_trees(self._trees)
        if len(merged) > max_nodes:
            # keep the earliest nodes; each drafter is told only about the nodes that survived
            kept = merged.truncated(max_nodes=max_nodes)
            self._maps = [[m if m < len(kept) else -1 for m in own] for own in self._maps]
            merged = kept
        return merged

    def feedback(self, tree: TokenTree, verdict: Verdict) -> None:
        for d, own_tree, own_map in zip(self.drafters, self._trees, self._maps):
            d.feedback(own_tree, verdict_for(verdict, own_map))


@dataclass(frozen=True)
class Merge(StaticStrategy):
    """One tree from several strategies' drafters, e.g. ``Merge((Tree.sequoia(16, 4), NGram(4)))``."""

    parts: tuple

    def __post_init__(self) -> None:
        object.__setattr__(self, "parts", tuple(self.parts))
        if not self.parts:
            raise ValueError("Merge needs at least one strategy")
        for part in self.parts:
            if not hasattr(part, "make_drafter"):
                raise ValueError(f"Merge: {part!r} is not a strategy (it has no make_drafter)")

    @property
    def label(self) -> str:
        return "Merge(" + " + ".join(p.label for p in self.parts) + ")"

    def make_drafter(self, draft: Backend | None, params: SamplingParams, rng: Rng) -> MergedDrafter:
        drafters = [p.make_drafter(draft, params, rng) for p in self.parts]
        return MergedDrafter([d for d in drafters if d is not None])
