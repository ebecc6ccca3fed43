"""SpeculativeEngine: the decode loop shared by baseline, chain and tree decoding.

Each step reads draft -> verify -> commit -> emit: the drafter proposes a tree; the target evaluates the tokens it
has not cached yet plus the whole tree in one ``forward_tree`` call; :mod:`core.verify` decides what is kept; both
caches keep the accepted path only; the step becomes a StepEvent (core.record). Baseline is the same loop with an
empty tree, so every mode shares one sampler and one tie-break.
"""
from __future__ import annotations

import math
import threading
import time
from typing import Callable, Iterator, Sequence

import torch

from core.backends.base import (Backend, Cancelled, ContextLengthError, Progress, cached_prompt, check_pair,
                                check_token_ids)
from core.drafting import Baseline, Drafter, Strategy, Verifier
from core.events import GenerationResult, GenerationStats, StepEvent, StopReason
from core.record import GenerationRecord, Seen
from core.sampling import (Rng, SamplingParams, greedy_token, logits_to_probs, token_probability, top2_margin,
                           without_tokens)
from core.tree import TokenTree
from core.verify import Verdict, verify_greedy, verify_tree


class EmptyPromptError(ValueError):
    """Generation needs at least one prompt token."""


class SpeculativeEngine:
    """Decode with a target model, speculatively when a strategy and draft model are given.

    ``strategy`` is ``Baseline()``, ``Chain(k)``, ``MultiDraft(k, length)``, ``Tree(...)``, ``Auto()`` ... (any
    :class:`core.drafting.Strategy`).
    """

    def __init__(self, target: Backend, draft: Backend | None = None, strategy: Strategy | None = None,
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

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int = 128, cancel: threading.Event | None = None,
                 progress: Progress | None = None) -> GenerationResult:
        """Run a whole generation and return its result."""
        for _ in self.stream(prompt_ids, max_new_tokens, cancel, progress):
            pass
        assert self.last_result is not None
        return self.last_result

    def stream(self, prompt_ids: Sequence[int], max_new_tokens: int = 128, cancel: threading.Event | None = None,
               progress: Progress | None = None) -> Iterator[StepEvent]:
        """Yield one StepEvent per target call; the GenerationResult is then in ``self.last_result``.

        Stops at EOS, after ``max_new_tokens`` (never more), when the context is full, or when ``cancel`` is set
        (checked between prefill chunks and between steps; what was generated is kept). ``progress(done, total)``
        reports a long prompt's prefill.
        """
        prompt = self._checked_prompt(prompt_ids, max_new_tokens)
        rng = self.rng_factory(self.sampling.seed)
        self.strategy.bind(self.target, self.draft, self.sampling)
        drafter = self.strategy.make_drafter(self.draft, self.sampling, rng)
        self.last_result = None
        t_start = time.perf_counter()
        cached = cached_prompt(self.target, prompt)
        try:
            self._prefill(prompt, drafter, cancel, progress)
        except Cancelled:
            self.last_result = GenerationResult((), "", (), GenerationStats(
                seconds=time.perf_counter() - t_start, prefill_seconds=time.perf_counter() - t_start),
                StopReason.CANCELLED)
            return
        record = GenerationRecord(self.target, prompt, time.perf_counter() - t_start, self.strategy.label,
                                  self.sampling.greedy, cached)
        rule = drafter.verify if drafter is not None else verify_tree
        try:
            while (stop := self._stop_reason(record, max_new_tokens, cancel)) is None:
                t0 = time.perf_counter()
                tree = self._draft(drafter, record, max_new_tokens)
                t1 = time.perf_counter()
                verdict, seen, target_seconds = self._verify(tree, record, rng, rule)
                if drafter is not None:
                    drafter.feedback(tree, verdict)
                t2 = time.perf_counter()
                yield record.add_step(
                    tree, verdict, seen, draft_seconds=t1 - t0, verify_seconds=t2 - t1,
                    target_seconds=target_seconds, now=t2 - t_start, note=drafter.note if drafter is not None else "",
                    shape=drafter.shape if drafter is not None else None,
                    plan=drafter.take_plan() if drafter is not None else None)
        except GeneratorExit:
            # the caller stopped reading (a stop sequence): what was made so far is the result, but not an answer the
            # drafter should remember as one
            self.last_result = record.result(StopReason.CANCELLED)
            raise
        if drafter is not None and record.new:
            drafter.finish(prompt, record.new, record.probs)
        self.last_result = record.result(stop)

    # -- the steps of the loop ------------------------------------------------------------------------------------
    def _checked_prompt(self, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
        prompt = check_token_ids(prompt_ids, self.target.vocab_size, "prompt token ids")
        if not prompt:
            raise EmptyPromptError("the prompt is empty: give at least one token")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        ctx = self.target.context_length
        if len(prompt) >= ctx:
            raise ContextLengthError(
                f"the prompt has {len(prompt)} tokens but {self.target.name} has a context of {ctx}: "
                "shorten the prompt or start a new chat"
            )
        return prompt

    def _prefill(self, prompt: list[int], drafter: Drafter | None, cancel: threading.Event | None,
                 progress: Progress | None) -> None:
        """Cache all but the prompt's last token in both models (that one is the first step's root)."""
        if len(prompt) > 1:
            self.target.prefill(prompt[:-1], cancel=cancel, progress=progress)
        else:
            self.target.reset()
        if drafter is not None:
            drafter.start(prompt, cancel, self.target.eos_ids)

    def _stop_reason(self, record: GenerationRecord, max_new_tokens: int,
                     cancel: threading.Event | None) -> StopReason | None:
        if record.new and record.new[-1] in self.target.eos_ids:
            return StopReason.EOS
        if len(record.new) >= max_new_tokens:
            return StopReason.MAX_TOKENS
        if len(record.tokens) >= self.target.context_length:
            return StopReason.CONTEXT
        if cancel is not None and cancel.is_set():
            return StopReason.CANCELLED
        return None

    def _draft(self, drafter: Drafter | None, record: GenerationRecord, max_new_tokens: int) -> TokenTree:
        """The drafter's tree, cut to the token budget and the context left (the step's own token included)."""
        remaining = max_new_tokens - len(record.new)
        room = self.target.context_length - len(record.tokens)
        if drafter is None or remaining <= 1 or room <= 1:
            return TokenTree()
        depth, nodes = min(remaining, room) - 1, room - 1
        tree = drafter.draft(record.tokens, max_depth=depth, max_nodes=nodes)
        if len(tree) > nodes or tree.max_depth > depth:
            tree = tree.truncated(max_nodes=nodes, max_depth=depth)
        return tree

    def _verify(self, tree: TokenTree, record: GenerationRecord, rng: Rng,
                rule: Verifier) -> tuple[Verdict, Seen, float]:
        """One target call on the uncached tokens plus the tree, then verification (``rule``, the drafter's) and the
        target's commit.

        Returns the verdict, what the views show of it, and the seconds spent inside the target's forward call.
        Greedy decoding takes argmaxes straight from the logits rows; sampling processes only the rows reached.
        """
        target = self.target
        pending = record.tokens[len(target.committed):]
        t0 = time.perf_counter()
        logits = target.forward_tree(tree.attached_below(pending))
        target_seconds = time.perf_counter() - t0
        root_row = len(pending) - 1
        eos = target.eos_ids
        # the row below node u (the root: depth 0) picks new token number len(new) + depth(u); end-of-text is barred
        # from those before min_tokens
        barred = self.sampling.min_tokens - len(record.new) if eos else 0

        def row(u: int) -> torch.Tensor:
            depth = 0 if u < 0 else tree.depths[u]
            logits_row = logits[root_row if u < 0 else root_row + 1 + u]
            return without_tokens(logits_row, eos) if depth < barred else logits_row

        if self.sampling.greedy:
            verdict = verify_greedy(tree, lambda u: greedy_token(row(u)), eos)
            seen = self._greedy_seen(tree, verdict, row)
        else:
            p_rows: dict[int, torch.Tensor] = {}

            def target_dist(u: int) -> torch.Tensor:
                if u not in p_rows:
                    p_rows[u] = logits_to_probs(row(u), self.sampling)
                return p_rows[u]

            def prob(u: int, token: int) -> float:
                return float(p_rows[u][token]) if u in p_rows else token_probability(row(u), token, self.sampling)

            verdict = rule(tree, target_dist, rng, eos, prob)
            seen = Seen(verdict.target_p, emitted_p=self._emitted_p(tree, verdict, prob))
        target.commit(list(range(len(pending))) + [len(pending) + j for j in verdict.accepted])
        return verdict, seen, target_seconds

    @staticmethod
    def _emitted_p(tree: TokenTree, verdict: Verdict, prob: Callable[[int, int], float]) -> tuple[float, ...]:
        """The sampling distribution's probability of each token a sampled step emits, from the rows verification
        built (one more read for a bonus token): a remembered answer keeps them, so that a regeneration knows where
        the earlier sample was a toss-up (core.memory)."""
        out = [verdict.target_p[j] if j in verdict.target_p else prob(tree.parents[j], tree.tokens[j])
               for j in verdict.accepted]
        if verdict.extra is not None:
            out.append(prob(verdict.accepted[-1] if verdict.accepted else -1, verdict.extra))
        return tuple(out)

    @staticmethod
    def _greedy_seen(tree: TokenTree, verdict: Verdict, row) -> Seen:
        """For greedy decoding: each emitted token's top-2 margin, each tested node's plain softmax probability (a
        one-hot 1.0/0.0 would tell a viewer nothing), and 1.0 for each emitted token, the greedy distribution's."""
        parents = [tree.parents[j] for j in verdict.accepted]
        if verdict.extra is not None:
            parents.append(verdict.accepted[-1] if verdict.accepted else -1)
        margins = tuple(top2_margin(row(u)) for u in parents)
        # float32 logsumexp (it subtracts the max) is accurate to ~1e-6 here and six times cheaper than float64, which
        # cost 1.7 ms per row: most of Auto's Python time on a step that verifies a long copied draft
        log_norm = {u: float(torch.logsumexp(row(u), -1)) for u in {tree.parents[j] for j in verdict.accept_probs}}
        target_p = {j: math.exp(float(row(tree.parents[j])[tree.tokens[j]]) - log_norm[tree.parents[j]])
                    for j in verdict.accept_probs}
        return Seen(target_p, margins, (1.0,) * len(parents))
