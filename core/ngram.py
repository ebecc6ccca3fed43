"""Prompt lookup: a drafter with no model. It proposes the continuation of the latest earlier occurrence of the
text's last few tokens, found in the prompt and in what was generated so far.

The proposal is a deterministic function of the context, so each drafted token declares ``q`` one-hot
(``Proposal()`` with ``dist=None``): the verifier then accepts it with the target's own probability and samples any
correction from the target with that token removed, which keeps decoding lossless at every temperature.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Sequence

from core.backends.base import Backend
from core.drafting import DrafterBase, StaticStrategy
from core.sampling import Rng, SamplingParams
from core.tree import TokenTree

SOURCE = "ngram"


@dataclass(frozen=True)
class Lookup:
    """What the text so far says about its own continuation."""

    match: int                    # how many trailing tokens matched an earlier occurrence (0: none)
    continuation: tuple[int, ...]  # the tokens that followed that occurrence


def lookup(tokens: Sequence[int], max_ngram: int = 4, min_ngram: int = 1, max_len: int = 16,
           max_match: int = 64) -> Lookup:
    """The continuation after the most recent earlier occurrence of the longest suffix of ``tokens``.

    Suffixes of ``max_ngram`` down to ``min_ngram`` tokens are tried; among occurrences of the longest one that
    matches, the most recent wins (the text nearby is the best predictor). ``match`` then counts how far the
    agreement reaches backwards (up to ``max_match``), the evidence a planner uses to decide whether to draft at all.
    """
    n_tokens = len(tokens)
    toks = list(tokens)
    for n in range(min(max_ngram, n_tokens - 1), min_ngram - 1, -1):
        suffix = toks[n_tokens - n:]
        last = suffix[-1]
        for start in range(n_tokens - n - 1, -1, -1):
            # test the last token before slicing: this scan runs over the whole context at every step
            if toks[start + n - 1] != last or toks[start:start + n] != suffix:
                continue
            end = start + n
            continuation = tuple(toks[end:end + max_len])
            match = n
            while match < max_match and start - (match - n) - 1 >= 0 and \
                    toks[start - (match - n) - 1] == toks[n_tokens - match - 1]:
                match += 1
            return Lookup(match, continuation)
    return Lookup(0, ())


class NGramDrafter(DrafterBase):
    """Drafts the lookup continuation as a chain when the suffix match is at least ``min_match`` tokens long."""

    label = "ngram"

    def __init__(self, k: int = 4, min_match: int = 2, max_ngram: int = 4) -> None:
        self.k = k
        self.min_match = min_match
        self.max_ngram = max_ngram
        self.stops: frozenset[int] = frozenset()

    def start(self, prompt: Sequence[int], cancel=None, stops: Collection[int] = ()) -> None:
        self.stops = frozenset(stops)

    def draft(self, tokens: Sequence[int], max_depth: int, max_nodes: int) -> TokenTree:
        found = lookup(tokens, self.max_ngram, max_len=self.k)
        if found.match < self.min_match:
            return TokenTree()
        chain = found.continuation[: max(0, min(self.k, max_depth, max_nodes))]
        end = next((i + 1 for i, t in enumerate(chain) if t in self.stops), len(chain))   # nothing follows a stop
        return TokenTree.chain(chain[:end], SOURCE)


@dataclass(frozen=True)
class NGram(StaticStrategy):
    """Prompt-lookup decoding: up to ``k`` tokens copied from earlier text when ``min_match`` tokens match."""

    k: int = 4
    min_match: int = 2
    max_ngram: int = 4

    def __post_init__(self) -> None:
        for name, value, low, high in (("k", self.k, 1, 64), ("min_match", self.min_match, 1, 64),
                                       ("max_ngram", self.max_ngram, 1, 64)):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"NGram: {name} must be an integer in {low}..{high}, got {value!r}")

    @property
    def label(self) -> str:
        return f"NGram({self.k})"

    def make_drafter(self, draft: Backend | None, params: SamplingParams, rng: Rng) -> NGramDrafter:
        return NGramDrafter(self.k, self.min_match, self.max_ngram)
