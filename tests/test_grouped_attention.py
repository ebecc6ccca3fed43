"""llama.cpp's flash attention as SpecLens builds it (native/llama.cpp/attention.patch), run on random queries, K/V
cells and masks through ggml's own graph API: it computes attention (against a float64 reference), and where the
model groups 4 or more heads on one K/V head each query row's result is bit for bit the same whether it comes alone
(a plain step), with the other rows of a batch (a verification call), or split across other thread counts, so a
verification batch computes exactly what one-token steps compute. Skipped where the installed llama.cpp is a stock
build. The shapes are the default pair's (12 heads on 2, 14 on 2) and a model without grouping."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from core.backends.kquant_kernels import GROUPED
from speclens_ggml import speclens_ggml_cpu

F32, F16 = 0, 1
SHAPES = [(128, 12, 2), (64, 14, 2), (64, 4, 4)]      # head size, query heads, K/V heads


class InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


@pytest.fixture(scope="module")
def ggml():
    cpu = speclens_ggml_cpu(GROUPED, "SpecLens's grouped attention")
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    for name, args, result in (
            ("ggml_init", [InitParams], p), ("ggml_free", [p], None), ("ggml_get_data", [p], p),
            ("ggml_new_tensor_4d", [p, ctypes.c_int, i64, i64, i64, i64], p),
            ("ggml_permute", [p, p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int], p),
            ("ggml_flash_attn_ext", [p, p, p, p, p, ctypes.c_float, ctypes.c_float, ctypes.c_float], p),
            ("ggml_new_graph", [p], p), ("ggml_build_forward_expand", [p, p], None),
            ("ggml_graph_compute_with_ctx", [p, p, ctypes.c_int], ctypes.c_int)):
        getattr(cpu, name).argtypes, getattr(cpu, name).restype = args, result
    cpu.ggml_cpu_init()
    return cpu


def attend(ggml, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, threads: int = 2) -> np.ndarray:
    """ggml_flash_attn_ext on q [tokens, heads, d] (float32), k and v [cells, kv heads, d] (float16) and an additive
    mask [tokens, cells] (float16, -inf hides a cell), laid out as llama.cpp lays out its cache: [tokens, heads, d]."""
    n, heads, d = q.shape
    cells, kv_heads, _ = k.shape
    ctx = ggml.ggml_init(InitParams(64 << 20, None, False))
    try:
        def tensor(array: np.ndarray, kind: int) -> int:
            shape = list(reversed(array.shape)) + [1] * (4 - array.ndim)
            t = ggml.ggml_new_tensor_4d(ctx, kind, *shape)
            ctypes.memmove(ggml.ggml_get_data(t), np.ascontiguousarray(array).ctypes.data, array.nbytes)
            return t

        # queries [d, heads, tokens] seen as [d, tokens, heads]; cells [d, kv heads, cells] as [d, cells, kv heads]
        qt = ggml.ggml_permute(ctx, tensor(q, F32), 0, 2, 1, 3)
        kt = ggml.ggml_permute(ctx, tensor(k, F16), 0, 2, 1, 3)
        vt = ggml.ggml_permute(ctx, tensor(v, F16), 0, 2, 1, 3)
        out = ggml.ggml_flash_attn_ext(ctx, qt, kt, vt, tensor(mask, F16), 1 / np.sqrt(d), 0.0, 0.0)
        graph = ggml.ggml_new_graph(ctx)
        ggml.ggml_build_forward_expand(graph, out)
        assert ggml.ggml_graph_compute_with_ctx(ctx, graph, threads) == 0
        result = np.empty((n, heads, d), np.float32)
        ctypes.memmove(result.ctypes.data, ggml.ggml_get_data(out), result.nbytes)
        return result
    finally:
        ggml.ggml_free(ctx)


def reference(q, k, v, mask) -> np.ndarray:
    group = q.shape[1] // k.shape[1]
    kk, vv = (np.repeat(x.astype(np.float64), group, axis=1) for x in (k, v))
    scores = np.einsum("nhd,chd->nhc", q.astype(np.float64), kk) / np.sqrt(q.shape[2])
    scores = scores + mask.astype(np.float64)[:, None, :]
    weights = np.exp(scores - scores.max(axis=2, keepdims=True))
    return np.einsum("nhc,chd->nhd", weights / weights.sum(axis=2, keepdims=True), vv)


def case(seed: int, shape: tuple[int, int, int], cells: int, tokens: int):
    """Random cells and the last ``tokens`` as a batch over them: each row sees every earlier cell except a few
    holes (cells of untaken tree branches), and a stretch of 64 cells that no row sees."""
    d, heads, kv_heads = shape
    rng = np.random.default_rng(seed)
    q = rng.normal(0, 1, (tokens, heads, d)).astype(np.float32)
    k = rng.normal(0, 1, (cells, kv_heads, d)).astype(np.float16)
    v = rng.normal(0, 1, (cells, kv_heads, d)).astype(np.float16)
    mask = np.zeros((tokens, cells), np.float16)
    mask[:, rng.choice(cells - tokens, 5, replace=False)] = -np.inf
    mask[:, 64:128] = -np.inf
    for i in range(tokens):
        mask[i, cells - tokens + i + 1:] = -np.inf
    return q, k, v, mask


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("cells,tokens", [(150, 1), (300, 8), (700, 40), (520, 70)])
def test_attention_is_attention(ggml, shape, cells, tokens):
    q, k, v, mask = case(0, shape, cells, tokens)
    # llama.cpp's own path for ungrouped heads adds up the weighted values in half precision; the grouped one in float
    tol = 1e-5 if shape[1] // shape[2] >= 4 else 5e-3
    np.testing.assert_allclose(attend(ggml, q, k, v, mask), reference(q, k, v, mask), atol=tol, rtol=tol)


@pytest.mark.parametrize("shape", [s for s in SHAPES if s[1] // s[2] >= 4])
@pytest.mark.parametrize("cells,tokens", [(300, 8), (700, 16), (1100, 70)])
def test_a_row_computes_the_same_bits_alone_in_a_batch_and_on_any_threads(ggml, shape, cells, tokens):
    q, k, v, mask = case(1, shape, cells, tokens)
    batch = attend(ggml, q, k, v, mask)
    for i in range(tokens):
        alone = attend(ggml, q[i:i + 1], k, v, mask[i:i + 1])
        assert np.array_equal(alone[0], batch[i]), f"row {i} alone differs from row {i} of the batch"
    for threads in (1, 3):
        assert np.array_equal(attend(ggml, q, k, v, mask, threads), batch), f"{threads} threads differ from 2"
    part = attend(ggml, q[3:7], k, v, mask[3:7])
    assert np.array_equal(part, batch[3:7])


def test_a_masked_row_reads_no_cell_it_does_not_see(ggml):
    """Cells a row does not see may hold anything a freed cell held: they change nothing in that row's bits."""
    q, k, v, mask = case(2, SHAPES[0], 300, 4)
    before = attend(ggml, q, k, v, mask)
    hidden = np.isinf(mask).all(axis=0)
    k[hidden], v[hidden] = k[hidden] * 3 + 1, -v[hidden]
    assert np.array_equal(attend(ggml, q, k, v, mask), before)


@pytest.mark.parametrize("shape", [s for s in SHAPES if s[1] // s[2] >= 4])
def test_cells_between_that_a_row_does_not_see_change_nothing(ggml, shape):
    """The taken branch of a tree: its rows see the committed cells and their own branch's, with the cells of other
    branches in between, and get the bits they would get with those cells away (as in one-token steps)."""
    q, k, v, mask = case(3, shape, 300, 4)
    plain = attend(ggml, q, k, v, mask)
    rng = np.random.default_rng(4)
    at = np.sort(rng.choice(np.arange(200, 301), 9))                # some among the last cells, some at the very end
    junk = rng.normal(0, 1, (len(at),) + k.shape[1:]).astype(np.float16)
    tree = attend(ggml, q, np.insert(k, at, junk, axis=0), np.insert(v, at, -junk, axis=0),
                  np.insert(mask, at, -np.inf, axis=1))
    assert np.array_equal(tree, plain)
