"""The data every face receives: one StepEvent per target call, a PlanEvent when Auto plans, and the result of a whole
generation.

All frozen dataclasses of plain Python values (tuples, floats, strings): safe to hand across threads and to keep.
A view draws from these alone; it never reads a live strategy, drafter or plan.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Sequence


class Fate(str, Enum):
    """What verification did with a drafted node."""

    ACCEPTED = "accepted"
    REJECTED = "rejected"
    NOT_REACHED = "not_reached"


class Origin(str, Enum):
    """Where an emitted token came from."""

    DRAFT = "draft"          # a drafted token the target accepted
    CORRECTION = "correction"  # the target's token after a rejection (or when nothing was drafted)
    BONUS = "bonus"          # the target's extra token after a fully accepted path


@dataclass(frozen=True)
class NodeInfo:
    """One drafted node as shown in the tree view."""

    index: int
    token: int
    text: str                 # as a reader sees it: "" for a control token
    parent: int               # -1: child of the committed token
    depth: int                # 1 for the root's children
    q: float                  # draft probability of the token under the distribution it was drawn from
    p: float | None           # target probability of the token at its parent (None when never compared)
    fate: Fate
    accept_prob: float | None  # min(1, R[x]/D[x]) when it was tested (1.0 or 0.0 for greedy)
    source: str = ""          # which drafter proposed it
    special: str = ""         # the control token's name (e.g. "<|im_end|>"); views mark it, text stays empty


@dataclass(frozen=True)
class GenerationStats:
    """Running totals since the generation started, all from engine timestamps."""

    new_tokens: int = 0
    seconds: float = 0.0
    prefill_seconds: float = 0.0
    prompt_tokens: int = 0          # the prompt's length ...
    cached_tokens: int = 0          # ... and how much of it the target's cache already held (not evaluated again)
    time_to_first_token: float | None = None
    first_tokens: int = 0           # tokens that arrived with the first (a first step that drafts emits several)
    target_calls: int = 0
    draft_seconds: float = 0.0      # drafting, model calls included
    verify_seconds: float = 0.0     # the target's forward, verification and both commits
    target_seconds: float = 0.0     # inside the target's forward call only
    drafted: int = 0
    accepted: int = 0
    accepted_by_depth: tuple[int, ...] = ()   # index d-1: accepted nodes at depth d
    attempted_by_depth: tuple[int, ...] = ()  # index d-1: steps whose verification reached depth d

    def after_step(self, *, now: float, emitted: int, drafted: int, accepted: Sequence[int], reached: Sequence[int],
                   draft_seconds: float, verify_seconds: float, target_seconds: float) -> "GenerationStats":
        """The totals after one more step; ``accepted`` and ``reached`` are the depths of the accepted nodes and the
        distinct depths verification tested."""
        acc, att = list(self.accepted_by_depth), list(self.attempted_by_depth)
        deepest = max([0, *accepted, *reached])
        acc += [0] * (deepest - len(acc))
        att += [0] * (deepest - len(att))
        for d in accepted:
            acc[d - 1] += 1
        for d in reached:
            att[d - 1] += 1
        return replace(
            self, new_tokens=self.new_tokens + emitted, seconds=now,
            time_to_first_token=self.time_to_first_token if self.time_to_first_token is not None else now,
            first_tokens=self.first_tokens if self.time_to_first_token is not None else emitted,
            target_calls=self.target_calls + 1, draft_seconds=self.draft_seconds + draft_seconds,
            verify_seconds=self.verify_seconds + verify_seconds, target_seconds=self.target_seconds + target_seconds,
            drafted=self.drafted + drafted, accepted=self.accepted + len(accepted),
            accepted_by_depth=tuple(acc), attempted_by_depth=tuple(att))

    @property
    def tokens_per_second(self) -> float:
        """Decode speed after the first token (prefill and time to first token are reported apart): the tokens after
        those that came with the first, over the time after it. A first step that drafts emits several tokens at
        once; counted after the first token, they came in no time (a regeneration copied in one call of 64 tokens
        measured 7x)."""
        decode = self.seconds - (self.time_to_first_token or 0.0)
        n = self.new_tokens - max(self.first_tokens, 1)
        if n <= 0 or decode <= 0:
            return self.new_tokens / self.seconds if self.seconds > 0 else 0.0
        return n / decode

    @property
    def overall_tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_call(self) -> float:
        """Mean tokens emitted per target call (accepted drafts + the target's own token)."""
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def mean_accepted(self) -> float:
        """Mean accepted draft tokens per target call."""
        return self.accepted / self.target_calls if self.target_calls else 0.0

    @property
    def overhead_seconds(self) -> float:
        """Decode time spent outside the target's forward calls and drafting: the engine's own Python."""
        return max(0.0, self.seconds - self.prefill_seconds - self.target_seconds - self.draft_seconds)

    @property
    def rejected(self) -> int:
        return self.drafted - self.accepted

    @property
    def acceptance_by_depth(self) -> tuple[float, ...]:
        """Acceptance rate at each depth: accepted there / verification reached there."""
        return tuple(a / t if t else 0.0 for a, t in zip(self.accepted_by_depth, self.attempted_by_depth))


@dataclass(frozen=True)
class PlanEvent:
    """What a planner measured and chose, as the planner view draws it. Made when Auto plans or re-plans."""

    acceptance: tuple[float, ...]                 # a_i: the rank-i child is the accepted one (empty: no draft model)
    best_value: tuple[tuple[float, ...], ...]     # [d][n] = c(n, d), tokens per call; n = 0 unused
    verify_seconds: dict[int, float]              # measured target forward of n tokens
    plan_budget: int                              # tokens per target call, root included (1: no tree)
    plan_depth: int
    plan_parents: tuple[int, ...]
    predicted_tokens: float                       # c(n, d) of the plan
    predicted_speedup: float
    draft_seconds: dict[int, float] | None = None
    realised_speedup: float | None = None         # measured, against a baseline run of the same prompt
    note: str = ""

    def with_realised(self, speedup: float) -> "PlanEvent":
        """The same plan with the speedup a race measured."""
        return replace(self, realised_speedup=speedup)


@dataclass(frozen=True)
class StepEvent:
    """One target call: what was drafted, what the target kept, and the running totals."""

    step: int
    nodes: tuple[NodeInfo, ...]
    accepted_path: tuple[int, ...]
    tokens: tuple[int, ...]             # emitted this step, including the correction or bonus token
    origins: tuple[Origin, ...]
    token_texts: tuple[str, ...]        # each emitted token's text ("" for a control token)
    specials: tuple[str, ...]           # each emitted control token's name (e.g. "<|im_end|>"), "" for text tokens
    text: str                           # text added to the answer this step (decoded incrementally)
    spans: tuple[tuple[int, int], ...]  # each emitted token's characters in the answer's text (start, end)
    margins: tuple[float | None, ...]   # greedy: the target's top-2 logit margin for each emitted token
    draft_seconds: float
    verify_seconds: float
    timestamp: float                    # seconds since the generation started, when the step ended
    stats: GenerationStats
    strategy: str = ""
    note: str = ""                      # e.g. why Auto chose plain decoding
    greedy: bool = False
    shape: tuple[int, ...] | None = None  # the planned tree shape this step drafted from (drawn faintly)
    root_text: str = ""                 # text of the token the tree hangs from (the last one committed)
    plan: PlanEvent | None = None       # set on the step where a plan was made or re-made


class StopReason(str, Enum):
    EOS = "eos"
    MAX_TOKENS = "max_new_tokens"
    CONTEXT = "context_full"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class GenerationResult:
    """Everything one generation produced."""

    tokens: tuple[int, ...]
    text: str
    steps: tuple[StepEvent, ...]
    stats: GenerationStats
    stop_reason: StopReason
    origins: tuple[Origin, ...] = field(default=())
    token_probs: tuple[float, ...] = field(default=())   # the sampling distribution's probability of each token
