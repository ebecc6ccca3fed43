"""How fast lossless speculation could possibly be on one machine, for one known answer: an upper bound that no
drafter can beat, from the target's measured cost of a call on ``n`` tokens.

An oracle drafts, at each step, the true continuation of the answer, paying for it as cheaply as any drafter could:

* a stretch that occurs in the text known by then (the prompt, the conversation, earlier answers, the answer so far)
  is copied for free, from wherever it occurs (a real copying drafter must first find it by the tokens in front of
  it, may pick a wrong occurrence, and pays for its lookups);
* any other token, when a draft model is given, costs one draft-model call (a real model is sometimes wrong).

The oracle verifies ``k`` drafted tokens in one call of ``k + 1`` (the root gives one more token) or takes a plain
step; a shortest-time search over the answer picks every step. Every step of a real drafter whose accepted path is
``k`` long costs at least that (its tree has at least ``k + 1`` nodes), so the ratio of plain decoding's time to the
oracle's is a ceiling of Auto / Baseline on that answer.
"""
from __future__ import annotations

from typing import Callable, Sequence

Cost = Callable[[int], float]   # seconds of one target call evaluating n tokens


def copy_lengths(known: Sequence[int], answer: Sequence[int]) -> list[int]:
    """For each position ``i`` of ``answer``: the longest ``L`` such that ``answer[i:i+L]`` occurs in
    ``known + answer[:i]`` (the occurrence lies wholly in that text: nothing later can be copied yet)."""
    text = list(known) + list(answer)
    base = len(known)
    out = []
    for i in range(len(answer)):
        end = base + i              # the text known at this point is text[:end]
        best = 0
        first = answer[i]
        for j in range(end):
            if text[j] != first:
                continue
            length = 1
            while j + length < end and i + length < len(answer) and text[j + length] == answer[i + length]:
                length += 1
            best = max(best, length)
        out.append(best)
    return out


def envelope(cost: Cost, max_call: int) -> Cost:
    """The least cost of a call on at least ``n`` tokens: a ceiling may pad a call with nodes it does not need
    where the measured table makes a larger call cheaper (llama.cpp's kernels change with the batch size)."""
    least = [0.0] * (max_call + 2)
    least[max_call + 1] = float("inf")
    for n in range(max_call, 0, -1):
        least[n] = min(cost(n), least[n + 1])
    return lambda n: least[n]


def ceiling(lengths: Sequence[int], cost: Cost, max_call: int,
            draft_call: float | None = None) -> tuple[float, list[int]]:
    """The oracle's speedup over plain decoding on an answer whose copy lengths are ``lengths``
    (:func:`copy_lengths`), with calls of at most ``max_call`` tokens; and the tokens each of its steps gave."""
    n = len(lengths)
    if n == 0:
        return 1.0, []
    least = envelope(cost, max_call)
    best = [0.0] * (n + 1)          # best[i]: least time from position i to the end
    step = [1] * (n + 1)
    for i in range(n - 1, -1, -1):
        best[i], step[i] = least(1) + best[i + 1], 1
        drafted = _drafting_costs(lengths, i, min(max_call - 1, n - i - 1), draft_call)
        for k, paid in enumerate(drafted[1:], 1):
            t = least(k + 1) + paid + best[i + k + 1]
            if t < best[i]:
                best[i], step[i] = t, k + 1
    steps, i = [], 0
    while i < n:
        steps.append(step[i])
        i += step[i]
    return n * least(1) / best[0], steps


def _drafting_costs(lengths: Sequence[int], i: int, most: int, draft_call: float | None) -> list[float]:
    """``out[k]``: the least drafting cost of the answer's tokens ``i .. i+k-1`` (copied stretches free, every other
    token one draft-model call; without a model only what copies cover), for k up to ``most``."""
    inf = float("inf")
    out = [inf] * (most + 1)
    out[0] = 0.0
    for j in range(most):           # out[j] is final once every shorter prefix has been extended
        if out[j] == inf:
            continue
        if draft_call is not None:
            out[j + 1] = min(out[j + 1], out[j] + draft_call)
        for length in range(1, min(lengths[i + j], most - j) + 1):
            out[j + length] = min(out[j + length], out[j])
    return out[:out.index(inf)] if inf in out else out   # copies reach a prefix: the head of a copy is a copy
