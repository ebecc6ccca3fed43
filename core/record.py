"""The record of one generation as it grows: tokens, text, stats and one StepEvent per target call.

The engine's loop only drafts, verifies and commits; everything a face shows of a step (node texts, control-token
names, character spans, margins, the running totals) is assembled here, once per step, from plain values.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from core.backends.base import Backend
from core.events import Fate, GenerationResult, GenerationStats, NodeInfo, Origin, PlanEvent, StepEvent, StopReason
from core.tree import TokenTree
from core.verify import Verdict


class IncrementalDecoder:
    """Turns a growing token list into text deltas, with each token's characters, without re-decoding everything or
    splitting UTF-8 characters.

    A token whose bytes end inside a character contributes nothing until a later token completes it; the completing
    token's span then covers the character. Control tokens render as nothing (Backend.detokenize).
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.tokens: list[int] = []
        self.length = 0       # characters produced so far
        self._prefix = 0      # tokens before this only provide context for the decoder
        self._read = 0        # tokens up to here have been turned into text already
        self._before = ""     # text of tokens[_prefix:_read]

    def push(self, tokens: Sequence[int]) -> tuple[str, list[tuple[int, int]]]:
        """The text the new tokens complete, and each new token's (start, end) in the whole text."""
        parts: list[str] = []
        spans: list[tuple[int, int]] = []
        for token in tokens:
            self.tokens.append(int(token))
            now = self.backend.detokenize(self.tokens[self._prefix:])
            if now.endswith("\ufffd") or len(now) <= len(self._before) or not now.startswith(self._before):
                spans.append((self.length, self.length))  # an incomplete character (or nothing visible) so far
                continue
            delta = now[len(self._before):]
            spans.append((self.length, self.length + len(delta)))
            self.length += len(delta)
            parts.append(delta)
            self._prefix, self._read = self._read, len(self.tokens)
            self._before = self.backend.detokenize(self.tokens[self._prefix:self._read])
        return "".join(parts), spans


@dataclass(frozen=True)
class Seen:
    """What verification saw that the views show: the target's probability of each tested node (the sampling
    distribution's, or the plain softmax's for greedy decoding), for greedy, the top-2 margin of each emitted token,
    and the sampling distribution's probability of each emitted token (what a remembered answer records)."""

    target_p: dict[int, float]
    margins: tuple[float | None, ...] = ()
    emitted_p: tuple[float, ...] = ()


class GenerationRecord:
    """Tokens, text, totals and events of one generation; :meth:`add_step` turns a verified step into a StepEvent."""

    def __init__(self, target: Backend, prompt: Sequence[int], prefill_seconds: float, strategy: str,
                 greedy: bool, cached_tokens: int = 0) -> None:
        self.target = target
        self.tokens = list(prompt)
        self.new: list[int] = []
        self.probs: list[float] = []      # the sampling distribution's probability of each new token
        self.origins: list[Origin] = []
        self.events: list[StepEvent] = []
        self.text_parts: list[str] = []
        self.stats = GenerationStats(prefill_seconds=prefill_seconds, prompt_tokens=len(self.tokens),
                                     cached_tokens=cached_tokens)
        self.strategy = strategy
        self.greedy = greedy
        self.decoder = IncrementalDecoder(target)

    def token_text(self, token: int) -> tuple[str, str]:
        """(text, control-token name) of one token: a control token's text is empty, its name is kept for views."""
        name = self.target.special_name(token)
        return ("", name) if name else (self.target.detokenize([token]), "")

    def add_step(self, tree: TokenTree, verdict: Verdict, seen: Seen, *, draft_seconds: float,
                 verify_seconds: float, target_seconds: float, now: float, note: str = "",
                 shape: tuple[int, ...] | None = None, plan: PlanEvent | None = None) -> StepEvent:
        root_text = self.token_text(self.tokens[-1])[0]
        emitted = [tree.tokens[j] for j in verdict.accepted]
        origins = [Origin.DRAFT] * len(emitted)
        if verdict.extra is not None:
            emitted.append(verdict.extra)
            origins.append(Origin.BONUS if verdict.bonus else Origin.CORRECTION)
        self.tokens += emitted
        self.new += emitted
        self.probs += seen.emitted_p
        self.origins += origins
        text, spans = self.decoder.push(emitted)
        self.text_parts.append(text)
        self.stats = self.stats.after_step(
            now=now, emitted=len(emitted), drafted=len(tree), accepted=[tree.depths[j] for j in verdict.accepted],
            reached=sorted({tree.depths[j] for j in verdict.accept_probs}), draft_seconds=draft_seconds,
            verify_seconds=verify_seconds, target_seconds=target_seconds)
        event = StepEvent(
            step=len(self.events), nodes=self._nodes(tree, verdict, seen), accepted_path=verdict.accepted,
            tokens=tuple(emitted), origins=tuple(origins), token_texts=tuple(self.token_text(t)[0] for t in emitted),
            specials=tuple(self.token_text(t)[1] for t in emitted),
            text=text, spans=tuple(spans), margins=seen.margins, draft_seconds=draft_seconds,
            verify_seconds=verify_seconds, timestamp=now, stats=self.stats, strategy=self.strategy, note=note,
            greedy=self.greedy, shape=shape, root_text=root_text, plan=plan)
        self.events.append(event)
        return event

    def _nodes(self, tree: TokenTree, verdict: Verdict, seen: Seen) -> tuple[NodeInfo, ...]:
        accepted = set(verdict.accepted)
        infos = []
        for j, tok in enumerate(tree.tokens):
            fate = Fate.ACCEPTED if j in accepted else Fate.REJECTED if j in verdict.accept_probs else Fate.NOT_REACHED
            text, special = self.token_text(tok)
            infos.append(NodeInfo(
                index=j, token=tok, text=text, parent=tree.parents[j], depth=tree.depths[j],
                q=tree.proposals[j].prob(tok), p=seen.target_p.get(j), fate=fate,
                accept_prob=verdict.accept_probs.get(j), source=tree.source[j], special=special))
        return tuple(infos)

    def result(self, stop: StopReason) -> GenerationResult:
        return GenerationResult(tokens=tuple(self.new), text="".join(self.text_parts), steps=tuple(self.events),
                                stats=self.stats, stop_reason=stop, origins=tuple(self.origins),
                                token_probs=tuple(self.probs))
