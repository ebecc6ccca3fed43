"""Where llama.cpp keeps a GGUF's weights on this CPU.

ggml can hold weights in "extra" buffers laid out for its fastest CPU kernels. CPU_REPACK interleaves the rows of
Q4_0 and Q4_K matrices eight at a time for AVX2. That makes a batch of tokens much cheaper, which is what
verification is: on this project's 2-core Xeon, a target call on 4 tokens cost 2.3 plain steps in plain buffers
and 1.5 repacked, one on 8 tokens 3.9 and 2.7, and a step of the Q4_0 draft 15-25 % less. The AMX buffers use
Intel's matrix tiles, but with them every decode of a quantized model dies of an illegal instruction on those
machines (llama.cpp issue #20824). llama.cpp has one switch for both kinds (``use_extra_bufts``). So on an AMX CPU
the extra buffers are switched off and the tensors CPU_REPACK takes are given to it by name, through llama.cpp's
tensor buffer overrides. On every other CPU, and when the weights go to a GPU, llama.cpp chooses as usual.
"""
from __future__ import annotations

import ctypes
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from gguf import GGMLQuantizationType

from core.backends.gguf_tensors import read_tensor_infos
from core.backends.kquant_kernels import has_speclens_kernels

log = logging.getLogger(__name__)

# What ggml's x86 repack interleaves eight rows at a time (every AMX CPU has the AVX2 it needs). A tensor handed to
# CPU_REPACK that it cannot interleave crashes the load, so the list is kept to types known to work here.
REPACKED_TYPES = frozenset({GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_K})
# and what it interleaves on x86 only in a build with SpecLens's kernels (native/llama.cpp)
SPECLENS_REPACKED_TYPES = frozenset({GGMLQuantizationType.Q6_K})
INTERLEAVE = 8
ROW_LOOKUP = frozenset({"token_embd.weight"})   # read by row lookup (get_rows), which repacked rows do not serve


def has_amx() -> bool:
    """Whether the CPU has Intel AMX."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " amx_int8" in line for line in f)
    except OSError:
        return False


def repackable_tensors(path: str | Path) -> list[str]:
    """The tensors of the GGUF at ``path`` that CPU_REPACK takes: matrices of a repacked type whose row count is a
    multiple of the interleave. A file the reader cannot parse has none: llama.cpp's own load then says what is
    wrong with it."""
    try:
        tensors = read_tensor_infos(path)
    except (ValueError, OSError):
        return []
    types = REPACKED_TYPES | (SPECLENS_REPACKED_TYPES if has_speclens_kernels() else frozenset())
    return [t.name for t in tensors
            if t.type_id in types and len(t.shape) == 2 and t.shape[1] % INTERLEAVE == 0
            and t.name not in ROW_LOOKUP]


class _Override(ctypes.Structure):
    """llama.cpp's ``llama_model_tensor_buft_override``: a regex over tensor names and the buffer type for them."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


@dataclass
class WeightBuffers:
    """How one model's weights are placed. Kept alive until the model has loaded: llama.cpp reads the overrides'
    strings while it loads."""

    use_extra_bufts: bool
    repacked: tuple[str, ...] = ()
    _overrides: ctypes.Array | None = field(default=None, repr=False)

    def apply(self, params) -> None:
        """Set these choices on a ``llama_model_params``."""
        params.use_extra_bufts = self.use_extra_bufts
        if self._overrides is not None:
            params.tensor_buft_overrides = ctypes.cast(self._overrides, ctypes.c_void_p)

    def describe(self) -> str:
        if self.use_extra_bufts:
            return "llama.cpp's own weight buffers"
        if self.repacked:
            return f"{len(self.repacked)} matrices repacked for AVX2 (AMX buffers off)"
        return "plain weight buffers (AMX buffers off)"


def weight_buffers(path: str | Path, gpu: bool = False) -> WeightBuffers:
    """The placement for the GGUF at ``path``: see the module docstring."""
    if not has_amx():
        return WeightBuffers(use_extra_bufts=True)
    if gpu:
        return WeightBuffers(use_extra_bufts=False)
    names = repackable_tensors(path)
    buft = _cpu_extra_buffer_type("CPU_REPACK") if names else None
    if buft is None:
        return WeightBuffers(use_extra_bufts=False)
    overrides = (_Override * (len(names) + 1))(
        *[_Override(f"^{re.escape(name)}$".encode(), buft) for name in names], _Override(None, None))
    return WeightBuffers(False, tuple(names), overrides)


def _cpu_extra_buffer_type(name: str) -> int | None:
    """The CPU device's extra buffer type called ``name``, from the ggml libraries llama-cpp-python loaded; None
    where this build does not have it (then weights simply stay in plain buffers)."""
    try:
        import llama_cpp

        folder = Path(os.environ.get("LLAMA_CPP_LIB_PATH") or Path(llama_cpp.__file__).parent / "lib")
        ggml = ctypes.CDLL(str(folder / "libggml.so"))
        base = ctypes.CDLL(str(folder / "libggml-base.so"))
        ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
        ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
        base.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
        base.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
        base.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
        base.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        base.ggml_backend_buft_name.restype = ctypes.c_char_p
        base.ggml_backend_buft_name.argtypes = [ctypes.c_void_p]
        device = ggml.ggml_backend_dev_by_type(0)   # GGML_BACKEND_DEVICE_TYPE_CPU
        if not device:
            return None
        address = base.ggml_backend_reg_get_proc_address(base.ggml_backend_dev_backend_reg(device),
                                                         b"ggml_backend_dev_get_extra_bufts")
        if not address:
            return None
        extra = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(address)(device)
        i = 0
        while extra and extra[i]:
            if base.ggml_backend_buft_name(extra[i]).decode() == name:
                return extra[i]
            i += 1
    except (OSError, AttributeError, ImportError) as exc:
        log.info("llama.cpp's %s buffers are out of reach (%s): weights stay in plain buffers", name, exc)
    return None
