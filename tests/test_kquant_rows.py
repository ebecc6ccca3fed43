"""SpecLens's small-batch Q4_K and Q6_K kernels in llama.cpp (native/llama.cpp, built by tools/build_llama_cpp.sh), on
random weights and activation rows: they give stock llama.cpp's products within float rounding (Q4_K: its AVX2 gemv
on the same repacked blocks; Q6_K: its dot product on the blocks before repacking, repacked here as
make_block_q6_Kx8 does), a wrong nibble shows, and a row's result does not depend on how many rows come with it, so
a verification batch and a plain step compute the same products. Skipped where the installed llama.cpp lacks the
kernels (a stock build, or a CPU without AVX2); the kernels checked are the variant the build compiled for this CPU
(AVX-512 VNNI, else AVX2)."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from core.backends.kquant_kernels import SYMBOL
from speclens_ggml import speclens_ggml_cpu

QK_K = 256
Q4_K_X8 = np.dtype([("d", "<f2", 8), ("dmin", "<f2", 8), ("scales", "u1", 96), ("qs", "u1", 1024)])
Q6_K = np.dtype([("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", "<f2")])
Q6_K_X8 = np.dtype([("d", "<f2", 8), ("scales", "i1", 128), ("ql", "u1", 1024), ("qh", "u1", 512)])
Q8_K = np.dtype([("d", "<f4"), ("qs", "i1", QK_K), ("bsums", "<i2", 16)])
PRODUCT = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
DOT = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
       ctypes.c_size_t, ctypes.c_int]
SHAPES = [(256, 8, 1), (512, 16, 2), (768, 24, 3), (1024, 32, 4), (512, 40, 7), (1280, 16, 13)]


@pytest.fixture(scope="module")
def ggml_cpu():
    cpu = speclens_ggml_cpu(SYMBOL, "SpecLens kernels")
    for name in ("speclens_gemm_q4_K_8x8_q8_K", "speclens_gemm_q6_K_8x8_q8_K", "ggml_gemv_q4_K_8x8_q8_K"):
        getattr(cpu, name).argtypes, getattr(cpu, name).restype = PRODUCT, None
    cpu.ggml_vec_dot_q6_K_q8_K.argtypes, cpu.ggml_vec_dot_q6_K_q8_K.restype = DOT, None
    cpu.ggml_cpu_init()   # the fp16 tables the stock dot product reads
    return cpu


def rows(rng, n, nr):
    """nr activation rows as block_q8_K, each block's sums of 16 consistent with its quants."""
    x = np.zeros(nr * (n // QK_K), Q8_K)
    x["d"] = rng.uniform(1e-3, 1e-1, x["d"].shape)
    x["qs"] = rng.integers(-127, 128, x["qs"].shape)
    x["bsums"] = x["qs"].reshape(len(x), 16, 16).astype(np.int32).sum(axis=2)
    return x


def q4_K_x8(rng, n, nc):
    """nc columns of n values as block_q4_Kx8: every nibble, scale and min byte random, the fp16 scales small."""
    w = np.zeros((nc // 8) * (n // QK_K), Q4_K_X8)
    w["scales"] = rng.integers(0, 256, w["scales"].shape)
    w["qs"] = rng.integers(0, 256, w["qs"].shape)
    w["d"] = rng.uniform(1e-4, 1e-2, w["d"].shape)
    w["dmin"] = rng.uniform(1e-4, 1e-2, w["dmin"].shape)
    return w


def q6_K(rng, n, nc):
    """nc columns of n values as block_q6_K (n / 256 blocks each), every bit random, the fp16 scales small."""
    w = np.zeros((nc, n // QK_K), Q6_K)
    w["ql"] = rng.integers(0, 256, w["ql"].shape)
    w["qh"] = rng.integers(0, 256, w["qh"].shape)
    w["scales"] = rng.integers(-128, 128, w["scales"].shape)
    w["d"] = rng.uniform(1e-4, 1e-2, w["d"].shape)
    return w


def repacked_q6_K(w):
    """llama.cpp's make_block_q6_Kx8 with 8-byte interleaving: columns 8c..8c+7 of every super-block in one block."""
    nc, nb = w.shape
    out = np.zeros((nc // 8, nb), Q6_K_X8)
    group = w.reshape(nc // 8, 8, nb).transpose(0, 2, 1)            # [block of 8 columns, super-block, column]
    out["d"] = group["d"]
    out["scales"] = group["scales"].transpose(0, 1, 3, 2).reshape(nc // 8, nb, 128)
    for field, chunks in (("ql", 16), ("qh", 8)):
        bytes_ = group[field].reshape(nc // 8, nb, 8, chunks, 8)    # [.., column, chunk, byte]
        out[field] = bytes_.transpose(0, 1, 3, 2, 4).reshape(nc // 8, nb, chunks * 64)
    return out.reshape(-1)


def product(fn, n, w, x, nr, nc):
    out = np.zeros((nr, nc), np.float32)
    fn(n, out.ctypes.data, nc, w.ctypes.data, x.ctypes.data, nr, nc)
    return out


def stock_q4_K(cpu, n, w, x, nr, nc):
    blocks = n // QK_K
    return np.vstack([product(cpu.ggml_gemv_q4_K_8x8_q8_K, n, w, x[m * blocks:(m + 1) * blocks], 1, nc)
                      for m in range(nr)])


def stock_q6_K(cpu, n, w, x, nr, nc):
    blocks = n // QK_K
    out = np.zeros((nr, nc), np.float32)
    s = ctypes.c_float()
    for m in range(nr):
        row = x[m * blocks:(m + 1) * blocks]
        for c in range(nc):
            column = np.ascontiguousarray(w[c])
            cpu.ggml_vec_dot_q6_K_q8_K(n, ctypes.byref(s), 0, column.ctypes.data, 0, row.ctypes.data, 0, 1)
            out[m, c] = s.value
    return out


def check(ours, stock, perturbed):
    scale = np.abs(stock).max()
    assert scale > 1.0
    tolerance = 1e-5 * scale       # the integer sums are exact in both; the float sums differ in order only
    np.testing.assert_allclose(ours, stock, rtol=0, atol=tolerance)
    assert np.abs(perturbed - ours).max() > 10 * tolerance     # while one wrong nibble moves a product far more


@pytest.mark.parametrize("n,nc,nr", SHAPES)
def test_the_q4_K_kernel_gives_stock_llama_cpps_products(ggml_cpu, n, nc, nr):
    rng = np.random.default_rng(n + nc + nr)
    w, x = q4_K_x8(rng, n, nc), rows(rng, n, nr)
    ours = product(ggml_cpu.speclens_gemm_q4_K_8x8_q8_K, n, w, x, nr, nc)
    stock = stock_q4_K(ggml_cpu, n, w, x, nr, nc)
    w["qs"][0, 0] ^= 0x11
    check(ours, stock, product(ggml_cpu.speclens_gemm_q4_K_8x8_q8_K, n, w, x, nr, nc))


@pytest.mark.parametrize("n,nc,nr", SHAPES)
def test_the_q6_K_kernel_gives_stock_llama_cpps_products(ggml_cpu, n, nc, nr):
    rng = np.random.default_rng(n + nc + nr)
    w, x = q6_K(rng, n, nc), rows(rng, n, nr)
    ours = product(ggml_cpu.speclens_gemm_q6_K_8x8_q8_K, n, repacked_q6_K(w), x, nr, nc)
    stock = stock_q6_K(ggml_cpu, n, w, x, nr, nc)
    w["qh"][0, 0][0] ^= 0x11
    check(ours, stock, product(ggml_cpu.speclens_gemm_q6_K_8x8_q8_K, n, repacked_q6_K(w), x, nr, nc))


@pytest.mark.parametrize("kernel", ["q4_K", "q6_K"])
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(ggml_cpu, kernel):
    n, nc, nr = 768, 24, 6
    rng = np.random.default_rng(7)
    w = q4_K_x8(rng, n, nc) if kernel == "q4_K" else repacked_q6_K(q6_K(rng, n, nc))
    x = rows(rng, n, nr)
    fn = getattr(ggml_cpu, f"speclens_gemm_{kernel}_8x8_q8_K")
    batch = product(fn, n, w, x, nr, nc)
    blocks = n // QK_K
    for m in range(nr):
        assert np.array_equal(product(fn, n, w, x[m * blocks:(m + 1) * blocks], 1, nc)[0], batch[m])
