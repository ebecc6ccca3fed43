"""Re-quantising a draft GGUF into the cache: done once, a real llama.cpp model of another weight type, and still a
lossless draft (every drafted token carries the q it was drawn from; the target is never touched)."""
from __future__ import annotations

import pytest

import core.quantize as quantize
from core.backends.base import ModelLoadError
from core.backends.llamacpp import LlamaCppBackend
from core.divergence import compare_greedy
from core.drafting import Baseline, Chain, Tree
from core.engine import SpeculativeEngine
from core.sampling import SamplingParams
from tiny_gguf import write_tiny_gguf

CONTEXT = 256


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.setattr(quantize, "cache_dir", lambda: tmp_path / "cache")
    return (write_tiny_gguf(tmp_path / "target.gguf", seed=0, hidden=128, heads=4, kv_heads=2),
            write_tiny_gguf(tmp_path / "draft.gguf", seed=0, noise=0.05, hidden=128, heads=4, kv_heads=2))


def test_requantised_once_into_the_cache(files):
    _, draft_path = files
    out = quantize.requantized(draft_path, "Q8_0")
    assert out.is_file() and out.parent.name == "quantized" and out.stat().st_size < draft_path.stat().st_size
    stamp = out.stat().st_mtime_ns
    assert quantize.requantized(draft_path, "Q8_0") == out and out.stat().st_mtime_ns == stamp   # not redone
    with pytest.raises(ValueError, match="unknown weight type"):
        quantize.requantized(draft_path, "Q3_X")
    with pytest.raises(ModelLoadError, match="does not exist"):
        quantize.requantized(draft_path.with_name("nowhere.gguf"))


def test_a_requantised_draft_is_still_a_lossless_draft(files):
    target_path, draft_path = files
    target = LlamaCppBackend(target_path, n_ctx=CONTEXT, n_threads=2)
    draft = LlamaCppBackend(quantize.requantized(draft_path, "Q8_0"), n_ctx=CONTEXT, n_threads=2)
    assert draft.fingerprint() == target.fingerprint()
    greedy = SamplingParams(temperature=0.0)
    prompt = target.apply_chat_template([{"role": "user", "content": "the theory of the other thing"}])
    baseline = SpeculativeEngine(target, draft, Baseline(), greedy).generate(prompt, 40)
    for strategy in (Chain(3), Tree((-1, -1, 0, 1))):
        result = SpeculativeEngine(target, draft, strategy, greedy).generate(prompt, 40)
        assert result.stats.accepted > 0
        comparison = compare_greedy(baseline, result)
        assert comparison.identical or comparison.near_tie, comparison.describe()
    sampled = SpeculativeEngine(target, draft, Chain(3), SamplingParams(temperature=0.8, seed=2)).generate(prompt, 30)
    assert len(sampled.tokens) == 30 or sampled.tokens[-1] in target.eos_ids
