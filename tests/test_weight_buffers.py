"""Weight placement on llama.cpp: on an AMX CPU the AMX buffers are off and the Q4_0/Q4_K matrices are repacked by
name; the repacked model is the same model (its logits agree within the batch kernels' rounding, its greedy output is
the plain-buffer one up to near-ties) and a tree batch still verifies through it."""
from __future__ import annotations

import pytest

import core.backends.llamacpp as llamacpp_backend
import core.backends.weight_buffers as buffers
import core.quantize as quantize
from core.backends.llamacpp import LlamaCppBackend
from core.divergence import compare_greedy
from core.drafting import Baseline, Chain
from core.engine import SpeculativeEngine
from core.sampling import SamplingParams
from core.tree import TokenTree
from tiny_gguf import write_tiny_gguf

CONTEXT = 256


@pytest.fixture(scope="module")
def q4_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("q4")
    source = write_tiny_gguf(folder / "tiny.gguf", seed=0, hidden=128, heads=4, kv_heads=2)
    with pytest.MonkeyPatch.context() as patch:   # module scope: the function-scoped monkeypatch is not available
        patch.setattr(quantize, "cache_dir", lambda: folder / "cache")
        return source, quantize.requantized(source, "Q4_0")


@pytest.fixture
def amx(monkeypatch):
    monkeypatch.setattr(buffers, "has_amx", lambda: True)
    if buffers._cpu_extra_buffer_type("CPU_REPACK") is None:
        pytest.skip("this llama.cpp build has no CPU_REPACK buffers")


def test_repackable_tensors_are_the_q4_matrices_but_the_embedding(q4_file):
    source, q4 = q4_file
    names = buffers.repackable_tensors(q4)
    assert {f"blk.{i}.{part}.weight" for i in range(2) for part in ("attn_q", "attn_k", "attn_v", "attn_output",
                                                                    "ffn_gate", "ffn_up", "ffn_down")} <= set(names)
    assert "token_embd.weight" not in names and not any("norm" in name for name in names)
    assert buffers.repackable_tensors(source) == []   # float32 weights: nothing to repack
    damaged = source.with_name("damaged.gguf")
    damaged.write_bytes(q4.read_bytes()[:4000])
    assert buffers.repackable_tensors(damaged) == []  # left to llama.cpp's load to report


def test_placement_by_cpu_and_device(q4_file, monkeypatch):
    _, q4 = q4_file
    monkeypatch.setattr(buffers, "has_amx", lambda: False)
    assert buffers.weight_buffers(q4).use_extra_bufts      # llama.cpp's own choice, which repacks by itself
    monkeypatch.setattr(buffers, "has_amx", lambda: True)
    assert buffers.weight_buffers(q4, gpu=True) == buffers.WeightBuffers(use_extra_bufts=False)   # weights on a GPU
    monkeypatch.setattr(buffers, "_cpu_extra_buffer_type", lambda name: None)
    plain = buffers.weight_buffers(q4)
    assert not plain.use_extra_bufts and plain.repacked == () and "plain" in plain.describe()


def test_an_amx_cpu_gets_the_q4_matrices_repacked(q4_file, amx):
    _, q4 = q4_file
    placed = buffers.weight_buffers(q4)
    assert not placed.use_extra_bufts and placed.repacked == tuple(buffers.repackable_tensors(q4))
    assert f"{len(placed.repacked)} matrices repacked" in placed.describe()
    import llama_cpp

    params = llama_cpp.llama_model_default_params()
    placed.apply(params)
    assert params.tensor_buft_overrides and not params.use_extra_bufts


def test_repacked_weights_compute_the_same_model(q4_file, amx, monkeypatch):
    _, q4 = q4_file
    repacked = LlamaCppBackend(q4, n_ctx=CONTEXT, n_threads=2)
    assert repacked.weight_buffers.repacked
    monkeypatch.setattr(llamacpp_backend, "weight_buffers", lambda path, gpu: buffers.WeightBuffers(False))
    plain = LlamaCppBackend(q4, n_ctx=CONTEXT, n_threads=2)
    assert not plain.weight_buffers.repacked

    prompt = plain.apply_chat_template([{"role": "user", "content": "the theory of the other thing"}])
    tree = TokenTree.chain(prompt[-6:])
    rows = []
    for backend in (plain, repacked):
        backend.prefill(prompt)
        rows.append(backend.forward_tree(tree).dense())
        backend.commit([])
    # other kernels over the same integer dot products: identical on this project's Xeon; a wrong layout or a
    # tensor read as another would be off by the logits' own scale
    assert (rows[0] - rows[1]).abs().max().item() <= 1e-3 * rows[0].abs().max().item()

    greedy = SamplingParams(temperature=0.0)
    reference = SpeculativeEngine(plain, None, Baseline(), greedy).generate(prompt, 30)
    for strategy, draft in ((Baseline(), None), (Chain(3), plain)):
        result = SpeculativeEngine(repacked, draft, strategy, greedy).generate(prompt, 30)
        comparison = compare_greedy(reference, result)
        assert comparison.identical or comparison.near_tie, comparison.describe()
