"""Prompt sets: JSONL files of ``{"id", "prompt"}`` (one user message) or ``{"id", "messages"}`` (a conversation
ending with the user's turn, e.g. a follow-up that edits the model's first answer); ``"regenerate": true`` marks a
prompt whose earlier answer is remembered before it is timed (the Regenerate button)."""
from __future__ import annotations

import json
from pathlib import Path

from core.backends.files import kind_of
from core.bench.modes import BenchError

PROMPT_DIR = Path(__file__).resolve().parent.parent.parent / "resources" / "prompts"
DEFAULT_PROMPTS = ("code_generation.jsonl", "code_editing.jsonl", "explanations.jsonl", "follow_ups.jsonl")
ROLES = ("system", "user", "assistant")


def _messages(row: dict, where: str) -> list[dict]:
    if isinstance(row.get("prompt"), str) and row["prompt"].strip():
        return [{"role": "user", "content": row["prompt"]}]
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str) for m in messages):
        raise BenchError(f'{where}: each line needs "prompt" (non-empty text) or "messages" (a list of '
                         '{"role": system|user|assistant, "content": text})')
    if messages[-1]["role"] != "user":
        raise BenchError(f"{where}: a conversation must end with the user's turn")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def read_prompts(path: Path) -> list[dict]:
    """The prompts of a JSONL file as ``{"id", "set", "messages", "regenerate"}``."""
    if not path.exists():
        raise BenchError(f"prompt file {path} does not exist")
    if not path.is_file():
        raise BenchError(f"prompt file {path} is {kind_of(path)}, not a JSONL file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise BenchError(f"prompt file {path} is not UTF-8 text (byte {exc.start} cannot be decoded): save it as "
                         "UTF-8 JSONL") from None
    except OSError as exc:
        raise BenchError(f"cannot read the prompt file {path}: {exc.strerror or exc}") from None
    prompts = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BenchError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict) or "id" not in row:
            raise BenchError(f'{where}: each line must be {{"id": ..., "prompt": "non-empty text"}}')
        prompts.append({"id": str(row["id"]), "set": path.stem, "messages": _messages(row, where),
                        "regenerate": bool(row.get("regenerate", False))})
    if not prompts:
        raise BenchError(f"prompt file {path} holds no prompts")
    return prompts
