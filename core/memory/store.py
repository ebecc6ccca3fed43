"""Where memory lives on disk: one file per tokenizer fingerprint and one statistics file, all written atomically.

The folder is ``SPECLENS_MEMORY_DIR``, else ``memory`` in the data folder (``SPECLENS_DATA_DIR``, else platformdirs'
user data folder). An absent file is an empty memory. A memory file that cannot be read (corrupt, truncated, larger
than the memory's limit, or another tokenizer's) gives an empty memory and a ``notice``; the statistics and the other
tokenizers' files are left alone, and the bad file is replaced at the next save.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np

from core import paths
from core.memory.documents import DEFAULT_MAX_BYTES, MemorySnapshot, MemoryState, SuffixMemory
from core.memory.index import SEP, CorpusIndex
from core.memory.stats import MemoryStats

log = logging.getLogger(__name__)

MEMORY_DIR_ENV = "SPECLENS_MEMORY_DIR"
STATS_FILE = "stats.json"
FORMAT = 1
FILE_SLACK = 64 * 1024    # zip headers and metadata a file may hold beyond the memory's own bytes


class CorruptMemoryError(ValueError):
    """A memory or statistics file that cannot be used."""


def memory_dir() -> Path:
    """``SPECLENS_MEMORY_DIR``, else the ``memory`` folder of the user data folder (core.paths)."""
    override = os.environ.get(MEMORY_DIR_ENV)
    return Path(override) if override else paths.data_dir() / "memory"


def _digest(fingerprint: str) -> str:
    return hashlib.sha256(fingerprint.encode()).hexdigest()[:16]


def memory_path(folder: Path, fingerprint: str) -> Path:
    return folder / f"{_digest(fingerprint)}.npz"


def _atomic_write(path: Path, write: Callable) -> None:
    """``write(file)`` into a temporary file beside ``path``, then rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_state(path: Path, fingerprint: str, state: MemoryState) -> None:
    meta = {"format": FORMAT, "fingerprint": fingerprint, "keys": list(state.keys), "sources": list(state.sources),
            "samplings": list(state.samplings), "clock": state.clock, "next_uid": state.next_uid}
    arrays = {"text": state.index.text, "order": state.index.order, "starts": state.index.starts,
              "uids": state.uids, "stamps": state.stamps, "probs": state.index.probs,
              "meta": np.frombuffer(json.dumps(meta).encode(), np.uint8)}
    _atomic_write(path, lambda f: np.savez(f, **arrays))


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise CorruptMemoryError(what)


def read_state(path: Path, fingerprint: str, max_bytes: int) -> MemoryState:
    """The state stored at ``path``; raises CorruptMemoryError when it cannot be trusted. A file written before
    probabilities were recorded has none."""
    size = path.stat().st_size
    _check(size <= max_bytes + FILE_SLACK, f"it holds {size} bytes, more than the memory limit of {max_bytes}")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in ("text", "order", "starts", "uids", "stamps", "meta")}
            probs = data["probs"] if "probs" in data.files else np.zeros(len(arrays["text"]), np.uint8)
        meta = json.loads(arrays.pop("meta").tobytes().decode())
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise CorruptMemoryError(f"it cannot be read ({exc.__class__.__name__}: {exc})") from None
    text, order, starts, uids, stamps = (arrays[k] for k in ("text", "order", "starts", "uids", "stamps"))
    _check(isinstance(meta, dict) and meta.get("format") == FORMAT, "its format is unknown")
    _check(meta.get("fingerprint") == fingerprint, "it belongs to another tokenizer")
    _check(text.dtype == np.int32 and order.dtype == np.int32 and text.ndim == order.ndim == 1, "bad arrays")
    _check(all(a.dtype == np.int64 and a.ndim == 1 for a in (starts, uids, stamps)), "bad document arrays")
    seps = np.flatnonzero(text == SEP)
    docs = len(starts)
    _check(len(text) > 0 and text[0] == SEP and text[-1] == SEP and int(text.min()) >= SEP, "bad text")
    _check(len(seps) == docs + 1 and np.array_equal(starts, seps[:-1] + 1) and bool(np.all(np.diff(seps) > 1)),
           "document boundaries do not match")
    _check(probs.dtype == np.uint8 and probs.shape == text.shape, "bad recorded probabilities")
    keys, sources = meta.get("keys"), meta.get("sources")
    samplings = meta.get("samplings", [""] * docs)
    _check(isinstance(keys, list) and isinstance(sources, list) and len(uids) == len(stamps) == len(keys)
           == len(sources) == docs, "document lists disagree")
    _check(isinstance(samplings, list) and len(samplings) == docs and all(isinstance(d, str) for d in samplings),
           "bad sampling settings")
    _check(all(k is None or isinstance(k, str) for k in keys) and all(isinstance(s, str) for s in sources),
           "bad document labels")
    _check(len(order) == len(text) - 2 * docs - 1, "the suffix array has the wrong length")
    if len(order):
        _check(int(order.min()) > 0 and int(order.max()) < len(text) - 1, "the suffix array points outside")
        _check(bool(np.all(text[order] >= 0) and np.all(text[order + 1] >= 0)), "the suffix array points at ends")
    clock, next_uid = meta.get("clock"), meta.get("next_uid")
    _check(isinstance(clock, int) and isinstance(next_uid, int), "bad counters")
    return MemoryState(CorpusIndex(text, order, starts, probs), uids, stamps, tuple(keys), tuple(sources), clock,
                       next_uid, tuple(samplings))


def read_stats(folder: Path, fingerprint: str) -> MemoryStats:
    """This tokenizer's statistics (fresh ones when the file or entry is absent); CorruptMemoryError if unreadable."""
    path = folder / STATS_FILE
    if not path.exists():
        return MemoryStats()
    try:
        entry = json.loads(path.read_text(encoding="utf-8")).get(_digest(fingerprint))
    except (OSError, ValueError, AttributeError) as exc:
        raise CorruptMemoryError(f"{path.name} cannot be read ({exc})") from None
    try:
        return MemoryStats.from_dict(entry) if entry is not None else MemoryStats()
    except ValueError as exc:
        raise CorruptMemoryError(str(exc)) from None


def write_stats(folder: Path, fingerprint: str, stats: MemoryStats) -> None:
    """Replace this tokenizer's entry in the statistics file, keeping the others' (unless the file is unreadable)."""
    path = folder / STATS_FILE
    entries: dict = {}
    if path.exists():
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
            entries = loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError):
            log.warning("replacing the unreadable memory statistics file %s", path)
    entries[_digest(fingerprint)] = stats.to_dict()
    _atomic_write(path, lambda f: f.write(json.dumps(entries, indent=1).encode()))


def _signature(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size


_open: dict[tuple, tuple[SuffixMemory, tuple[int, int] | None]] = {}
_open_lock = threading.Lock()


def open_memory(fingerprint: str, folder: str | Path | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
                read_only: bool = False) -> SuffixMemory:
    """The memory of ``fingerprint`` in ``folder`` (default :func:`memory_dir`).

    Opening again while the file is unchanged returns the same object (with whatever it learned since). A
    ``read_only`` memory learns in the process but never writes; :meth:`SuffixMemory.snapshot` / ``restore`` undo
    what it learned.
    """
    folder = Path(folder) if folder is not None else memory_dir()
    path = memory_path(folder, fingerprint)
    key = (str(folder.resolve()), fingerprint, max_bytes, read_only)
    with _open_lock:
        cached = _open.get(key)
        if cached is not None and cached[1] == _signature(path):
            return cached[0]
        notices = []
        state = None
        if path.exists():
            try:
                state = read_state(path, fingerprint, max_bytes)
            except (CorruptMemoryError, OSError) as exc:
                notices.append(f"The memory of earlier texts ({path}) was unusable and starts empty: {exc}.")
        try:
            stats = read_stats(folder, fingerprint)
        except CorruptMemoryError as exc:
            notices.append(f"The memory's acceptance statistics were unusable and start afresh: {exc}.")
            stats = MemoryStats()
        for notice in notices:
            log.warning(notice)

        def persist(snapshot: MemorySnapshot, documents_changed: bool) -> None:
            if documents_changed:
                write_state(path, fingerprint, snapshot.state)
            write_stats(folder, fingerprint, snapshot.stats)
            with _open_lock:
                _open[key] = (memory, _signature(path))

        memory = SuffixMemory(fingerprint, max_bytes, state, stats, " ".join(notices) or None,
                              None if read_only else persist)
        _open[key] = (memory, _signature(path))
        return memory
