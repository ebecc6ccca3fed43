"""Which device a model runs on, the precision it computes in there, and out-of-memory as an error a user can act on.

Device names are torch's (``cpu``, ``cuda``, ``cuda:1``, ``mps``), so every backend reports ``cuda`` when a model
runs on an NVIDIA GPU.
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator

import torch

from core.backends.base import BackendError, ModelLoadError

log = logging.getLogger(__name__)

DEVICE_KINDS = ("cpu", "cuda", "mps")
# how torch's allocators word running out (CUDA's caching allocator; the CPU allocator's enforce message)
OOM_PHRASES = ("out of memory", "not enough memory", "can't allocate memory")

# what to do, told with an OutOfMemory error
LOAD_ADVICE = "choose a smaller model pair, the cpu device, or a shorter context, or close other programs using it"
DECODE_ADVICE = ("the chat is kept; continue in a new chat, shorten the conversation, choose a smaller tree "
                 "(strategy) or a smaller model pair")


class OutOfMemory(BackendError):
    """A device ran out of memory while loading or running a model; the message says what to do."""


def default_device() -> str:
    """CUDA when torch sees a GPU, else the CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_device(name: str | None) -> str:
    """``name`` as torch spells it, checked to exist on this machine; None picks :func:`default_device`.

    Raises ModelLoadError for a device that is missing here or a name torch does not know.
    """
    if name is None:
        return default_device()
    text = str(name).strip().lower()
    kind, _, index = text.partition(":")
    if kind not in DEVICE_KINDS or (index and (kind != "cuda" or not index.isdigit())):
        raise ModelLoadError(f"unknown device {name!r}; choose one of {', '.join(DEVICE_KINDS)} (or cuda:N)")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(
                f"device {text!r} was asked for but torch sees no GPU (CUDA unavailable): install a CUDA build of "
                "torch (https://pytorch.org/get-started/locally/) and an NVIDIA driver, or choose the cpu device")
        count = torch.cuda.device_count()
        if index and int(index) >= count:
            raise ModelLoadError(f"device {text!r} was asked for but torch sees {count} GPU(s) (cuda:0 to "
                                 f"cuda:{count - 1})")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ModelLoadError("device 'mps' was asked for but torch sees no Apple GPU (MPS unavailable): choose cpu")
    return text


def default_dtype(device: str) -> torch.dtype:
    """The precision weights are kept in on ``device``: bfloat16 on CUDA (float16 where the GPU lacks bfloat16),
    float16 on MPS, float32 on the CPU (bfloat16 matmuls are several times slower than float32 on most CPUs)."""
    kind = device.partition(":")[0]
    if kind == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if kind == "mps":
        return torch.float16
    return torch.float32


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is torch running out of memory (CUDA's own error, or an allocator's RuntimeError)."""
    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(phrase in text for phrase in OOM_PHRASES)


@contextmanager
def out_of_memory_as_error(what: str, device: str, advice: str) -> Iterator[None]:
    """Turn running out of memory inside the block into :class:`OutOfMemory` saying ``what`` failed and ``advice``.

    The GPU's cached blocks are released so that the program can go on (a smaller model, a shorter chat).
    """
    try:
        yield
    except Exception as exc:
        if isinstance(exc, OutOfMemory) or not is_out_of_memory(exc):
            raise
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        log.warning("out of memory on %s while %s: %s", device, what, exc)
        raise OutOfMemory(f"out of memory on {device} while {what}: {advice}") from exc
