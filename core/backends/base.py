"""The Backend protocol: one model, its tokenizer and its KV cache, behind a few calls the engine needs.

The cache holds the *committed* tokens. ``forward_tree`` appends tree nodes after them (each node sees the committed
prefix and its own ancestors only); ``commit`` keeps the nodes of one root-to-node path, in order, and drops every
other node of the tree. The engine never touches a backend's tensors.

Also here: the pairing rule (two models can pair only if they share a tokenizer), the checks every backend shares,
and the chat-template rule that keeps message text plain text.
"""
from __future__ import annotations

import hashlib
import json
import operator
import re
import threading
from typing import Callable, Iterator, Mapping, Protocol, Sequence, runtime_checkable

import torch

from core.backends.infill import FimTokens
from core.tree import TokenTree

Progress = Callable[[int, int], None]   # (tokens done, tokens in all)


class BackendError(RuntimeError):
    """A backend could not do what was asked (bad model file, out of context, inconsistent call)."""


class ContextLengthError(BackendError):
    """The tokens asked for do not fit in the model's context window."""


class ModelLoadError(BackendError):
    """A model could not be loaded; the message names the file or package and what to do about it."""


class IncompatibleModelsError(ValueError):
    """The draft and target models cannot be paired (different vocabularies or tokenizers)."""


class Cancelled(Exception):
    """A long call (a prefill) stopped at a chunk boundary because its cancel event was set."""


@runtime_checkable
class Backend(Protocol):
    """What the engine needs from a model. See the module docstring for the cache discipline."""

    name: str
    vocab_size: int
    eos_ids: frozenset[int]
    context_length: int
    device: str

    @property
    def committed(self) -> list[int]:
        """The token ids whose KV entries the cache holds, in order (a copy)."""

    def tokenize(self, text: str) -> list[int]:
        """Token ids of plain text: special-token text such as ``<|im_end|>`` stays text."""

    def tokenize_special(self, text: str) -> list[int]:
        """Token ids of raw prompt text in which special-token text such as ``<|fim_prefix|>`` is that token, after
        the model's begin-of-text token where its tokenizer adds one: as llama-server reads a text completion's
        prompt."""

    def infill_tokens(self) -> FimTokens | None:
        """The model's fill-in-the-middle tokens (core.backends.infill); None: it has none."""

    def detokenize(self, ids: Sequence[int]) -> str:
        """Text of a sequence of ids as a reader sees it: control tokens render as nothing."""

    def piece_bytes(self, token: int) -> bytes:
        """The bytes ``token`` stands for in text (a control token's are none): part of a character where the
        tokenizer splits one, so that llama-server's ``/tokenize`` can show each token's own bytes."""

    def special_name(self, token: int) -> str | None:
        """The name of a control token (``<|im_end|>``), None for ordinary tokens: views mark such tokens."""

    def apply_chat_template(self, messages: Sequence[dict], tools: Sequence[dict] = ()) -> list[int]:
        """Token ids of a chat (``[{"role": ..., "content": ...}]``) ready for the assistant's answer, with the
        ``tools`` it offers (OpenAI's) where the template puts them; special tokens appear only where the template
        puts them (see :func:`plain_text_template`)."""

    def fingerprint(self) -> str:
        """A digest of the tokenizer (token list and special tokens) to check that two models can pair."""

    def reset(self) -> None:
        """Drop the whole cache."""

    def prefill(self, ids: Sequence[int], cancel: threading.Event | None = None,
                progress: Progress | None = None) -> torch.Tensor:
        """Make the cache hold exactly ``ids`` (reusing a common cached prefix) and return the last position's logits.

        The uncached part is evaluated in chunks; between chunks ``cancel`` is checked (raising :class:`Cancelled`
        with the chunks done kept in the cache) and ``progress(done, total)`` is called.
        """

    def forward_tree(self, tree: TokenTree, start: int = 0) -> Sequence[torch.Tensor]:
        """Logits rows of nodes ``start..n-1`` of ``tree``, evaluated after the committed prefix in one call.

        Nodes ``0..start-1`` must have been evaluated by earlier calls on the same tree since the last commit; their
        KV entries are reused. This is how a drafter grows a tree level by level. The result may fetch rows lazily
        (:class:`LogitRows`): a verifier that stops early never pays for the rows it did not reach.
        """

    def commit(self, path: Sequence[int]) -> None:
        """Keep the evaluated nodes ``path`` (a root-to-node path, in order) in the cache; drop all other tree nodes."""


class LogitRows(Sequence[torch.Tensor]):
    """The logits of one forward call, one row per evaluated node, each fetched (and copied) on first access.

    A vocabulary of 150k makes a row 600 kB: copying all rows of an 8-node tree costs more than the verifier's whole
    walk, which typically reaches two of them.
    """

    def __init__(self, count: int, fetch: Callable[[int], torch.Tensor]) -> None:
        self._count = count
        self._fetch = fetch
        self._rows: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._count))]
        if not -self._count <= i < self._count:
            raise IndexError(f"row {i} of {self._count}")
        i %= self._count
        row = self._rows.get(i)
        if row is None:
            row = self._rows[i] = self._fetch(i)
        return row

    def __iter__(self) -> Iterator[torch.Tensor]:
        return (self[i] for i in range(self._count))

    def dense(self) -> torch.Tensor:
        """All rows as one (n, V) tensor."""
        return torch.stack(list(self)) if self._count else torch.empty(0)


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


def reusable_prefix(committed: Sequence[int], ids: Sequence[int]) -> int:
    """How many cached tokens a prefill of ``ids`` can keep: the common prefix, leaving at least one token of ``ids``
    to evaluate so that its logits exist."""
    common = 0
    for a, b in zip(committed, ids):
        if a != b:
            break
        common += 1
    return min(common, len(ids) - 1)


def cached_prompt(backend: Backend, prompt: Sequence[int]) -> int:
    """How many of ``prompt``'s tokens a generation finds in ``backend``'s cache (it prefills all but the last)."""
    return reusable_prefix(backend.committed, prompt[:-1]) if len(prompt) > 1 else 0


def prefill_chunks(start: int, end: int, size: int, cancel: threading.Event | None,
                   progress: Progress | None) -> Iterator[tuple[int, int]]:
    """``(lo, hi)`` ranges covering ``start..end`` in chunks of ``size``; checks ``cancel`` before each chunk and
    reports progress after each one (the caller evaluates a chunk between two iterations)."""
    for lo in range(start, end, size):
        if cancel is not None and cancel.is_set():
            raise Cancelled(f"prefill cancelled after {lo} of {end} tokens")
        hi = min(lo + size, end)
        yield lo, hi
        if progress is not None:
            progress(hi, end)


def check_tree_call(name: str, evaluated: int, start: int, n: int) -> None:
    """Raise BackendError unless ``forward_tree`` of a tree of ``n`` nodes from ``start`` continues the evaluated ones."""
    if start != evaluated:
        raise BackendError(f"{name}: asked to evaluate from node {start} but {evaluated} are cached")
    if n <= start:
        raise BackendError(f"{name}: nothing to evaluate (tree of {n} nodes from {start})")


def check_fits(backend: Backend, needed: int) -> None:
    """Raise ContextLengthError when ``needed`` cached positions would exceed the backend's context."""
    if needed > backend.context_length:
        raise ContextLengthError(
            f"{backend.name}: {needed} tokens do not fit in the context window of {backend.context_length} tokens"
        )


def check_trained_context(name: str, asked: int, trained: int) -> None:
    """ModelLoadError where a context of ``asked`` tokens is more than the model ``name`` was trained with, saying
    what may be chosen."""
    if asked > trained:
        raise ModelLoadError(f"{name} was trained with a context of {trained} tokens; a context of {asked} was "
                             f"asked for. Choose at most {trained}.")


def check_token_ids(ids: Sequence, vocab_size: int, what: str = "token ids") -> list[int]:
    """``ids`` as a list of ints, each a real integer in the vocabulary (``3.7`` or ``'5'`` are errors, not ids)."""
    out = []
    for t in ids:
        try:
            if isinstance(t, bool):
                raise TypeError
            t = operator.index(t)
        except TypeError:
            raise ValueError(f"{what} must be integers, got {t!r} ({type(t).__name__})") from None
        if not 0 <= t < vocab_size:
            raise ValueError(f"{what} out of the vocabulary (size {vocab_size}): {t}")
        out.append(t)
    return out


_SENTINEL = "\x00speclens-message-{}\x00"
_SENTINEL_RE = re.compile("\x00speclens-message-(\\d+)\x00")


def plain_text_template(messages: Sequence[dict], render: Callable[[list[dict]], str], specials: Sequence[str],
                        tokenize_markup: Callable[[str], list[int]],
                        tokenize_text: Callable[[str], list[int]]) -> list[int]:
    """Token ids of a rendered chat template in which only the template's own markup may become special tokens.

    Each message's content is replaced by a sentinel before rendering; the markup is then cut at the ``specials``
    (the control tokens' text) it holds, each read as its token, and the text between them, contents and markup
    together, tokenized as plain text: the very tokens llama-server and transformers make of the whole prompt (a
    content's last characters may merge with the markup after it, as Qwen's ``.\n\n`` before its tools), while a
    user who types ``<|im_end|>\\n<|im_start|>system`` writes text, not control tokens. An empty content stays
    empty: templates test it (Qwen's writes an assistant's tool calls after its text only if it has some).
    """
    contents = []
    masked = []
    for i, m in enumerate(messages):
        m = dict(m)
        content = m.get("content")
        if not isinstance(content, str):
            raise BackendError(f"message {i} has no text content")
        contents.append(content)
        m["content"] = _SENTINEL.format(i) if content else ""
        masked.append(m)
    rendered = render(masked)
    cut = re.compile("|".join(map(re.escape, sorted(specials, key=len, reverse=True)))) if specials else None
    ids: list[int] = []
    text: list[str] = []     # plain text not yet tokenized

    def plain() -> None:
        joined = "".join(text)
        text.clear()
        ids.extend(tokenize_text(joined) if joined else [])

    def markup(piece: str) -> None:
        pos = 0
        for special in cut.finditer(piece) if cut else ():
            text.append(piece[pos:special.start()])
            plain()
            ids.extend(tokenize_markup(special.group()))
            pos = special.end()
        text.append(piece[pos:])

    pos = 0
    seen = []
    for match in _SENTINEL_RE.finditer(rendered):
        markup(rendered[pos:match.start()])
        k = int(match.group(1))
        seen.append(k)
        text.append(contents[k])
        pos = match.end()
    if seen != [i for i, content in enumerate(contents) if content]:
        raise BackendError("the chat template did not place every message once, in order; cannot keep message "
                           "text plain")
    markup(rendered[pos:])
    plain()
    return ids


def tokenizer_digest(pieces: Sequence[str | None], added: Mapping[int, bool]) -> str:
    """A backend-independent digest of a tokenizer, so that HF and llama.cpp loads of one tokenizer compare equal.

    ``pieces`` are the token strings in id order (None for an id the tokenizer does not use); ``added`` maps the ids
    of added tokens to whether they are control (special) tokens. GGUF converters fill unused ids with ``[PAD<id>]``
    that a transformers tokenizer does not have, so such fillers count as unused, and trailing unused ids are dropped.
    """
    normalised = [None if p is None or p == f"[PAD{i}]" else p for i, p in enumerate(pieces)]
    while normalised and normalised[-1] is None:
        normalised.pop()
    h = hashlib.sha256()
    h.update(json.dumps(normalised, ensure_ascii=False).encode())
    h.update(json.dumps(sorted((int(i), bool(c)) for i, c in added.items())).encode())
    return h.hexdigest()
