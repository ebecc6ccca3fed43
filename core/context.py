"""Fitting a chat into the model's context, as chat apps do: the oldest turns are left out, the system prompt and the
latest question never are.

Trimming moves its start only when the chat no longer fits, and then far enough to leave room for several more
turns (the kept part fills at most ``REFILL`` of the budget). Between two trims the prompt's beginning stays the
same, so the backend reuses its cached prefix instead of evaluating the whole chat again every turn.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

REFILL = 0.6            # after a trim, the kept chat uses at most this share of the budget
ANSWER_SHARE = 0.25     # the answer keeps at least this share of the context (or max_new_tokens, if smaller)


class MessageTooLongError(ValueError):
    """The latest message alone (with the system prompt) does not fit in the context."""


@dataclass(frozen=True)
class FittedChat:
    """The chat as sent: token ids, the index of the first kept message, and how many were left out."""

    prompt_ids: list[int]
    start: int
    dropped: int


def answer_reserve(context_length: int, max_new_tokens: int) -> int:
    """Tokens kept free for the answer."""
    return max(1, min(max_new_tokens, int(context_length * ANSWER_SHARE)))


def fit_chat(system: str, messages: Sequence[dict], template: Callable[[list[dict]], list[int]],
             context_length: int, max_new_tokens: int, start: int = 0) -> FittedChat:
    """The prompt for ``messages`` (oldest first, ending with the user's question) after ``system``, starting at
    message ``start`` or later: the earliest turn boundary whose prompt leaves room for the answer.

    Raises MessageTooLongError when even the question alone does not fit.
    """
    if not messages:
        raise ValueError("a chat needs at least one message")
    head = [{"role": "system", "content": system}] if system else []
    budget = context_length - answer_reserve(context_length, max_new_tokens)
    turns = [i for i, m in enumerate(messages) if m["role"] == "user"]   # where a kept chat may begin
    start = max(0, min(start, turns[-1]))

    def prompt(first: int) -> list[int]:
        return template(head + [dict(m) for m in messages[first:]])

    ids = prompt(start)
    if len(ids) <= budget:
        return FittedChat(ids, start, start)
    last = prompt(turns[-1])
    if len(last) > budget:
        raise MessageTooLongError(
            f"this message is {len(last)} tokens long with the chat template and system prompt, but the model's "
            f"context holds {context_length} tokens and {context_length - budget} are kept for the answer: "
            "shorten it or split it over several messages")
    # the kept length shrinks as the start moves later: binary search for the earliest start within REFILL
    candidates = [t for t in turns if t > start]
    lo, hi = 0, len(candidates) - 1
    target = int(budget * REFILL)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(prompt(candidates[mid])) <= target:
            hi = mid
        else:
            lo = mid + 1
    chosen = candidates[lo]
    ids = prompt(chosen)
    if len(ids) > budget:   # the last question alone is between REFILL and the budget
        chosen, ids = turns[-1], last
    return FittedChat(ids, chosen, chosen)
