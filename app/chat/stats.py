"""The stats shown under each answer, as stored (a plain dict, JSON-safe) and as displayed (one line)."""
from __future__ import annotations

from core.events import GenerationStats, StopReason

STOP_TEXT = {StopReason.EOS.value: "", StopReason.MAX_TOKENS.value: "length limit",
             StopReason.CONTEXT.value: "context full", StopReason.CANCELLED.value: "stopped"}


def stats_record(stats: GenerationStats, strategy: str, stop_reason: StopReason | None) -> dict:
    """The numbers of one answer, all from engine timestamps."""
    return {
        "strategy": strategy,
        "tokens": stats.new_tokens,
        # unrounded: the window's speed label formats the same figure, and a value rounded twice (363.1502 ->
        # 363.15 -> "363.1") would show another speed under the answer than beside it
        "tokens_per_second": stats.tokens_per_second,
        "time_to_first_token": None if stats.time_to_first_token is None else round(stats.time_to_first_token, 4),
        "seconds": round(stats.seconds, 4),
        "target_calls": stats.target_calls,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "rejected": stats.rejected,
        "mean_accepted": round(stats.mean_accepted, 3),
        "stop_reason": stop_reason.value if stop_reason is not None else None,
    }


def format_stats(record: dict) -> str:
    """One line for under an answer, e.g. '41.2 tok/s · first token 0.21 s · 3.10 s · 128 tokens · ...'."""
    parts = [f"{record['tokens_per_second']:.1f} tok/s"]
    if record.get("time_to_first_token") is not None:
        parts.append(f"first token {record['time_to_first_token']:.2f} s")
    parts.append(f"{record['seconds']:.2f} s")
    parts.append(f"{record['tokens']} tokens")
    if record.get("drafted"):
        parts.append(f"draft {record['accepted']} accepted / {record['rejected']} rejected")
        parts.append(f"{record['mean_accepted']:.2f} accepted per target call")
    if record.get("strategy"):
        parts.append(record["strategy"])
    if record.get("engine_stats"):
        parts.append(record["engine_stats"])
    stop = STOP_TEXT.get(record.get("stop_reason") or "", "")
    if stop:
        parts.append(stop)
    return "  ·  ".join(parts)
