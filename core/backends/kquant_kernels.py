"""Whether the installed llama.cpp carries SpecLens's small-batch Q4_K/Q6_K kernels (native/llama.cpp, installed by
tools/build_llama_cpp.sh). With them a verification call on 2-16 tokens costs little more than one token on an
AVX-512 VNNI CPU, which the plan measures like any other cost; the bench names the build it ran on, because the same
command gives other speeds on a stock build.

Run as a script (``python core/backends/kquant_kernels.py``, standard library only) it says which build is installed:
the build script asks it before the project and numpy are."""
from __future__ import annotations

import ctypes
import functools
import importlib.util
from pathlib import Path

SYMBOL = "speclens_gemm_q4_K_8x8_q8_K"
GROUPED = "speclens_grouped_attention"       # native/llama.cpp/attention.patch
ORDERED = "speclens_kv_compact"              # native/llama.cpp/kv_order.patch, in libllama


def _library(pattern: str) -> Path | None:
    """One of llama-cpp-python's libraries, found without importing llama_cpp (whose import needs numpy)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    return next(iter(sorted((Path(spec.submodule_search_locations[0]) / "lib").glob(pattern))), None)


def ggml_cpu_library() -> Path | None:
    """llama-cpp-python's CPU backend library."""
    return _library("*ggml-cpu*")


@functools.cache
def _exports(symbol: str, pattern: str = "*ggml-cpu*") -> bool:
    lib = _library(pattern)
    if lib is None:
        return False
    try:
        return hasattr(ctypes.CDLL(str(lib)), symbol)
    except OSError:
        return False


def has_speclens_kernels() -> bool:
    return _exports(SYMBOL)


def has_grouped_attention() -> bool:
    """Whether attention takes one path for a lone token and every row of a batch, each row's bits independent of
    the rows beside it (where 4 or more heads share a K/V head), so that with the kernels a verification batch
    computes bit for bit what one-token steps compute."""
    return _exports(GROUPED)


def has_ordered_cache() -> bool:
    """Whether llama.cpp can keep a sequence's cache cells in the order of its positions after a tree step
    (``speclens_kv_compact``), so that the tokens after it are exact too."""
    return _exports(ORDERED, "libllama*")


def _kind() -> str:
    parts = [name for name, has in (("SpecLens's Q4_K/Q6_K batch kernels", has_speclens_kernels()),
                                    ("grouped attention", has_grouped_attention()),
                                    ("an ordered cache", has_ordered_cache())) if has]
    if not parts:
        return "(stock)"
    return "with " + (f"{', '.join(parts[:-1])} and {parts[-1]}" if len(parts) > 1 else parts[0])


def llama_cpp_build() -> str:
    """'llama-cpp-python 0.3.36 with SpecLens's Q4_K/Q6_K batch kernels, grouped attention and an ordered cache',
    or '... (stock)'."""
    import llama_cpp

    return f"llama-cpp-python {llama_cpp.__version__} {_kind()}"


if __name__ == "__main__":
    if ggml_cpu_library() is None:
        raise SystemExit("llama-cpp-python is not installed in this environment")
    print("llama-cpp-python built", _kind() if has_speclens_kernels()
          else "with stock kernels: tools/build_llama_cpp.sh adds SpecLens's where the CPU has AVX-512 VNNI or AVX2")
