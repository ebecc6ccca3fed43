"""Whether the installed llama.cpp carries SpecLens's small-batch Q4_K/Q6_K kernels (native/llama.cpp, installed by
tools/build_llama_cpp.sh). With them a verification call on 2-16 tokens costs little more than one token on an
AVX-512 VNNI CPU, which the plan measures like any other cost; the bench names the build it ran on, because the same
command gives other speeds on a stock build."""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

SYMBOL = "speclens_gemm_q4_K_8x8_q8_K"


@functools.cache
def has_speclens_kernels() -> bool:
    try:
        import llama_cpp
    except ImportError:
        return False
    for lib in sorted((Path(llama_cpp.__file__).parent / "lib").glob("*ggml-cpu*")):
        try:
            return hasattr(ctypes.CDLL(str(lib)), SYMBOL)
        except OSError:
            continue
    return False


def llama_cpp_build() -> str:
    """'llama-cpp-python 0.3.36 with SpecLens's Q4_K/Q6_K batch kernels', or '... (stock)'."""
    import llama_cpp

    kind = "with SpecLens's Q4_K/Q6_K batch kernels" if has_speclens_kernels() else "(stock)"
    return f"llama-cpp-python {llama_cpp.__version__} {kind}"
