"""The data every face receives: one StepEvent per target call, and the result of a whole generation.

All frozen dataclasses of plain Python values (tuples, floats, strings): safe to hand across threads and to keep.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


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
    text: str
    parent: int               # -1: child of the committed token
    depth: int                # 1 for the root's children
    q: float                  # draft probability of the token under the distribution it was drawn from
    p: float | None           # target probability of the token at its parent (None when never compared)
    fate: Fate
    accept_prob: float | None  # min(1, R[x]/D[x]) when it was tested (1.0 or 0.0 for greedy)
    source: str = ""          # which drafter proposed it


@dataclass(frozen=True)
class GenerationStats:
    """Running totals since the generation started, all from engine timestamps."""

    new_tokens: int = 0
    seconds: float = 0.0
    prefill_seconds: float = 0.0
    time_to_first_token: float | None = None
    target_calls: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    accepted_by_depth: tuple[int, ...] = ()   # index d-1: accepted nodes at depth d
    attempted_by_depth: tuple[int, ...] = ()  # index d-1: steps whose verification reached depth d

    @property
    def tokens_per_second(self) -> float:
        """Decode speed after the first token (prefill and time to first token are reported apart)."""
        decode = self.seconds - (self.time_to_first_token or 0.0)
        n = self.new_tokens - 1
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
    def rejected(self) -> int:
        return self.drafted - self.accepted

    @property
    def acceptance_by_depth(self) -> tuple[float, ...]:
        """Acceptance rate at each depth: accepted there / verification reached there."""
        return tuple(a / t if t else 0.0 for a, t in zip(self.accepted_by_depth, self.attempted_by_depth))


@dataclass(frozen=True)
class StepEvent:
    """One target call: what was drafted, what the target kept, and the running totals."""

    step: int
    nodes: tuple[NodeInfo, ...]
    accepted_path: tuple[int, ...]
    tokens: tuple[int, ...]             # emitted this step, including the correction or bonus token
    origins: tuple[Origin, ...]
    token_texts: tuple[str, ...]
    text: str                           # text added to the answer this step (decoded incrementally)
    margins: tuple[float | None, ...]   # greedy: the target's top-2 logit margin for each emitted token
    draft_seconds: float
    verify_seconds: float
    timestamp: float                    # seconds since the generation started, when the step ended
    stats: GenerationStats
    strategy: str = ""
    note: str = ""                      # e.g. why Auto chose plain decoding


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
