"""Device selection, precision per device, and running out of memory as an error that keeps the chat."""
from __future__ import annotations

import pytest
import torch

import core.models as models
from core.backends.base import BackendError, ModelLoadError
from core.backends.devices import OutOfMemory, check_device, default_device, default_dtype, is_out_of_memory
from core.backends.hf import HFBackend
from core.tree import TokenTree
from tests.tiny_models import tiny_model

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens on a machine without a GPU")


def test_default_device_is_cuda_when_present(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_device() == check_device(None) == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_device() == check_device(None) == "cpu"


def test_device_names(monkeypatch):
    assert check_device("cpu") == check_device(" CPU ") == "cpu"
    for bad in ("tpu", "gpu0", "cpu:1", "cuda:x", ""):
        with pytest.raises(ModelLoadError, match="unknown device"):
            check_device(bad)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert check_device("cuda") == "cuda" and check_device("CUDA:1") == "cuda:1"
    with pytest.raises(ModelLoadError, match=r"'cuda:2' was asked for but torch sees 2 GPU"):
        check_device("cuda:2")


def test_missing_devices_are_clear_errors(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ModelLoadError, match=r"device 'cuda' was asked for but torch sees no GPU \(CUDA unavailable\)"):
        check_device("cuda")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ModelLoadError, match="device 'mps' was asked for but torch sees no Apple GPU"):
        check_device("mps")


def test_precision_per_device(monkeypatch):
    assert default_dtype("cpu") == torch.float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    assert default_dtype("cuda") == default_dtype("cuda:1") == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    assert default_dtype("cuda") == torch.float16
    assert default_dtype("mps") == torch.float16


@no_gpu
def test_asking_for_a_missing_gpu_fails_before_loading(tmp_path):
    with pytest.raises(ModelLoadError, match="torch sees no GPU"):
        HFBackend(tiny_model(20, 0), device="cuda")
    backend = HFBackend(tiny_model(20, 0), device="cpu")
    backend.model.save_pretrained(tmp_path / "m")
    from core.tiny import tiny_tokenizer

    tiny_tokenizer().save_pretrained(tmp_path / "m")
    with pytest.raises(ModelLoadError, match="torch sees no GPU"):
        models.load_backend(tmp_path / "m", device="cuda")
    loaded = models.load_backend(tmp_path / "m")
    assert loaded.device == "cpu" and loaded.dtype == torch.float32   # the defaults on a machine without a GPU


def test_recognises_out_of_memory():
    assert is_out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_out_of_memory(RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate memory: you tried"))
    assert is_out_of_memory(MemoryError())
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
    assert not is_out_of_memory(ValueError("out of memory"))


def full_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1]


class FailNext:
    """Replaces a model's forward: raises ``error`` on the next call, then behaves again."""

    def __init__(self, model, error: Exception) -> None:
        self.model, self.error, self.forward = model, error, model.forward
        model.forward = self

    def __call__(self, *args, **kwargs):
        self.model.forward = self.forward
        raise self.error


@pytest.mark.parametrize("static_shapes", [False, True], ids=["exact", "fixed"])
@pytest.mark.parametrize("error", [torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB"),
                                   RuntimeError("CUDA error: out of memory")], ids=["cuda-oom", "runtime-oom"])
def test_out_of_memory_while_decoding_keeps_the_chat(static_shapes, error):
    model = tiny_model(30, 1, context=256)
    backend = HFBackend(model, device="cpu", static_shapes=static_shapes)
    history = [1, 2, 3, 4, 5]
    backend.prefill(history)
    tree = TokenTree()
    for parent in (-1, -1, 0, 1, 2, 2):
        tree.add(len(tree) + 7, parent)
    backend.forward_tree(tree.truncated(max_nodes=3))   # a drafter growing a tree level by level
    FailNext(model, error)
    with pytest.raises(OutOfMemory, match="out of memory on cpu while evaluating 3 tokens.*the chat is kept") as info:
        backend.forward_tree(tree, start=3)
    assert isinstance(info.value, BackendError) and info.value.__cause__ is error
    assert backend.committed == history   # the cache is back at the committed prefix
    with pytest.raises(BackendError, match="asked to evaluate from node 3 but 0 are cached"):
        backend.forward_tree(tree, start=3)
    logits = backend.forward_tree(tree)   # the same step again, from the start
    backend.commit(tree.path_to(5))
    for j in range(len(tree)):
        path = [tree.tokens[i] for i in tree.path_to(j)]
        assert float((logits[j] - full_logits(model, history + path)).abs().max()) < 1e-9
    probe = backend.forward_tree(TokenTree.chain([9]))[0]
    assert float((probe - full_logits(model, history + [7, 9, 12, 9])).abs().max()) < 1e-9


def test_other_errors_pass_through():
    model = tiny_model(30, 1, context=256)
    backend = HFBackend(model, device="cpu")
    backend.prefill([1, 2, 3])
    error = RuntimeError("mat1 and mat2 shapes cannot be multiplied")
    FailNext(model, error)
    with pytest.raises(RuntimeError) as info:
        backend.forward_tree(TokenTree.chain([4]))
    assert info.value is error and backend.committed == [1, 2, 3]


def test_out_of_memory_while_loading(tmp_path, monkeypatch):
    with pytest.raises(OutOfMemory, match="out of memory on cpu while loading .*shorter context"):
        HFBackend(tiny_model(20, 0), device="cpu", context_length=10**12)   # a cache no machine can hold
    backend = HFBackend(tiny_model(20, 0), device="cpu")
    backend.model.save_pretrained(tmp_path / "m")
    from transformers import AutoModelForCausalLM

    def no_memory(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 6 GB")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", no_memory)
    with pytest.raises(OutOfMemory, match=f"out of memory on cpu while loading {tmp_path / 'm'}"):
        models.load_backend(tmp_path / "m")
