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

:class:`Merge` takes the parts' drafters as they are; :class:`MergedTree` sizes each part's share of a node budget
from its acceptance (core.tree_budget: Sequoia's DP for a model drafter, a chain value for a lookup). Every node
carries its drafter's name in ``TokenTree.source``, which the tree view colours.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Collection, Sequence

from core.backends.base import Backend
from core.drafting import DrafterBase, ModelDrafter, StaticStrategy
from core.memory import MemoryDrafter
from core.ngram import NGramDrafter
from core.sampling import Rng, SamplingParams
from core.sequoia import PAPER_ACCEPTANCE
from core.tree import TokenTree
from core.tree_budget import DrafterModel, Share, Split, split_budget
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

    def start(self, prompt: Sequence[int], cancel=None, stops: Collection[int] = ()) -> None:
        for d in self.drafters:
            d.start(prompt, cancel, stops)

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

    def bind(self, target: Backend, draft: Backend | None, sampling: SamplingParams) -> None:
        """Each part measures or binds itself (Auto, SelfDraft)."""
        for part in self.parts:
            part.bind(target, draft, sampling)

    def make_drafter(self, draft: Backend | None, params: SamplingParams, rng: Rng) -> MergedDrafter:
        drafters = [p.make_drafter(draft, params, rng) for p in self.parts]
        return MergedDrafter([d for d in drafters if d is not None])


# The drafters a MergedTree can hold: whether each drafts any shape (a model) or the chain it finds (a lookup).
SHAPED = {"draft": True, "ngram": False, "memory": False}
MAX_BUDGET = 64


@dataclass(frozen=True)
class Part:
    """One drafter of a MergedTree: its kind (a key of SHAPED) and its measured acceptance, Sequoia's ``a_r`` for
    the draft model, the acceptance at each position of the chain for a lookup (core.tree_budget). A lookup's
    acceptance counts the steps where it found nothing to propose as rejections, so that it is P(drafted and kept).
    Measured alone, a part's vector ignores how the parts before it change its chances (see core.tree_budget)."""

    kind: str
    acceptance: tuple[float, ...] = PAPER_ACCEPTANCE

    def __post_init__(self) -> None:
        if self.kind not in SHAPED:
            raise ValueError(f"MergedTree: unknown part {self.kind!r}; choose from {sorted(SHAPED)}")
        object.__setattr__(self, "acceptance", tuple(float(a) for a in self.acceptance))
        self.model()  # checks the acceptance vector

    def model(self) -> DrafterModel:
        return DrafterModel(self.kind, self.acceptance, SHAPED[self.kind])


def _part_drafter(share: Share, max_depth: int, draft: Backend | None, params: SamplingParams, rng: Rng):
    """The drafter that fills one share: the draft model with the share's shape, or a lookup of its size."""
    if share.source == "draft":
        if draft is None:
            raise ValueError("MergedTree: a 'draft' part needs a draft model")
        return ModelDrafter(draft, share.parents, "without_replacement", params, rng, "draft")
    if share.source == "ngram":
        return NGramDrafter(k=share.nodes)
    return MemoryDrafter(budget=share.nodes, max_depth=min(max_depth, share.nodes))


@dataclass(frozen=True)
class MergedTree(StaticStrategy):
    """Several drafters in one tree of ``budget`` tokens per target call (the committed one included) and depth at
    most ``max_depth``, each part given the share that maximises the expected tokens per call, e.g.
    ``MergedTree((Part("draft", measured_a), Part("ngram", (0.6, 0.5, 0.5))), budget=16)``."""

    parts: tuple[Part, ...]
    budget: int = 16
    max_depth: int = 6

    def __post_init__(self) -> None:
        object.__setattr__(self, "parts", tuple(self.parts))
        if not self.parts or not all(isinstance(p, Part) for p in self.parts):
            raise ValueError("MergedTree needs one or more Part(kind, acceptance)")
        if isinstance(self.budget, bool) or not isinstance(self.budget, int) or not 2 <= self.budget <= MAX_BUDGET:
            raise ValueError(f"MergedTree: budget must be an integer in 2..{MAX_BUDGET}, got {self.budget!r}")
        self.split  # checks max_depth

    @property
    def split(self) -> Split:
        return split_budget([p.model() for p in self.parts], self.budget, self.max_depth)

    @property
    def label(self) -> str:
        shares = " + ".join(f"{s.source} {s.nodes}" for s in self.split.shares if s.nodes)
        return f"MergedTree({self.budget}: {shares or 'nothing'})"

    def make_drafter(self, draft: Backend | None, params: SamplingParams, rng: Rng) -> MergedDrafter | None:
        drafters = [_part_drafter(s, self.max_depth, draft, params, rng) for s in self.split.shares if s.nodes]
        return MergedDrafter(drafters) if drafters else None   # no part is worth a node: plain decoding
