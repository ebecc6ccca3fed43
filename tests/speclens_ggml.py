"""llama-cpp-python's CPU backend library for tests that call SpecLens's llama.cpp code in it directly."""
from __future__ import annotations

import ctypes

import pytest

from core.backends.kquant_kernels import ggml_cpu_library


def speclens_ggml_cpu(symbol: str, what: str) -> ctypes.CDLL:
    """The library, loaded; the test is skipped where llama_cpp is missing or its build lacks ``symbol``."""
    lib = ggml_cpu_library()
    if lib is None:
        pytest.skip("no llama_cpp with its libggml-cpu installed")
    cpu = ctypes.CDLL(str(lib))
    if not hasattr(cpu, symbol):
        pytest.skip(f"this llama.cpp build has no {what} (tools/build_llama_cpp.sh builds it)")
    return cpu
