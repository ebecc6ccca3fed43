"""llama.cpp backend over llama-cpp-python's low-level API: a whole token tree evaluated in one ``llama_decode``.

How a tree fits in one batch: the KV cache is unified (one cell pool shared by all sequences) and every cell carries a
set of sequence ids. Sequence 0 holds the committed tokens. Each leaf of the tree gets a sequence of its own, which
is first made to cover the committed prefix and the already-cached ancestors (``llama_memory_seq_cp``, then
``llama_memory_seq_rm`` of whatever lies deeper), and every tree node carries the sequences of all leaves below it.
A token attends to the cells sharing its sequence at positions up to its own, which is exactly the committed prefix
plus its ancestors: tree attention without a mask. ``commit`` keeps the accepted path's sequence only
(``llama_memory_seq_keep``), cuts it after the path and hands it back to sequence 0.
"""
from __future__ import annotations

import collections
import ctypes
import os
import threading
from functools import cached_property
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from core.backends.base import (
    BackendError, Cancelled, LogitRows, ModelLoadError, Progress, check_fits, check_trained_context, check_tree_call,
    plain_text_template, prefill_chunks, reusable_prefix, tokenizer_digest,
)
from core.backends.files import kind_of
from core.backends.infill import FimTokens
from core.backends.kquant_kernels import ORDERED, llama_cpp_build
from core.backends.weight_buffers import weight_buffers
from core.tree import TokenTree

DEFAULT_CONTEXT = 4096
SEQ_MAX = 64                  # sequence ids per context: the committed one plus one per leaf of a tree
MAX_TREE_LEAVES = SEQ_MAX - 1
# Tokens per prefill call. Measured on a 2-core Xeon, default pair, a 2,277-token prompt: 22.9 s in calls of 64, 20.9
# in 128, 20.7-20.8 in 256 and 512 (llama-server, 512 at a time: 21.5). Stop does not wait for a call to end: llama.cpp's
# abort callback ends one between two operations of its graph (an AMX Xeon: 256 tokens take over 2 s).
PREFILL_CHUNK = 256
GGUF_MAGIC = b"GGUF"
_COMMITTED_SEQ = 0

# llama.cpp logs through one global callback; keep its recent lines to explain a failure instead of printing them
_LOG_LINES: collections.deque[str] = collections.deque(maxlen=40)
_LOG_CALLBACK = None


def _install_log_capture() -> None:
    global _LOG_CALLBACK
    if _LOG_CALLBACK is not None:
        return
    import llama_cpp

    @llama_cpp.llama_log_callback
    def capture(level: int, text: bytes, user_data) -> None:
        _LOG_LINES.append(text.decode("utf-8", errors="replace"))

    _LOG_CALLBACK = capture
    llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()


def _log_errors() -> str:
    """The recent llama.cpp log lines that look like errors, joined, for an error message."""
    lines = [ln.strip() for ln in _LOG_LINES if "error" in ln.lower() or "failed" in ln.lower()]
    return "; ".join(dict.fromkeys(ln for ln in lines if ln))[-600:]


def available_cores() -> int:
    """CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def check_gguf_file(path: str | Path) -> Path:
    """Raise ModelLoadError unless ``path`` is an existing file that starts like a GGUF file; return it as a Path."""
    path = Path(path).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model file {path} does not exist")
    if not path.is_file():
        raise ModelLoadError(f"{path} is {kind_of(path)}, not a GGUF model file")
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise ModelLoadError(f"cannot read the model file {path}: {exc.strerror or exc}") from None
    if magic != GGUF_MAGIC:
        raise ModelLoadError(f"{path} is not a GGUF model file (it does not start with the GGUF signature)")
    return path


@dataclass(frozen=True)
class ContextTuning:
    """Context settings a planner may measure and pick (None: llama.cpp's default)."""

    flash_attn: bool | None = None
    n_threads_batch: int | None = None
    n_ubatch: int | None = None

    def describe(self) -> str:
        parts = [f"flash attention {'on' if self.flash_attn else 'off' if self.flash_attn is False else 'auto'}"]
        if self.n_threads_batch:
            parts.append(f"{self.n_threads_batch} batch threads")
        if self.n_ubatch:
            parts.append(f"micro-batch {self.n_ubatch}")
        return ", ".join(parts)


class LlamaCppBackend:
    """One GGUF model in llama.cpp, implementing the Backend protocol (see core/backends/base.py).

    ``n_ctx=None`` takes the smaller of 4096 and the model's training context, ``n_ctx=0`` the training context;
    asking for more than the training context is a ModelLoadError. ``n_threads`` defaults to every core this process
    may use. ``n_seq_max`` bounds the leaves of one tree (one sequence each, plus the committed one). ``n_batch``
    bounds the nodes of one call. ``precise=True`` keeps K/V in float32 and turns flash attention off: logits then
    depend on the batch shape by about 2e-5 instead of about 2e-3 (tests use it to check the cache logic tightly), at
    some speed and memory.
    """

    def __init__(self, model_path: str | Path, n_ctx: int | None = DEFAULT_CONTEXT, n_threads: int | None = None,
                 n_seq_max: int = SEQ_MAX, n_batch: int = 512, device: str | None = None, name: str | None = None,
                 precise: bool = False) -> None:
        import llama_cpp

        self._lib = llama_cpp
        # SpecLens's build keeps the committed cells in position order after a tree step (native/llama.cpp)
        self._compact = getattr(llama_cpp.llama_cpp._lib, ORDERED, None)
        if self._compact is not None:
            self._compact.argtypes, self._compact.restype = [ctypes.c_void_p, ctypes.c_int32], ctypes.c_bool
        self._model = self._ctx = self._batch = None
        path = check_gguf_file(model_path)
        _install_log_capture()
        gpu = llama_cpp.llama_supports_gpu_offload() and device not in ("cpu",)
        if device not in (None, "cpu") and not gpu:
            raise ModelLoadError(f"this llama-cpp-python build runs on the CPU only; device {device!r} is unavailable")
        self.device = "gpu" if gpu else "cpu"
        self.name = name or path.name
        self.path = path
        self.build = llama_cpp_build()       # plans are measured per build (core/auto/plan.py)

        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = -1 if gpu else 0
        self.weight_buffers = weight_buffers(path, gpu)
        self.weight_buffers.apply(mparams)
        _LOG_LINES.clear()
        self._model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
        if not self._model:
            detail = _log_errors() or "llama.cpp could not read it"
            raise ModelLoadError(f"cannot load {path}: the file is damaged, truncated or of an unsupported "
                                 f"architecture ({detail})")
        n_ctx_train = int(llama_cpp.llama_model_n_ctx_train(self._model))
        if n_ctx is None:
            n_ctx = min(DEFAULT_CONTEXT, n_ctx_train)
        elif n_ctx == 0:     # llama.cpp's own convention: the context the model was trained with
            n_ctx = n_ctx_train
        if not isinstance(n_ctx, int) or n_ctx < 8:
            self.close()
            raise ModelLoadError(f"context size must be an integer of at least 8 tokens, got {n_ctx!r}")
        try:
            check_trained_context(path.name, n_ctx, n_ctx_train)
        except ModelLoadError:
            self.close()
            raise
        threads = int(n_threads) if n_threads else available_cores()
        if threads < 1:
            self.close()
            raise ModelLoadError(f"n_threads must be at least 1, got {n_threads!r}")
        self.n_threads = threads
        self.n_seq_max = int(n_seq_max)
        self.n_batch = min(int(n_batch), n_ctx)
        self.prefill_chunk = min(PREFILL_CHUNK, self.n_batch)

        self._precise = precise
        self.context_length = n_ctx
        self.tuning = ContextTuning()
        self._make_context(self.tuning)
        self.n_ctx_train = n_ctx_train

        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.vocab_size = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self._attrs = [int(llama_cpp.llama_vocab_get_attr(self._vocab, i)) for i in range(self.vocab_size)]
        self.eos_ids = frozenset(self._eos_ids())
        self._pieces: dict[int, bytes] = {}
        self._fingerprint: str | None = None
        self.chat_template = self._meta("tokenizer.chat_template")
        self.reset()

    def _make_context(self, tuning: "ContextTuning") -> None:
        """(Re)create the llama.cpp context, its memory and its batch with ``tuning``; the cache starts empty."""
        lib = self._lib
        cparams = lib.llama_context_default_params()
        cparams.n_ctx = self.context_length
        cparams.n_batch = self.n_batch
        cparams.n_ubatch = min(tuning.n_ubatch or self.n_batch, self.n_batch)
        cparams.n_seq_max = self.n_seq_max
        cparams.n_threads = self.n_threads
        cparams.n_threads_batch = tuning.n_threads_batch or self.n_threads
        cparams.kv_unified = True  # several sequence ids per token need one shared cell pool
        cparams.no_perf = True
        if tuning.flash_attn is not None:
            cparams.flash_attn_type = (lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if tuning.flash_attn
                                       else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        if self._precise:
            cparams.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
            cparams.type_k = cparams.type_v = lib.GGML_TYPE_F32
        self._free_context()
        _LOG_LINES.clear()
        self._ctx = lib.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            detail = _log_errors() or "out of memory?"
            self.close()
            raise ModelLoadError(f"cannot create a llama.cpp context of {self.context_length} tokens for "
                                 f"{self.path.name} ({detail})")
        self._mem = lib.llama_get_memory(self._ctx)
        self._batch = lib.llama_batch_init(self.n_batch, 0, self.n_seq_max)
        self._decodes = 0
        self.tuning = tuning

    def retune(self, tuning: "ContextTuning") -> None:
        """Recreate the context with other settings that change speed but not what is computed (threads for
        batches, flash attention, micro-batch size); the cache is dropped."""
        if tuning != self.tuning:
            self._make_context(tuning)
            self.reset()

    # -- model facts -------------------------------------------------------------------------------------------
    def _meta(self, key: str) -> str | None:
        size = self._lib.llama_model_meta_val_str(self._model, key.encode(), None, 0)
        if size < 0:
            return None
        buf = ctypes.create_string_buffer(size + 1)
        self._lib.llama_model_meta_val_str(self._model, key.encode(), buf, size + 1)
        return buf.value.decode("utf-8", errors="replace")

    def _is_control(self, token: int) -> bool:
        # llama.cpp also tags some ordinary tokens that look like end markers (e.g. Qwen's "</s>") as control;
        # those keep their NORMAL bit, and a transformers tokenizer does not treat them as special
        attr = self._attrs[token]
        lib = self._lib
        return bool(attr & (lib.LLAMA_TOKEN_ATTR_CONTROL | lib.LLAMA_TOKEN_ATTR_UNKNOWN)) \
            and not attr & lib.LLAMA_TOKEN_ATTR_NORMAL

    def _eos_ids(self) -> set[int]:
        ids = {t for t in range(self.vocab_size)
               if self._lib.llama_vocab_is_eog(self._vocab, t) and self._is_control(t)}
        eos = int(self._lib.llama_vocab_eos(self._vocab))
        if eos >= 0:
            ids.add(eos)
        return ids

    # -- tokenizer ---------------------------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        """Token ids of plain ``text``: special-token text such as ``<|im_end|>`` stays text."""
        return self._tokenize(text, parse_special=False)

    def tokenize_special(self, text: str) -> list[int]:
        return self._tokenize(text, parse_special=True, add_special=True)

    def infill_tokens(self) -> FimTokens | None:
        # llama.cpp reads them from the GGUF, else recognises them by their spelling (core.backends.infill)
        lib = self._lib
        pre, suf, mid, repo, sep = (int(f(self._vocab)) for f in (
            lib.llama_vocab_fim_pre, lib.llama_vocab_fim_suf, lib.llama_vocab_fim_mid, lib.llama_vocab_fim_rep,
            lib.llama_vocab_fim_sep))
        if min(pre, suf, mid) < 0:
            return None
        bos = int(lib.llama_vocab_bos(self._vocab)) if lib.llama_vocab_get_add_bos(self._vocab) else -1
        return FimTokens(pre, suf, mid, *(t if t >= 0 else None for t in (repo, sep, bos)))

    def _tokenize(self, text: str, parse_special: bool, add_special: bool = False) -> list[int]:
        # lone surrogates cannot be UTF-8: they become U+FFFD rather than a UnicodeEncodeError
        data = text.encode("utf-8", errors="replace")
        cap = len(data) + 8
        buf = (self._lib.llama_token * cap)()
        n = self._lib.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (self._lib.llama_token * cap)()
            n = self._lib.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            raise BackendError(f"{self.name}: could not tokenize the text")
        return list(buf[:n])

    def piece_bytes(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            # special=False: a control token's piece is empty, so it never reaches a reader's text
            buf = ctypes.create_string_buffer(64)
            n = self._lib.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = self._lib.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
            piece = self._pieces[token] = buf.raw[:n]
        return piece

    def detokenize(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` as a reader sees it (control tokens render as nothing). Byte-level tokens are joined as
        bytes first, so a character split over tokens decodes whole; an incomplete character at the end shows as
        U+FFFD."""
        for t in ids:
            if not 0 <= int(t) < self.vocab_size:
                raise BackendError(f"{self.name}: token id {t} is outside the vocabulary of {self.vocab_size}")
        return b"".join(self.piece_bytes(int(t)) for t in ids).decode("utf-8", errors="replace")

    def special_name(self, token: int) -> str | None:
        return self._token_text(token) if self._is_control(token) else None

    def _token_text(self, token: int) -> str:
        return self._lib.llama_vocab_get_text(self._vocab, token).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: Sequence[dict], tools: Sequence[dict] = ()) -> list[int]:
        """The GGUF's own chat template (jinja2, rendered like llama-cpp-python and transformers), tokenized."""
        if not self.chat_template:
            raise BackendError(f"{self.name} has no chat template in its GGUF file")
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        special = {}
        for key, fn in (("eos_token", self._lib.llama_vocab_eos), ("bos_token", self._lib.llama_vocab_bos)):
            tok = int(fn(self._vocab))
            special[key] = self._token_text(tok) if tok >= 0 else ""
        formatter = Jinja2ChatFormatter(self.chat_template, add_generation_prompt=True, **special)
        return plain_text_template(messages, lambda masked: formatter(messages=masked, tools=list(tools) or None).prompt,
                                   self._control_texts, lambda markup: self._tokenize(markup, parse_special=True),
                                   self.tokenize)

    @cached_property
    def _control_texts(self) -> list[str]:
        return [self._token_text(t) for t in range(self.vocab_size) if self._is_control(t)]

    def fingerprint(self) -> str:
        """The backend-independent tokenizer digest (core.backends.base.tokenizer_digest)."""
        if self._fingerprint is None:
            lib = self._lib
            pieces = [None if self._attrs[i] & lib.LLAMA_TOKEN_ATTR_UNUSED else self._token_text(i)
                      for i in range(self.vocab_size)]
            added_mask = lib.LLAMA_TOKEN_ATTR_CONTROL | lib.LLAMA_TOKEN_ATTR_USER_DEFINED | lib.LLAMA_TOKEN_ATTR_UNKNOWN
            added = {i: self._is_control(i) for i, a in enumerate(self._attrs)
                     if a & added_mask and not a & lib.LLAMA_TOKEN_ATTR_NORMAL}
            self._fingerprint = tokenizer_digest(pieces, added)
        return self._fingerprint

    # -- cache -------------------------------------------------------------------------------------------------
    @property
    def committed(self) -> list[int]:
        return list(self._committed)

    def reset(self) -> None:
        self._lib.llama_memory_clear(self._mem, True)
        self._committed: list[int] = []
        self._clear_tree_state()

    def _clear_tree_state(self) -> None:
        self._tree: TokenTree | None = None
        self._evaluated = 0
        self._node_seqs: list[tuple[int, ...]] = []  # sequence ids carried by each evaluated node
        self._seq_end: dict[int, int] = {}           # branch sequence -> the deepest evaluated node on it

    def _decode(self, count: int, cancel: threading.Event | None = None) -> None:
        self._decodes += 1
        self._batch.n_tokens = count
        rc = self._lib.llama_decode(self._ctx, self._batch)
        if rc == 2 and cancel is not None and cancel.is_set():
            # stopped part way: whatever llama.cpp kept of this call goes, the committed prefix stays
            self._lib.llama_memory_seq_rm(self._mem, _COMMITTED_SEQ, len(self._committed), -1)
            raise Cancelled(f"{self.name}: stopped while reading the prompt")
        if rc != 0:
            reason = {1: "no room left in the KV cache", 2: "aborted"}.get(rc, _log_errors() or f"error {rc}")
            raise BackendError(f"{self.name}: llama_decode failed ({reason})")

    def _logits_row(self, decode_id: int, i: int) -> torch.Tensor:
        """Float32 logits of batch row ``i`` of decode number ``decode_id``, copied out of llama.cpp's buffer."""
        if decode_id != self._decodes:
            raise BackendError(f"{self.name}: logits of an earlier call were asked for after a later call")
        ptr = self._lib.llama_get_logits_ith(self._ctx, i)
        if not ptr:
            raise BackendError(f"{self.name}: llama.cpp returned no logits for batch row {i}")
        return torch.from_numpy(np.ctypeslib.as_array(ptr, shape=(self.vocab_size,)).copy())

    def _rows(self, count: int) -> LogitRows:
        return LogitRows(count, lambda i, d=self._decodes: self._logits_row(d, i))

    def prefill(self, ids: Sequence[int], cancel=None, progress: Progress | None = None) -> torch.Tensor:
        ids = [int(t) for t in ids]
        if not ids:
            raise BackendError("prefill needs at least one token")
        check_fits(self, len(ids))
        if self._evaluated:
            self.commit([])
        common = reusable_prefix(self._committed, ids)
        if common < len(self._committed):
            self._lib.llama_memory_seq_rm(self._mem, _COMMITTED_SEQ, common, -1)
            del self._committed[common:]
        # only the last position's logits are needed; chunks report progress, and Stop ends a chunk part way
        batch = self._batch
        with self._abortable(cancel):
            for lo, hi in prefill_chunks(common, len(ids), self.prefill_chunk, cancel, progress):
                for i, tok in enumerate(ids[lo:hi]):
                    batch.token[i] = tok
                    batch.pos[i] = lo + i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = _COMMITTED_SEQ
                    batch.logits[i] = lo + i == len(ids) - 1
                self._decode(hi - lo, cancel)
                self._committed += ids[lo:hi]
        return self._rows(hi - lo)[hi - lo - 1]

    @contextmanager
    def _abortable(self, cancel: threading.Event | None):
        """llama.cpp checks ``cancel`` between the operations of each call while the block runs (only then: the
        check is a call into Python, which a decode step need not pay)."""
        if cancel is None:
            yield
            return
        callback = self._lib.ggml_abort_callback(lambda _: cancel.is_set())
        self._lib.llama_set_abort_callback(self._ctx, callback, None)
        try:
            yield
        finally:
            self._lib.llama_set_abort_callback(self._ctx, self._lib.ggml_abort_callback(), None)

    def _branch_seq(self, parent: int, end: int, free: list[int], claimed: set[int]) -> int:
        """A sequence covering the committed prefix and ``parent``'s path (parent -1: the prefix alone).

        ``end`` is the first position after ``parent``, where the new branch's nodes start.
        """
        if parent >= 0:
            for seq in self._node_seqs[parent]:
                if self._seq_end.get(seq) == parent and seq not in claimed:
                    return seq  # parent ended a branch: its sequence extends as is
        if not free:
            raise BackendError(f"{self.name}: the tree has more leaves than the {self.n_seq_max - 1} sequences "
                               "this backend was created with (raise n_seq_max)")
        seq = free.pop()
        source = _COMMITTED_SEQ if parent < 0 else self._node_seqs[parent][0]
        self._lib.llama_memory_seq_cp(self._mem, source, seq, -1, -1)
        # the source may go deeper than parent (a branch, or a chain evaluated on the committed sequence itself);
        # llama.cpp also wants each sequence's new positions to follow its last cached one
        self._lib.llama_memory_seq_rm(self._mem, seq, end, -1)
        return seq

    def _assign_sequences(self, tree: TokenTree, start: int, prefix: int) -> dict[int, list[int]]:
        """Sequence ids for nodes ``start..n-1``: one per new leaf, carried by the leaf and its new ancestors."""
        n = len(tree)
        has_child = set(tree.parents)
        used = {_COMMITTED_SEQ} | set(self._seq_end)
        free = [s for s in range(self.n_seq_max - 1, -1, -1) if s not in used]
        seqs: dict[int, list[int]] = {u: [] for u in range(start, n)}
        claimed: set[int] = set()
        for leaf in (u for u in range(start, n) if u not in has_child):
            top = leaf
            while tree.parents[top] >= start:
                top = tree.parents[top]
            seq = self._branch_seq(tree.parents[top], prefix + tree.depths[top] - 1, free, claimed)
            claimed.add(seq)
            u = leaf
            while u >= start:
                seqs[u].append(seq)
                u = tree.parents[u]
            self._seq_end[seq] = leaf
        return seqs

    def forward_tree(self, tree: TokenTree, start: int = 0) -> torch.Tensor:
        n = len(tree)
        check_tree_call(self.name, self._evaluated, start, n)
        if n - start > self.n_batch:
            raise BackendError(f"{self.name}: {n - start} nodes in one call exceed the batch size of {self.n_batch}")
        prefix = len(self._committed)
        check_fits(self, prefix + n)  # every tree node takes one KV cell until the commit
        try:
            if start == 0 and tree.is_chain():
                # one path only (a plain step, a chain draft): it goes on the committed sequence itself, and a
                # commit just cuts its tail, as llama.cpp's own speculative loop does
                seqs = {u: [_COMMITTED_SEQ] for u in range(n)}
                self._seq_end[_COMMITTED_SEQ] = n - 1
            else:
                seqs = self._assign_sequences(tree, start, prefix)
            batch = self._batch
            for i, u in enumerate(range(start, n)):
                batch.token[i] = tree.tokens[u]
                batch.pos[i] = prefix + tree.depths[u] - 1
                batch.n_seq_id[i] = len(seqs[u])
                for k, seq in enumerate(seqs[u]):
                    batch.seq_id[i][k] = seq
                batch.logits[i] = True
            self._tree = tree
            self._decode(n - start)
        except BackendError:
            self.commit([])  # nothing of this tree is usable; the committed prefix stays intact
            raise
        self._node_seqs += [tuple(seqs[u]) for u in range(start, n)]
        self._evaluated = n
        return self._rows(n - start)

    def commit(self, path: Sequence[int]) -> None:
        path = [int(i) for i in path]
        tree = self._tree
        if any(not 0 <= i < self._evaluated for i in path):
            raise BackendError(f"{self.name}: commit of nodes {path} but only {self._evaluated} were evaluated")
        if tree is not None and any(tree.parents[v] != (path[k - 1] if k else -1) for k, v in enumerate(path)):
            raise BackendError(f"{self.name}: commit of nodes {path}, which is not a path from the root")
        lib, mem = self._lib, self._mem
        end = len(self._committed) + len(path)
        seq = self._node_seqs[path[-1]][0] if path else _COMMITTED_SEQ
        if seq == _COMMITTED_SEQ:
            # the path lies on the committed sequence: cut what follows it there, and drop every branch
            lib.llama_memory_seq_rm(mem, _COMMITTED_SEQ, end, -1)
            for other in self._seq_end:
                if other != _COMMITTED_SEQ:
                    lib.llama_memory_seq_rm(mem, other, -1, -1)
        else:
            lib.llama_memory_seq_keep(mem, seq)
            lib.llama_memory_seq_rm(mem, seq, end, -1)
            lib.llama_memory_seq_cp(mem, seq, _COMMITTED_SEQ, -1, -1)
            lib.llama_memory_seq_rm(mem, seq, -1, -1)
        if self._compact is not None and tree is not None and not tree.is_chain():
            # the path's cells move into the cells its other branches left, so later tokens follow it in order
            self._compact(self._ctx, _COMMITTED_SEQ)
        self._committed += [tree.tokens[i] for i in path]
        self._clear_tree_state()

    def _free_context(self) -> None:
        if self._batch is not None:
            self._lib.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            self._lib.llama_free(self._ctx)
            self._ctx = None

    def close(self) -> None:
        """Free the llama.cpp context and model now (also done when the backend is garbage-collected)."""
        self._free_context()
        if self._model:
            self._lib.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may already be gone
            pass
