"""SpeculativeEngine: the decode loop shared by baseline, chain and tree decoding.

Each step: the drafter proposes a tree; the target evaluates the tokens it has not cached yet plus the whole tree in
one ``forward_tree`` call; :func:`core.verify.verify_tree` decides what is kept; both caches keep the accepted path
only. Baseline is the same loop with an empty tree, so every mode shares one sampler and one tie-break.
"""
from __future__ import annotations

import threading
import time
from typing import Iterator, Sequence

import torch

from core.backends.base import Backend, ContextLengthError
from core.drafting import Baseline, Drafter
from core.events import Fate, GenerationResult, GenerationStats, NodeInfo, Origin, StepEvent, StopReason
from core.sampling import Rng, SamplingParams, logits_to_probs, top2_margin
from core.tree import TokenTree
from core.verify import Verdict, verify_tree


class IncompatibleModelsError(ValueError):
    """The draft and target models cannot be paired (different vocabularies or tokenizers)."""


class EmptyPromptError(ValueError):
    """Generation needs at least one prompt token."""


def check_pair(target: Backend, draft: Backend) -> None:
    """Raise IncompatibleModelsError unless the two models share a vocabulary and tokenizer."""
    if target.vocab_size != draft.vocab_size:
        raise IncompatibleModelsError(
            f"draft {draft.name} has a vocabulary of {draft.vocab_size} tokens but target {target.name} has "
            f"{target.vocab_size}: speculative decoding needs the same vocabulary"
        )
    if target.fingerprint() != draft.fingerprint():
        raise IncompatibleModelsError(
            f"draft {draft.name} and target {target.name} use different tokenizers (token lists or special tokens "
            "differ): the draft's tokens would mean something else to the target"
        )


class IncrementalDecoder:
    """Turns a growing token list into text deltas without re-decoding everything or splitting UTF-8 characters."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.tokens: list[int] = []
        self._prefix = 0  # tokens before this only provide context for the decoder
        self._read = 0    # tokens up to here have been turned into text already

    def push(self, tokens: Sequence[int]) -> str:
        self.tokens.extend(tokens)
        before = self.backend.detokenize(self.tokens[self._prefix:self._read])
        now = self.backend.detokenize(self.tokens[self._prefix:])
        if now.endswith("\ufffd") or len(now) <= len(before) or not now.startswith(before):
            return ""  # an incomplete multi-byte character: wait for the next tokens
        self._prefix, self._read = self._read, len(self.tokens)
        return now[len(before):]


class SpeculativeEngine:
    """Decode with a target model, speculatively when a strategy and draft model are given.

    ``strategy`` is ``Baseline()``, ``Chain(k)``, ``MultiDraft(k, length)`` or ``Tree(...)`` (core.drafting).
    """

    def __init__(self, target: Backend, draft: Backend | None = None, strategy=None,
                 sampling: SamplingParams | None = None, *, rng_factory=Rng) -> None:
        self.target = target
        # the random source is injectable so that tests can enumerate every random path exactly
        self.rng_factory = rng_factory
        self.draft = draft
        self.strategy = strategy if strategy is not None else Baseline()
        self.sampling = sampling if sampling is not None else SamplingParams()
        if draft is not None:
            check_pair(target, draft)
        self.last_result: GenerationResult | None = None

    def chat_ids(self, messages: Sequence[dict]) -> list[int]:
        """Token ids of a chat in the target's own template, ready for the assistant's answer."""
        return self.target.apply_chat_template(messages)

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int = 128,
                 cancel: threading.Event | None = None) -> GenerationResult:
        """Run a whole generation and return its result."""
        for _ in self.stream(prompt_ids, max_new_tokens, cancel):
            pass
        assert self.last_result is not None
        return self.last_result

    def _make_drafter(self, rng: Rng) -> Drafter | None:
        bind = getattr(self.strategy, "bind", None)  # a planning strategy (Auto) measures both models first
        if bind is not None:
            bind(self.target, self.draft, self.sampling)
        return self.strategy.make_drafter(self.draft, self.sampling, rng)

    def stream(self, prompt_ids: Sequence[int], max_new_tokens: int = 128,
               cancel: threading.Event | None = None) -> Iterator[StepEvent]:
        """Yield one StepEvent per target call; the GenerationResult is then in ``self.last_result``.

        Stops at EOS, after ``max_new_tokens`` (never more), when the context is full, or when ``cancel`` is set
        (checked between steps; what was generated is kept).
        """
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise EmptyPromptError("the prompt is empty: give at least one token")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        ctx = self.target.context_length
        if len(prompt) >= ctx:
            raise ContextLengthError(
                f"the prompt has {len(prompt)} tokens but {self.target.name} has a context of {ctx}: "
                "shorten the prompt or start a new chat"
            )
        bad = [t for t in prompt if not 0 <= t < self.target.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids out of the vocabulary (size {self.target.vocab_size}): {bad[:5]}")
        params = self.sampling
        rng = self.rng_factory(params.seed)
        drafter = self._make_drafter(rng)
        eos = self.target.eos_ids
        self.last_result = None

        t_start = time.perf_counter()
        if len(prompt) > 1:
            self.target.prefill(prompt[:-1])
        else:
            self.target.reset()
        if drafter is not None:
            drafter.start(prompt)
        prefill_seconds = time.perf_counter() - t_start

        tokens = list(prompt)
        new: list[int] = []
        origins: list[Origin] = []
        events: list[StepEvent] = []
        text_parts: list[str] = []
        decoder = IncrementalDecoder(self.target)
        stats = GenerationStats(prefill_seconds=prefill_seconds)
        acc_depth: list[int] = []
        att_depth: list[int] = []
        stop = None
        step = 0
        while stop is None:
            if cancel is not None and cancel.is_set():
                stop = StopReason.CANCELLED
                break
            remaining = max_new_tokens - len(new)
            room = ctx - len(tokens)
            t0 = time.perf_counter()
            tree = TokenTree()
            if drafter is not None and remaining > 1 and room > 1:
                tree = drafter.draft(tokens, max_depth=min(remaining, room) - 1, max_nodes=room - 1)
            t1 = time.perf_counter()
            verdict, margins, shown_p = self._verify(tree, tokens, rng, eos)
            if drafter is not None:
                drafter.feedback(tree, verdict)
            t2 = time.perf_counter()

            emitted = [tree.tokens[j] for j in verdict.accepted]
            step_origins = [Origin.DRAFT] * len(emitted)
            if verdict.extra is not None:
                emitted.append(verdict.extra)
                step_origins.append(Origin.BONUS if verdict.bonus else Origin.CORRECTION)
            tokens += emitted
            new += emitted
            origins += step_origins
            for d in range(1, tree.max_depth + 1):
                if len(acc_depth) < d:
                    acc_depth.append(0)
                    att_depth.append(0)
            reached = {tree.depths[j] for j in verdict.tested}
            for d in reached:
                att_depth[d - 1] += 1
            for j in verdict.accepted:
                acc_depth[tree.depths[j] - 1] += 1

            now = t2 - t_start
            stats = GenerationStats(
                new_tokens=len(new), seconds=now, prefill_seconds=prefill_seconds,
                time_to_first_token=stats.time_to_first_token if stats.time_to_first_token is not None else now,
                target_calls=stats.target_calls + 1,
                draft_seconds=stats.draft_seconds + (t1 - t0), verify_seconds=stats.verify_seconds + (t2 - t1),
                drafted=stats.drafted + len(tree), accepted=stats.accepted + len(verdict.accepted),
                accepted_by_depth=tuple(acc_depth), attempted_by_depth=tuple(att_depth),
            )
            visible = [t for t in emitted if t not in eos]
            delta = decoder.push(visible)
            text_parts.append(delta)
            if any(t in eos for t in emitted):
                stop = StopReason.EOS
            elif len(new) >= max_new_tokens:
                stop = StopReason.MAX_TOKENS
            elif len(tokens) >= ctx:
                stop = StopReason.CONTEXT
            event = StepEvent(
                step=step, nodes=self._node_infos(tree, verdict, shown_p), accepted_path=verdict.accepted,
                tokens=tuple(emitted), origins=tuple(step_origins),
                token_texts=tuple(self.target.detokenize([t]) for t in emitted), text=delta,
                margins=tuple(margins), draft_seconds=t1 - t0, verify_seconds=t2 - t1, timestamp=now,
                stats=stats, strategy=self.strategy.label, note=getattr(drafter, "note", ""),
            )
            events.append(event)
            step += 1
            yield event

        self.last_result = GenerationResult(
            tokens=tuple(new), text="".join(text_parts), steps=tuple(events), stats=stats,
            stop_reason=stop, origins=tuple(origins),
        )
        return self.last_result

    def _verify(self, tree: TokenTree, tokens: list[int], rng: Rng, eos) -> tuple[Verdict, list[float | None], dict]:
        """One target call on the uncached tokens plus the tree, then verification and the target's commit.

        Returns the verdict, the top-2 margins of the emitted tokens (greedy only) and, for every tested node, the
        target probability to show: the sampling distribution's, or for greedy decoding the plain softmax's, since
        a one-hot 1.0/0.0 would tell a viewer nothing.
        """
        target = self.target
        pending = tokens[len(target.committed):]
        work = tree.attached_below(pending)
        logits = target.forward_tree(work)
        root_row = len(pending) - 1

        def row(u: int):
            return logits[root_row if u < 0 else root_row + 1 + u]

        p_rows: dict[int, torch.Tensor] = {}

        def target_dist(u: int) -> torch.Tensor:
            if u not in p_rows:
                p_rows[u] = logits_to_probs(row(u), self.sampling)
            return p_rows[u]

        verdict = verify_tree(tree, target_dist, rng, eos)
        target.commit(list(range(len(pending))) + [len(pending) + j for j in verdict.accepted])
        margins: list[float | None] = []
        shown_p = verdict.target_p
        if self.sampling.greedy:
            parents = [tree.parents[j] for j in verdict.accepted]
            if verdict.extra is not None:
                parents.append(verdict.accepted[-1] if verdict.accepted else -1)
            margins = [top2_margin(row(u)) for u in parents]
            softmax = {u: torch.softmax(row(u).double(), -1) for u in {tree.parents[j] for j in verdict.target_p}}
            shown_p = {j: float(softmax[tree.parents[j]][tree.tokens[j]]) for j in verdict.target_p}
        return verdict, margins, shown_p

    def _node_infos(self, tree: TokenTree, verdict: Verdict, shown_p: dict[int, float]) -> tuple[NodeInfo, ...]:
        accepted = set(verdict.accepted)
        infos = []
        for j, tok in enumerate(tree.tokens):
            fate = Fate.ACCEPTED if j in accepted else Fate.REJECTED if j in verdict.accept_probs else Fate.NOT_REACHED
            infos.append(NodeInfo(
                index=j, token=tok, text=self.target.detokenize([tok]), parent=tree.parents[j], depth=tree.depths[j],
                q=tree.proposals[j].prob(tok), p=shown_p.get(j), fate=fate,
                accept_prob=verdict.accept_probs.get(j), source=tree.source[j],
            ))
        return tuple(infos)
