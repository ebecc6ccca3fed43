"""Drafting from memory: the continuations of the longest earlier match, in this text or in remembered documents,
proposed as a token tree of the likeliest ones (SuffixDecoding's idea, with calibrated estimates for a planner).

Each step the drafter finds the longest suffix of the context that occurred before, in the context itself (live)
or in the :class:`SuffixMemory` attached, and builds the tree from what followed every occurrence of that length.
Recent occurrences weigh more: the live text first, then the documents used most recently. Where a copy just broke
off (an edit of the live text, or a regenerated answer leaving the remembered one), the tree holds guesses of where it
resumes instead (core.memory.resume), unless they cannot pay and a short suffix match can; once it has resumed, the
edit is applied wherever a copy meets the same source tokens again (core.memory.substitutions), and the copy is
followed through the edits it made where that agrees longer than any suffix match.
At the end of a generation the answer is remembered behind the prompt's last tokens, so that the same prompt drafts
it next time, with the probability each token was drawn with: drafted again under the same sampling settings, a node
of it is estimated at that probability (core.memory.proposal).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Callable, Collection, Sequence

import numpy as np

from core.backends.base import Backend
from core.drafting import DrafterBase, StaticStrategy
from core.memory.documents import MemoryState, SuffixMemory
from core.memory.index import MAX_MATCH, CorpusIndex, LiveIndex
from core.memory.proposal import MemoryProposal, best_first
from core.memory.resume import ANCHOR_MATCH, CopyAnchor
from core.memory.spelling import Spelling
from core.memory.stats import RESUMED, MemoryStats
from core.memory.substitutions import Substitutions
from core.sampling import Rng, SamplingParams
from core.tree import TokenTree
from core.verify import Verdict

MAX_OCCURRENCES = 64      # most recent occurrences a tree is built from
MAX_NODES = 64            # the largest budget (tree nodes) and depth a memory tree is drafted with
MAX_DEPTH = 64
RECENCY_BONUS = 1.0       # the latest occurrence counts 1 + RECENCY_BONUS, older ones tend to 1 ...
RECENCY_HALF_LIFE = 4.0   # ... halving the bonus every this many occurrences


def recency_weights(n: int) -> np.ndarray:
    """Weights of ``n`` occurrences ordered from the most recent."""
    return 1.0 + RECENCY_BONUS * 0.5 ** (np.arange(n) / RECENCY_HALF_LIFE)


_RECENCY = recency_weights(MAX_OCCURRENCES)


def _paths(tree: TokenTree) -> list[tuple[int, ...]]:
    """The tokens from the root to each node."""
    paths: list[tuple[int, ...]] = []
    for tok, par in zip(tree.tokens, tree.parents):
        paths.append((paths[par] if par >= 0 else ()) + (tok,))
    return paths


def _stacked(rows: list[np.ndarray], parts: Sequence[np.ndarray | None], blank: bool | float) -> np.ndarray | None:
    """Per-row marks or values of several sources stacked like their rows, ``blank`` for a source without any; None
    when no source has any."""
    if all(part is None for part in parts):
        return None
    return np.concatenate([part if part is not None else np.full(r.shape, blank) for r, part in zip(rows, parts)])


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


class MemoryDrafter(DrafterBase):
    """Drafts a memory tree each step, learns from the verdicts how often memory is right by match length, and
    remembers the answer when the generation ends."""

    label = "memory"

    def __init__(self, memory: SuffixMemory | None = None, budget: int = 8, max_depth: int = 8,
                 min_match: int = 2, resume: bool = True, spelling: Spelling | None = None,
                 sampling: SamplingParams | None = None) -> None:
        self.memory = memory
        self.budget, self.max_depth, self.min_match = budget, max_depth, min_match
        self.resume = resume
        self.spelling = spelling        # the tokenizer's, when the caller has it (core.memory.spelling)
        # the sampling distribution's settings: probabilities recorded under them estimate this generation's nodes
        # (None: none are used, and answers are remembered without them)
        self.sampling = sampling.distribution_key if sampling is not None else None
        self._own_stats = MemoryStats() if memory is None else None
        self.live = LiveIndex()
        self.anchor = CopyAnchor()
        self.recalled = CopyAnchor(remembered=True)     # a remembered text the live one copies
        self.substitutions = Substitutions(spelling)
        self.note = ""
        self.stops: frozenset[int] = frozenset()   # the tokens that end this generation: no tree goes on past one
        self._answer_start = 0      # where the answer being written starts in the live text
        self._last: MemoryProposal | None = None

    @property
    def stats(self) -> MemoryStats:
        """The attached memory's statistics (persisted with it), else this drafter's own."""
        return self.memory.stats if self.memory is not None else self._own_stats

    @property
    def last_proposal(self) -> MemoryProposal | None:
        """The proposal of the last :meth:`propose` (or :meth:`draft`): the one :meth:`feedback` learns about."""
        return self._last

    def start(self, prompt: Sequence[int], cancel: threading.Event | None = None, stops: Collection[int] = ()) -> None:
        self.stops = frozenset(stops)
        self._answer_start = len(prompt)
        self.stats.forget_this_text()
        self.live = LiveIndex(prompt)
        self.anchor = CopyAnchor()
        self.recalled = CopyAnchor(remembered=True)
        self.substitutions = Substitutions(self.spelling)
        self._last = None
        self.note = ""

    def propose(self, context: Sequence[int], max_nodes: int, max_depth: int, min_match: int = 1,
                least_first: Callable[[int], float] | None = None) -> MemoryProposal:
        """The memory tree after ``context`` (nodes best first) with its estimates; an empty tree when the longest
        match is shorter than ``min_match``, the best first node alone when its estimate is below ``least_first``
        of its match length (:func:`core.memory.proposal.best_first`). The next :meth:`feedback` refers to this
        proposal."""
        self.live.sync(context)
        live_match, live_ends = self.live.longest()
        state = self.memory.state if self.memory is not None else None
        mem_match, mem_ends = state.index.longest(self.live.suffix()) if state is not None else (0, live_ends[:0])
        match = max(live_match, mem_match)
        depth = min(max_depth, MAX_DEPTH)
        if self.resume:
            self._last = self._followed(match, depth, state, max_nodes, max_depth, least_first)
            if self._last is not None:
                return self._last
            self._learn_edits(live_match, live_ends, mem_match, mem_ends, state)
        resumed = self._resumed(match, depth, state, max_nodes, max_depth, least_first) \
            if self.resume and match < ANCHOR_MATCH else None
        if resumed is not None and (len(resumed.tree) and not resumed.cut or match < max(min_match, 1)):
            self._last = resumed
            return resumed
        if match < max(min_match, 1):
            self._last = MemoryProposal(TokenTree(), match)
            return self._last
        rows, documents, edits, recorded = [], [], [], []
        if live_match == match:
            ends = live_ends[::-1][:MAX_OCCURRENCES]          # latest first
            found_rows, found_edits = self._rows(self.live, ends, depth)
            rows.append(found_rows)
            edits.append(found_edits)
            documents.append(np.full(len(ends), -1, np.int64))
            recorded.append(None)
        if mem_match == match:
            ends, uids = state.recent(mem_ends, MAX_OCCURRENCES - sum(len(r) for r in rows))
            found_rows, found_edits = self._rows(state.index, ends, depth)
            rows.append(found_rows)
            edits.append(found_edits)
            documents.append(uids)
            recorded.append(self._recorded(state, ends, mem_match, found_rows.shape[1], found_edits))
        # the answer echoing itself holds less often than a copy of its prompt (core.memory.stats): which one this is
        own = live_match == match and int(live_ends.max()) >= self._answer_start
        found = self._tree(rows, None, documents, edits, match, max_nodes, max_depth, least_first,
                           remembered=live_match < match, recorded=recorded, own=own)
        # a guess of where the copy resumes that cannot pay gives way to a suffix match that can (the answer writing a
        # type annotation again, between two stretches of copied code); where neither can, the guess stays, so that
        # its bucket keeps learning from what the target then emits
        self._last = resumed if resumed is not None and len(resumed.tree) and found.cut else found
        return self._last

    def _recorded(self, state: MemoryState, ends: np.ndarray, match: int, depth: int,
                  edits: np.ndarray | None) -> np.ndarray | None:
        """The probabilities recorded under this generation's sampling settings for the continuations after
        ``ends`` (matched on ``match`` tokens), where the text agrees with the remembered one as far back as either
        goes (to the remembered document's start, or ``MAX_MATCH`` tokens counting the row's own) and up to where a
        substitution applied to a row shifts its tokens; None when there are none. After a shorter agreement a
        token was drawn after another context: a match of one token, estimated at its recorded 0.98, drafted five
        nodes in a call that lost at the first."""
        if self.sampling is None:
            return None
        found = state.recorded(ends, depth, self.sampling)
        to_start = ends - state.index.starts[state.index.document_of(ends)] + 1 <= match
        unfit = np.where(to_start, MAX_MATCH, match)[:, None] + np.arange(depth) < MAX_MATCH
        if edits is not None:
            unfit |= np.logical_or.accumulate(edits, axis=1)
        found[unfit] = 0.0
        return found if found.any() else None

    def _followed(self, match: int, depth: int, state: MemoryState | None, max_nodes: int, max_depth: int,
                  least_first: Callable[[int], float] | None) -> MemoryProposal | None:
        """The tree of the copy followed through its edits (the live text's copy first, then a remembered text's),
        when it agrees longer than any suffix match; None otherwise."""
        for anchor in (self.anchor, self.recalled):
            through = anchor.through(self.live, self.substitutions)
            if through is not None and through[0] > match:     # the copy, followed through its edits, agrees longer
                self.substitutions.check(self.live.tokens())
                agreed, source = through
                ends = np.array([source], np.int64)
                rows, edits = self._rows(anchor.source(self.live), ends, depth)
                found = self._tree([rows], None, [self._documents(anchor, ends, state)], [edits],
                                   min(agreed, MAX_MATCH), max_nodes, max_depth, least_first, anchor.remembered)
                return replace(found, substituted=True)
        return None

    def _learn_edits(self, live_match: int, live_ends: np.ndarray, mem_match: int, mem_ends: np.ndarray,
                     state: MemoryState | None) -> None:
        """Follow the copies, of the live text and of a remembered one; an edit closed by finding one again becomes
        a substitution, and one the text did not make where it was carried is judged (core.memory.substitutions)."""
        self.substitutions.check(self.live.tokens())
        edits = [self.anchor.follow(self.live, live_match, live_ends)]
        if state is not None and mem_match >= ANCHOR_MATCH:
            edits.append(self.recalled.follow(self.live, mem_match, np.sort(mem_ends), state.index))
        for edit in edits:
            if edit is not None:
                self.substitutions.learn(*edit)

    def _resumed(self, match: int, depth: int, state: MemoryState | None, max_nodes: int, max_depth: int,
                 least_first: Callable[[int], float] | None) -> MemoryProposal | None:
        """The tree of guesses where a broken-off copy resumes (of the live text, of a remembered one, or both);
        None when no copy is being followed."""
        rows, weights, documents, edits = [], [], [], []
        for anchor in (self.anchor, self.recalled):
            ends, guessed = anchor.resumptions(self.live)
            if len(ends):
                found_rows, found_edits = self._rows(anchor.source(self.live), ends, depth, guessed=True)
                rows.append(found_rows)
                weights.append(guessed)
                edits.append(found_edits)
                documents.append(self._documents(anchor, ends, state))
        if not rows:
            return None
        found = self._tree(rows, np.concatenate(weights), documents, edits, ANCHOR_MATCH, max_nodes, max_depth,
                           least_first, first_match=RESUMED)
        return replace(found, match=match, resumed=True)

    def _tree(self, rows: list[np.ndarray], weights: np.ndarray | None, documents: list[np.ndarray],
              edits: list[np.ndarray | None], match: int, max_nodes: int, max_depth: int,
              least_first: Callable[[int], float] | None, remembered: bool = False,
              first_match: int | None = None, recorded: list[np.ndarray | None] | None = None,
              own: bool = False) -> MemoryProposal:
        """:func:`best_first` over the continuations of several sources (weighted by recency unless ``weights``),
        marked as carrying an edit where any of them does, with the probabilities recorded for them (per source,
        None: none)."""
        together = np.concatenate(rows) if len(rows) > 1 else rows[0]
        found = best_first(together, _RECENCY[:len(together)] if weights is None else weights,
                           np.concatenate(documents), match, self.stats, max_nodes, max_depth, first_match,
                           least_first, remembered, _stacked(rows, edits, False), _stacked(rows, recorded or (), 0.0),
                           self.stops, own)
        return replace(found, substituted=True) if any(e is not None for e in edits) else found

    def _documents(self, anchor: CopyAnchor, ends: np.ndarray, state: MemoryState | None) -> np.ndarray:
        """The remembered document of each of a copy's source positions (-1: the live text, or a memory that has
        changed since the anchor was set)."""
        if not anchor.remembered or state is None or anchor.index is not state.index:
            return np.full(len(ends), -1, np.int64)
        return state.uids[state.index.document_of(ends)].astype(np.int64)

    def _rows(self, source: LiveIndex | CorpusIndex, ends: np.ndarray, depth: int,
              guessed: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        """The continuations in ``source`` after ``ends`` (``guessed``: where a copy may resume), with the
        substitutions learnt applied, and where their new tokens start (None: no substitution applied)."""
        if not len(self.substitutions):
            return source.continuations(ends, depth), None
        copied = source.continuations(ends, depth + self.substitutions.widest)
        return self.substitutions.edited(copied, depth, len(self.live), guessed)

    def draft(self, tokens: Sequence[int], max_depth: int, max_nodes: int) -> TokenTree:
        proposal = self.propose(tokens, min(self.budget, max_nodes), min(self.max_depth, max_depth), self.min_match)
        if not len(proposal.tree):
            self.note = (f"memory: no earlier match of {_plural(self.min_match, 'token')}"
                         if proposal.match < self.min_match else "memory: nothing to draft")
            return proposal.tree
        if proposal.resumed:
            self.note = (f"memory: {_plural(len(proposal.tree), 'node')} guessing where a copy resumes "
                         f"after an edit{proposal.edit_note}")
            return proposal.tree
        remembered = len({d for d in proposal.row_documents if d >= 0})
        places = (["this text"] if -1 in proposal.row_documents else []) + \
            ([_plural(remembered, "remembered document")] if remembered else [])
        where = " in " + " and ".join(places)
        self.note = (f"memory: match of {_plural(proposal.match, 'token')}, {_plural(len(proposal.tree), 'node')} "
                     f"from {_plural(proposal.occurrences, 'earlier occurrence')}{where}{proposal.edit_note}")
        return proposal.tree

    def _proposal_nodes(self, tree: TokenTree) -> list[int]:
        """For each node of ``tree``, the node of the last proposal with the same token path (-1: none)."""
        if tree is self._last.tree:
            return list(range(len(tree)))
        own = {path: j for j, path in enumerate(_paths(self._last.tree))}
        return [own.get(path, -1) for path in _paths(tree)]

    def feedback(self, tree: TokenTree, verdict: Verdict) -> None:
        """Learn from every child of a node the walk reached: accepted, or not (a tested child, or one whose sibling
        was accepted). Documents behind an accepted node count as just used."""
        proposal = self._last
        if proposal is None or not len(tree) or not len(proposal.tree):
            return
        nodes = self._proposal_nodes(tree)
        accepted = set(verdict.accepted)
        # below an accepted EOS nothing was reached
        reached = [-1] + list(verdict.accepted if verdict.extra is not None else verdict.accepted[:-1])
        for u in reached:
            children = tree.children(u)
            decided = any(c in accepted for c in children)
            for c in children:
                j = nodes[c]
                if j >= 0 and (decided or c in verdict.accept_probs):
                    self.stats.observe(proposal.node_matches[j], c in accepted, proposal.raw_probs[j])
        if self.memory is not None and verdict.accepted and nodes[verdict.accepted[0]] >= 0:
            used = proposal.documents(nodes[verdict.accepted[0]])
            if used:
                self.memory.touch(used)

    def finish(self, prompt: Sequence[int], answer: Sequence[int], probs: Sequence[float]) -> None:
        self.remember(prompt, answer, probs)

    def remember(self, prompt: Sequence[int], answer: Sequence[int], probs: Sequence[float] = ()) -> None:
        """Remember ``answer`` behind the end of ``prompt`` (a regenerated answer is then drafted from it), with the
        probability each token was drawn with when this drafter knows the sampling settings, and save the memory with
        what this generation taught it."""
        if self.memory is not None:
            self.memory.add_answer(prompt, answer, probs if self.sampling else (), self.sampling or "")
            self.memory.save()


@dataclass(frozen=True)
class Memory(StaticStrategy):
    """Drafts from memory: this text and, when a :class:`SuffixMemory` is attached, remembered documents.

    ``budget`` nodes at most, ``max_depth`` levels, nothing unless ``min_match`` tokens agree, and where a copy of
    the text broke off, guesses of where it resumes, and the edits seen applied where the copy meets their source
    tokens again, unless ``resume`` is off. No draft model.
    """

    budget: int = 8
    max_depth: int = 8
    min_match: int = 2
    resume: bool = True
    memory: SuffixMemory | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name, value, high in (("budget", self.budget, MAX_NODES), ("max_depth", self.max_depth, MAX_DEPTH),
                                  ("min_match", self.min_match, MAX_MATCH)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
                raise ValueError(f"Memory: {name} must be an integer in 1..{high}, got {value!r}")
        if not isinstance(self.resume, bool):
            raise ValueError(f"Memory: resume must be True or False, got {self.resume!r}")
        if self.memory is not None and not isinstance(self.memory, SuffixMemory):
            raise ValueError(f"Memory: memory must be a SuffixMemory or None, got {type(self.memory).__name__}")

    @property
    def label(self) -> str:
        return f"Memory({self.budget})" if self.resume else f"Memory({self.budget}, no resume)"

    def attached(self, memory: SuffixMemory | None) -> "Memory":
        """The same strategy drafting also from ``memory``."""
        return replace(self, memory=memory)

    def make_drafter(self, draft: Backend | None, params: SamplingParams, rng: Rng) -> MemoryDrafter:
        return MemoryDrafter(self.memory, self.budget, self.max_depth, self.min_match, self.resume, sampling=params)
