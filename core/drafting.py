"""Drafters: who proposes the token tree each step, and the strategies that configure them.

A drafter returns a :class:`TokenTree` whose every node carries the distribution its token was really drawn from
(:class:`Proposal`); the verifier is lossless only because of that contract. Model drafters grow the tree level by
level with the draft backend's ``forward_tree``, one draft call per level.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Collection, Protocol, Sequence

import torch

from core.backends.base import Backend
from core.events import PlanEvent
from core.sampling import Rng, SamplingParams, greedy_token, logits_to_probs
from core.spectr import KSEQ, RULE3, VERIFIERS, verify_spectr
from core.tree import Proposal, TokenTree, depths_of, shape_from_parents
from core.verify import Verdict, verify_tree

# how sampled trees are verified: (tree, target_dist, rng, eos_ids, target_prob) -> Verdict, ``target_prob(u, x)``
# being ``target_dist(u)[x]`` without the whole distribution (core.verify.verify_tree); greedy decoding always takes
# the engine's argmax fast path, which every verifier reduces to when the target is one-hot
Verifier = Callable[[TokenTree, Callable[[int], torch.Tensor], Rng, Collection[int],
                     Callable[[int, int], float] | None], Verdict]

SAMPLING_MODES = ("without_replacement", "iid", "top_k")
CATCH_UP = 32   # uncached tokens a draft model evaluates in front of its tree; more go through prefill


class Drafter(Protocol):
    """Proposes a tree of continuations of ``tokens`` and learns what the target kept."""

    note: str                           # a sentence for the views: what this drafter did on its last step, and why
    shape: tuple[int, ...] | None       # the planned tree shape of its last draft, when it follows one
    verify: Verifier                    # the rule its trees are verified with: rule 3 unless its drafts need another

    def start(self, prompt: Sequence[int], cancel: threading.Event | None = None, stops: Collection[int] = ()) -> None:
        """Prepare for a new generation whose context is ``prompt`` (a draft model prefills it, cancellably) and
        which ends at any of the tokens ``stops``: a node below one can never be emitted, and a drafter that can leave
        it out saves the target evaluating it."""

    def draft(self, tokens: Sequence[int], max_depth: int, max_nodes: int) -> TokenTree:
        """A tree continuing ``tokens`` with at most ``max_nodes`` nodes and depth ``max_depth`` (may be empty)."""

    def feedback(self, tree: TokenTree, verdict: Verdict) -> None:
        """Told which nodes the target accepted, after every verification."""

    def take_plan(self) -> PlanEvent | None:
        """A plan made or re-made since the last call (Auto), for the views; None otherwise."""

    def finish(self, prompt: Sequence[int], answer: Sequence[int], probs: Sequence[float]) -> None:
        """The generation ended with ``answer`` after ``prompt``, each token drawn with probability ``probs`` from
        the sampling distribution (a drafter with a memory remembers them)."""


class DrafterBase:
    """Defaults of the Drafter protocol for drafters without notes, shapes or plans."""

    note = ""
    shape: tuple[int, ...] | None = None
    verify = staticmethod(verify_tree)

    def start(self, prompt: Sequence[int], cancel: threading.Event | None = None, stops: Collection[int] = ()) -> None:
        """Nothing to prepare."""

    def feedback(self, tree: TokenTree, verdict: Verdict) -> None:
        """Nothing to learn."""

    def take_plan(self) -> PlanEvent | None:
        return None

    def finish(self, prompt: Sequence[int], answer: Sequence[int], probs: Sequence[float]) -> None:
        """Nothing to remember."""


class Strategy(Protocol):
    """What the engine is configured with: a label, a binding to the models (planning strategies measure them then),
    and a factory of one drafter per generation (None: plain decoding)."""

    label: str

    def bind(self, target: Backend, draft: Backend | None, sampling: SamplingParams) -> None:
        """Called once per generation before ``make_drafter``."""

    def make_drafter(self, draft: Backend | None, params: SamplingParams, rng: Rng) -> Drafter | None:
        """A fresh drafter for one generation."""


class StaticStrategy:
    """The Strategy protocol's ``bind`` for strategies that need no measurement."""

    def bind(self, target: Backend, draft: Backend | None, sampling: SamplingParams) -> None:
        """Nothing to measure."""


def sample_children(
    probs: torch.Tensor | None, logits: torch.Tensor, count: int, mode: str, params: SamplingParams, rng: Rng
) -> list[tuple[int, Proposal]]:
    """Draw up to ``count`` distinct-or-not children from one parent's draft distribution, with their proposals.

    Greedy decoding and ``top_k`` take the highest-ranked tokens and declare q one-hot. ``iid`` draws independently
    from ``probs``; ``without_replacement`` draws successively with earlier draws removed (never more children than
    the support holds, so the distribution of every draw is well defined).
    """
    if params.greedy and count == 1:
        return [(greedy_token(logits), Proposal())]
    if params.greedy or mode == "top_k":
        ranked = logits if params.greedy else probs
        support = ranked.shape[-1] if params.greedy else int((probs > 0).sum())
        top = torch.topk(ranked.double(), min(count, support)).indices.tolist()
        return [(int(t), Proposal()) for t in top]
    if mode == "iid":
        return [(rng.sample(probs), Proposal(probs)) for _ in range(count)]
    if mode != "without_replacement":
        raise ValueError(f"unknown sampling mode {mode!r}; choose one of {SAMPLING_MODES}")
    out: list[tuple[int, Proposal]] = []
    remaining = probs.detach().to("cpu", torch.float64).clone()
    for _ in range(min(count, int((probs > 0).sum()))):
        drawn = tuple(t for t, _ in out)
        tok = rng.sample(remaining)
        out.append((tok, Proposal(probs, drawn)))
        remaining[tok] = 0.0
    return out


class ModelDrafter(DrafterBase):
    """Drafts a static tree shape with a draft model, one ``forward_tree`` call per level.

    The draft backend's cache follows the accepted tokens: after each step the drafted nodes it evaluated on the
    accepted path are committed, and tokens it has not seen (the target's extra token, an unevaluated leaf) are fed
    at the top of the next step's tree.
    """

    def __init__(self, backend: Backend, parents: Sequence[int], mode: str, params: SamplingParams, rng: Rng,
                 label: str = "draft") -> None:
        if mode not in SAMPLING_MODES:
            raise ValueError(f"unknown sampling mode {mode!r}; choose one of {SAMPLING_MODES}")
        self.backend = backend
        self.parents = shape_from_parents(parents)
        self.depths = depths_of(self.parents)
        self.mode = mode
        self.params = params
        self.rng = rng
        self.label = label
        self.shape = tuple(self.parents)
        self._pending = 0
        self._evaluated = 0

    def start(self, prompt: Sequence[int], cancel: threading.Event | None = None, stops: Collection[int] = ()) -> None:
        if len(prompt) > 1:
            self.backend.prefill(list(prompt[:-1]), cancel=cancel)
        else:
            self.backend.reset()

    def _room(self, tokens: Sequence[int]) -> int:
        return self.backend.context_length - len(tokens)

    def draft(self, tokens: Sequence[int], max_depth: int, max_nodes: int) -> TokenTree:
        committed = len(self.backend.committed)
        if len(tokens) - committed > CATCH_UP:
            # steps drafted by someone else (Auto's memory) left this model behind: catch up in prefill chunks
            self.backend.prefill(list(tokens[:-1]))
            committed = len(self.backend.committed)
        pending = list(tokens[committed:])
        max_nodes = min(max_nodes, self._room(tokens))
        tree = TokenTree()
        self._pending, self._evaluated = len(pending), 0
        if max_depth <= 0 or max_nodes <= 0 or not pending:
            return tree
        # shape node -> drafted node; shape nodes dropped by a budget simply have no drafted twin
        drafted: dict[int, int] = {}
        work = TokenTree.chain(pending)
        logits = self.backend.forward_tree(work)
        self._evaluated = len(work)
        # drafted node (-1 = root) -> (logits rows, row index): rows are fetched only for nodes that get children
        row_of = {-1: (logits, len(work) - 1)}
        for depth in range(1, max_depth + 1):
            level = [i for i, d in enumerate(self.depths) if d == depth
                     and (self.parents[i] < 0 or self.parents[i] in drafted)]
            if not level or len(tree) >= max_nodes:
                break
            for parent in dict.fromkeys(self.parents[i] for i in level):
                slots = [i for i in level if self.parents[i] == parent]
                slots = slots[: max_nodes - len(tree)]
                if not slots:
                    break
                at = drafted.get(parent, -1)
                rows, k = row_of[at]
                row = rows[k]
                probs = None if self.params.greedy else logits_to_probs(row, self.params)
                for slot, (tok, proposal) in zip(slots, sample_children(probs, row, len(slots), self.mode,
                                                                          self.params, self.rng)):
                    drafted[slot] = tree.add(tok, at, proposal, self.label)
            has_children = any(self.depths[i] == depth + 1 and self.parents[i] in drafted for i in range(len(self.parents)))
            if depth == max_depth or not has_children or len(tree) >= max_nodes:
                break
            work = tree.attached_below(pending)
            new_logits = self.backend.forward_tree(work, start=self._evaluated)
            for k in range(len(new_logits)):
                row_of[self._evaluated + k - len(pending)] = (new_logits, k)
            self._evaluated = len(work)
        return tree

    def feedback(self, tree: TokenTree, verdict: Verdict) -> None:
        if self._evaluated == 0:
            return
        path = list(range(self._pending))
        path += [self._pending + j for j in verdict.accepted if self._pending + j < self._evaluated]
        self.backend.commit(path)
        self._evaluated = 0


@dataclass(frozen=True)
class Baseline(StaticStrategy):
    """The target alone, one token per call."""

    @property
    def label(self) -> str:
        return "Baseline"

    def make_drafter(self, draft: Backend | None, params: SamplingParams, rng: Rng) -> Drafter | None:
        return None


def _model_drafter(draft: Backend | None, parents: Sequence[int], mode: str, params: SamplingParams, rng: Rng,
                   label: str) -> ModelDrafter:
    if draft is None:
        raise ValueError(f"strategy {label} needs a draft model")
    return ModelDrafter(draft, parents, mode, params, rng, label)


@dataclass(frozen=True)
class Chain(StaticStrategy):
    """Speculative sampling with a chain of ``k`` drafted tokens (Leviathan et al.; Chen et al.)."""

    k: int = 4

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or not 1 <= self.k <= 64:
            raise ValueError(f"Chain(k): k must be an integer in 1..64, got {self.k!r}")

    @property
    def label(self) -> str:
        return f"Chain({self.k})"

    @property
    def parents(self) -> tuple[int, ...]:
        return tuple(range(-1, self.k - 1))

    def make_drafter(self, draft: Backend | None, params: SamplingParams, rng: Rng) -> Drafter:
        return _model_drafter(draft, self.parents, "without_replacement", params, rng, "draft")


@dataclass(frozen=True)
class MultiDraft(StaticStrategy):
    """SpecTr's drafts: ``k`` independent draft sequences of ``length`` tokens from the root, verified as one tree.

    ``verifier``: ``"specinfer"`` (rule 3: each sequence is a branch, tested in order with the residual carried from
    one rejected sibling to the next) or ``"spectr"`` (SpecTr's k-sequential selection, core.spectr: at each level
    every sequence that agrees with the accepted prefix is a candidate). Same drafts, two lossless rules.
    At temperature 0 the sequences start from the draft's top-``k`` tokens (independent greedy drafts would coincide).
    """

    k: int = 2
    length: int = 3
    verifier: str = RULE3

    def __post_init__(self) -> None:
        for name, v in (("k", self.k), ("length", self.length)):
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 32:
                raise ValueError(f"MultiDraft: {name} must be an integer in 1..32, got {v!r}")
        if self.verifier not in VERIFIERS:
            raise ValueError(f"MultiDraft: verifier must be one of {VERIFIERS}, got {self.verifier!r}")

    @property
    def label(self) -> str:
        return f"MultiDraft({self.k}x{self.length}{', SpecTr' if self.verifier == KSEQ else ''})"

    @property
    def parents(self) -> tuple[int, ...]:
        # breadth-first: the k roots first, then each sequence's next token, so levels are contiguous
        parents = [-1] * self.k
        for level in range(1, self.length):
            parents += [(level - 1) * self.k + s for s in range(self.k)]
        return tuple(parents)

    def make_drafter(self, draft: Backend | None, params: SamplingParams, rng: Rng) -> Drafter:
        drafter = _model_drafter(draft, self.parents, "iid", params, rng, "draft")
        if self.verifier == KSEQ:
            drafter.verify = verify_spectr   # the same drafts, verified by K-SEQ
        return drafter


@dataclass(frozen=True)
class Tree(StaticStrategy):
    """Any static tree shape, given by parent indices (-1 = child of the committed token), drafted by the draft model.

    ``sampling``: ``without_replacement`` (Sequoia), ``iid`` (SpecInfer), ``top_k`` (deterministic, q one-hot).
    """

    parents: tuple[int, ...]
    sampling: str = "without_replacement"
    name: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "parents", tuple(shape_from_parents(self.parents)))
        if self.sampling not in SAMPLING_MODES:
            raise ValueError(f"Tree: unknown sampling {self.sampling!r}; choose one of {SAMPLING_MODES}")

    @property
    def label(self) -> str:
        return self.name or f"Tree({len(self.parents)} nodes, depth {max(depths_of(self.parents))})"

    def make_drafter(self, draft: Backend | None, params: SamplingParams, rng: Rng) -> Drafter:
        return _model_drafter(draft, self.parents, self.sampling, params, rng, "draft")

    @staticmethod
    def sequoia(budget: int = 32, max_depth: int = 8, acceptance: Sequence[float] | None = None) -> "Tree":
        """Sequoia's best tree for ``budget`` tokens per target call (the committed root included) and depth at most
        ``max_depth``, under ``acceptance`` (default: Sequoia's published vector); see core.sequoia.

        Children are sampled without replacement, which is the draft's top-ranked tokens at temperature 0.
        """
        from core.sequoia import sequoia_parents  # the DP is only needed when such a tree is asked for

        return Tree(sequoia_parents(budget, max_depth, acceptance), "without_replacement",
                    name=f"Sequoia({budget}, depth {max_depth})")
