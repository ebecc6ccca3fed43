"""Remembered documents (earlier conversations, earlier answers) for one tokenizer: bounded, least recently used out.

Token ids mean nothing across tokenizers, so a :class:`SuffixMemory` belongs to one tokenizer fingerprint. Its state
is immutable and replaced whole on every change: a drafting step reads one consistent state without locks, and a
snapshot is just a reference to it.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np

from core.memory.index import MAX_MATCH, CorpusIndex, recorded_bytes
from core.memory.stats import MemoryStats

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 64 * 2**20
PROMPT_TAIL = MAX_MATCH   # prompt tokens kept in front of a remembered answer: enough for a full-length match
RECENT_SCAN = 4096        # at most this many occurrences are ranked by recency (longest matches are rarely so many)
TOKEN_LIMIT = 2**31 - 1   # token ids are stored as int32
DOCUMENT_OVERHEAD = 64    # bytes of a document's start, id, stamp and label bookkeeping, in memory and on disk


def _document_bytes(length: int, key: str | None, source: str, sampling: str = "") -> int:
    """Bytes a document adds: its tokens and separator with their recorded probabilities, its suffix-array entries,
    its bookkeeping and labels."""
    return 5 * (length + 1) + 4 * max(length - 1, 0) + DOCUMENT_OVERHEAD + len(key or "") + len(source) + len(sampling)


@dataclass(frozen=True)
class MemoryState:
    """The documents (in corpus order) with their ids, last-use stamps, keys, sources and the sampling settings their
    recorded probabilities belong to, and the suffix index."""

    index: CorpusIndex = field(default_factory=CorpusIndex)
    uids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    stamps: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    keys: tuple[str | None, ...] = ()
    sources: tuple[str, ...] = ()
    clock: int = 0            # last stamp handed out
    next_uid: int = 0
    samplings: tuple[str, ...] | None = None   # per document a SamplingParams.distribution_key, "" when none recorded

    def __post_init__(self) -> None:
        if self.samplings is None:
            object.__setattr__(self, "samplings", ("",) * len(self.uids))

    @property
    def documents(self) -> int:
        return len(self.uids)

    @property
    def tokens(self) -> int:
        return len(self.index.text) - self.documents - 1

    @property
    def nbytes(self) -> int:
        return (self.index.text.nbytes + self.index.order.nbytes + self.index.probs.nbytes
                + self.documents * DOCUMENT_OVERHEAD
                + sum(len(k or "") + len(s) + len(d) for k, s, d in zip(self.keys, self.sources, self.samplings)))

    def recent(self, ends: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``limit`` most recent of the occurrence ends ``ends`` (documents used last first, then later in the
        document first) and the id of each one's document."""
        ends = ends[-RECENT_SCAN:]
        docs = self.index.document_of(ends)
        order = np.lexsort((-ends.astype(np.int64), -self.stamps[docs]))[:limit]
        return ends[order], self.uids[docs[order]]

    def recorded(self, ends: np.ndarray, depth: int, sampling: str) -> np.ndarray:
        """The recorded probabilities of the ``depth`` tokens after each end (CorpusIndex.recorded), 0 in the
        documents recorded under other sampling settings than ``sampling``: there the same token was drawn from
        another distribution."""
        out = self.index.recorded(ends, depth)
        other = np.array([d != sampling for d in self.samplings], bool)
        if len(other) and other.any():
            out[other[self.index.document_of(ends)]] = 0.0
        return out

    def without(self, drop: Sequence[int]) -> "MemoryState":
        keep = np.setdiff1d(np.arange(self.documents), np.asarray(drop, np.int64))
        return replace(self, index=self.index.without(drop), uids=self.uids[keep], stamps=self.stamps[keep],
                       keys=tuple(self.keys[i] for i in keep), sources=tuple(self.sources[i] for i in keep),
                       samplings=tuple(self.samplings[i] for i in keep))

    def evicted(self, max_bytes: int, keep_uid: int | None = None) -> "MemoryState":
        """Least recently used documents dropped until the state fits in ``max_bytes`` (never ``keep_uid``)."""
        excess = self.nbytes - max_bytes
        if excess <= 0:
            return self
        drop: list[int] = []
        for i in np.argsort(self.stamps, kind="stable").tolist():
            if excess <= 0:
                break
            if self.uids[i] == keep_uid:
                continue
            drop.append(i)
            excess -= _document_bytes(len(self.index.document(i)), self.keys[i], self.sources[i], self.samplings[i])
        return self.without(drop)


@dataclass(frozen=True)
class MemorySnapshot:
    """A memory as it was: :meth:`SuffixMemory.restore` brings it back (documents, recency and statistics)."""

    state: MemoryState
    stats: MemoryStats


class SuffixMemory:
    """The remembered documents of one tokenizer, their suffix index and the acceptance statistics of memory drafts.

    A remembered token costs 8 bytes (4 in the text, 4 in the suffix array), a document ``DOCUMENT_OVERHEAD`` more;
    ``max_bytes`` bounds their sum, evicting the least recently used documents.

    ``notice`` is a sentence for the user when something went wrong reading or writing the memory (else None).
    :func:`core.memory.store.open_memory` creates one from its folder, with ``persist(snapshot, documents_changed)``
    writing it there; ``SuffixMemory(fingerprint)`` is an empty memory that is never saved.
    """

    def __init__(self, fingerprint: str, max_bytes: int = DEFAULT_MAX_BYTES, state: MemoryState | None = None,
                 stats: MemoryStats | None = None, notice: str | None = None,
                 persist: Callable[[MemorySnapshot, bool], None] | None = None) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1024:
            raise ValueError(f"max_bytes must be an integer of at least 1024, got {max_bytes!r}")
        self.fingerprint = fingerprint
        self.max_bytes = max_bytes
        self.stats = stats if stats is not None else MemoryStats()
        self.notice = notice
        self._persist = persist
        self._lock = threading.Lock()
        self._state = (state if state is not None else MemoryState()).evicted(max_bytes)
        self._saved = state   # the state its file holds (None: no file yet)

    @property
    def state(self) -> MemoryState:
        """The current state; it never changes under a reader (changes replace it)."""
        return self._state

    @property
    def documents(self) -> int:
        return self._state.documents

    @property
    def tokens(self) -> int:
        return self._state.tokens

    @property
    def nbytes(self) -> int:
        return self._state.nbytes

    def add_document(self, tokens: Sequence[int], key: str | None = None, source: str = "answer",
                     probs: Sequence[float] = (), sampling: str = "") -> int:
        """Remember ``tokens``; returns the document's id. A document with the same ``key`` (e.g. a conversation
        that grew) is replaced. Least recently used documents are evicted to stay within ``max_bytes``.

        ``probs``, when given, holds the probability each of the last ``len(probs)`` tokens was drawn with from the
        sampling distribution of ``sampling`` (a SamplingParams.distribution_key): a copy of them drafted again under
        the same settings then knows which of its tokens were a toss-up."""
        doc = np.asarray(tokens)
        if doc.ndim != 1 or not len(doc) or doc.dtype.kind not in "iu":
            raise ValueError("a document must be a non-empty sequence of integer token ids")
        if int(doc.min()) < 0 or int(doc.max()) > TOKEN_LIMIT:
            raise ValueError(f"token ids must be in 0..{TOKEN_LIMIT}, got {int(doc.min())}..{int(doc.max())}")
        if not (key is None or isinstance(key, str)) or not isinstance(source, str):
            raise ValueError(f"a document's key must be a string or None and its source a string, got {key!r}, "
                             f"{source!r}")
        probs = np.asarray(probs, np.float64)
        if probs.ndim != 1 or len(probs) > len(doc) or not np.all((probs >= 0) & (probs <= 1)) or \
                not isinstance(sampling, str) or (len(probs) and not sampling):
            raise ValueError("recorded probabilities must be in [0, 1], at most one per token, and come with the "
                             "sampling settings they were drawn under")
        sampling = sampling if len(probs) else ""
        if _document_bytes(len(doc), key, source, sampling) + 4 > self.max_bytes:
            raise ValueError(f"a document of {len(doc)} tokens does not fit in a memory of {self.max_bytes} bytes")
        with self._lock:
            state = self._state
            if key is not None and key in state.keys:
                state = state.without([state.keys.index(key)])
            uid, clock = state.next_uid, state.clock + 1
            recorded = np.concatenate([np.zeros(len(doc) - len(probs), np.uint8), recorded_bytes(probs)])
            state = replace(state, index=state.index.appended(doc.astype(np.int32), recorded),
                            uids=np.append(state.uids, uid), stamps=np.append(state.stamps, clock),
                            keys=state.keys + (key,), sources=state.sources + (source,),
                            clock=clock, next_uid=uid + 1, samplings=state.samplings + (sampling,))
            self._state = state.evicted(self.max_bytes, keep_uid=uid)
        return uid

    def add_answer(self, prompt: Sequence[int], answer: Sequence[int], probs: Sequence[float] = (),
                   sampling: str = "") -> int | None:
        """Remember an answer behind the end of its prompt, so that the same prompt drafts it next time
        (Regenerate), with the probability each token was drawn with under ``sampling`` when given
        (:meth:`add_document`). Nothing is stored for an empty answer."""
        if not len(answer):
            return None
        if len(probs) and len(probs) != len(answer):
            raise ValueError(f"{len(probs)} recorded probabilities for an answer of {len(answer)} tokens")
        return self.add_document(list(prompt[-PROMPT_TAIL:]) + list(answer), source="answer", probs=probs,
                                 sampling=sampling)

    def touch(self, uids: set[int] | Sequence[int]) -> None:
        """Mark documents as just used (they supplied an accepted draft): the last to be evicted."""
        with self._lock:
            state = self._state
            hit = np.isin(state.uids, np.fromiter(uids, np.int64))
            if hit.any():
                stamps = state.stamps.copy()
                stamps[hit] = state.clock + 1
                self._state = replace(state, stamps=stamps, clock=state.clock + 1)

    def snapshot(self) -> MemorySnapshot:
        return MemorySnapshot(self._state, self.stats.copy())

    def restore(self, snapshot: MemorySnapshot) -> None:
        """Back to ``snapshot``: what was learned since is forgotten (benchmarks repeat runs from one memory)."""
        with self._lock:
            self._state = snapshot.state
            self.stats = snapshot.stats.copy()

    def save(self) -> bool:
        """Write the memory and its statistics to its folder (atomically). False when this memory has no folder or
        is read-only, or when writing failed (then ``notice`` says why)."""
        if self._persist is None:
            return False
        snapshot = self.snapshot()
        try:
            self._persist(snapshot, snapshot.state is not self._saved)
        except OSError as exc:
            self.notice = f"Could not save the memory of earlier texts: {exc}"
            log.warning(self.notice)
            return False
        self._saved = snapshot.state
        return True
