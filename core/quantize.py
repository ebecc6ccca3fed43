"""Re-quantising a draft GGUF once into the cache, to a weight type this CPU computes faster.

Only the draft model is ever re-quantised: its distribution changes a little, which changes acceptance but never
the output (every drafted token carries the q it was drawn from). The target is never touched. llama.cpp repacks
Q4_0 weights for AVX2 and ARM at load time, which makes them the fastest type on most CPUs.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from core.assembly import cache_dir
from core.backends.base import ModelLoadError
from core.backends.llamacpp import check_gguf_file

TYPES = {"Q4_0": 2, "Q8_0": 7}   # llama.cpp's LLAMA_FTYPE_MOSTLY_* values


def quantized_path(source: Path, kind: str) -> Path:
    """Where the ``kind`` copy of ``source`` is cached (keyed by the source's path, size and mtime)."""
    st = source.stat()
    key = hashlib.sha256(f"{source.resolve()}:{st.st_size}:{st.st_mtime_ns}:{kind}".encode()).hexdigest()[:16]
    return cache_dir() / "quantized" / f"{source.stem}-{kind.lower()}-{key}.gguf"


def requantized(source: str | Path, kind: str = "Q4_0", threads: int | None = None) -> Path:
    """The cached ``kind`` copy of the GGUF ``source``, made now if missing (a temporary name, renamed when done)."""
    import llama_cpp

    if kind not in TYPES:
        raise ValueError(f"unknown weight type {kind!r}; choose one of {', '.join(TYPES)}")
    source = check_gguf_file(source)
    out = quantized_path(source, kind)
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".{os.getpid()}.partial")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = TYPES[kind]
    params.allow_requantize = True   # the source is already quantised
    params.nthread = threads or 0
    try:
        rc = llama_cpp.llama_model_quantize(str(source).encode(), str(tmp).encode(), params)
        if rc != 0:
            raise ModelLoadError(f"llama.cpp could not re-quantise {source.name} to {kind} (error {rc})")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out
