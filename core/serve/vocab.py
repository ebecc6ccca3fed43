"""llama-server's tokenizer endpoints, answered from the served model's own tokenizer as llama-server answers them:
``/tokenize`` (text, or token ids and texts mixed, to ids, each with its piece where asked), ``/detokenize`` (ids to
text, control tokens spelled out) and the text of ``/apply-template``. Clients count a prompt's tokens before sending
it, show tokens, or check what a chat becomes; none of this touches the engine's cache, so it answers while an answer
decodes.
"""
from __future__ import annotations

from typing import Sequence

from core.backends.base import BackendError, check_token_ids
from core.serve.request import RequestError, is_integer, json_object


def token_ids(target, pieces: Sequence[str | int], add_special: bool = True, parse_special: bool = True,
              param: str = "prompt") -> list[int]:
    """llama-server's reading of token ids and texts mixed: a text's special-token text is those tokens where
    ``parse_special``, and the model's begin-of-text token comes (``add_special``) only before a text that opens
    it; RequestError for an id outside the vocabulary."""
    start = target.tokenize_special("")     # what the tokenizer puts before any text
    ids: list[int] = []
    for i, piece in enumerate(pieces):
        if not isinstance(piece, str):
            ids.append(piece)
            continue
        if parse_special:
            tokens = target.tokenize_special(piece)
            tokens = tokens[len(start):] if tokens[:len(start)] == start else tokens
        else:
            tokens = target.tokenize(piece)
        ids.extend([*start, *tokens] if add_special and i == 0 else tokens)
    try:
        return check_token_ids(ids, target.vocab_size, f"the {param}'s token ids")
    except ValueError as exc:
        raise RequestError(str(exc), param=param) from None


def _bytes(target, token: int) -> bytes:
    name = target.special_name(token)
    return name.encode() if name is not None else target.piece_bytes(token)


def text_of(target, ids: Sequence[int]) -> str:
    """The text of ``ids`` with control tokens spelled out (``<|im_end|>``), as llama-server detokenizes."""
    return b"".join(_bytes(target, t) for t in ids).decode("utf-8", errors="replace")


def piece(target, token: int) -> str | list[int]:
    """A token's piece as llama-server shows it: its text, or its bytes where they are part of a character."""
    raw = _bytes(target, token)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def _flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise RequestError(f"'{name}' must be true or false", param=name)
    return value


def tokenize(target, body) -> dict:
    """``/tokenize``: ``content`` (text, or token ids and texts mixed) as token ids, with llama-server's
    ``add_special`` (false), ``parse_special`` (true) and ``with_pieces`` (false)."""
    body = json_object(body)
    content = body.get("content", "")
    if isinstance(content, str):
        content = [content]
    if not isinstance(content, list) or not all(isinstance(p, str) or is_integer(p) for p in content):
        raise RequestError("'content' must be text, or a list of token ids and texts", param="content")
    with_pieces = _flag(body, "with_pieces", False)
    try:
        ids = token_ids(target, content, _flag(body, "add_special", False), _flag(body, "parse_special", True),
                        "content")
        return {"tokens": [{"id": t, "piece": piece(target, t)} for t in ids] if with_pieces else ids}
    except BackendError as exc:    # a model served without its tokenizer
        raise RequestError(str(exc), 501, kind="not_supported_error") from None


def detokenize(target, body) -> dict:
    """``/detokenize``: ``tokens`` (ids) as text, control tokens spelled out."""
    tokens = json_object(body).get("tokens", [])
    if not isinstance(tokens, list) or not all(is_integer(t) for t in tokens):
        raise RequestError("'tokens' must be a list of token ids", param="tokens")
    try:
        return {"content": text_of(target, check_token_ids(tokens, target.vocab_size, "'tokens'"))}
    except ValueError as exc:
        raise RequestError(str(exc), param="tokens") from None
