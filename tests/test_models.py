"""The model registry: assembling files from chunk packages, loading pairs, the conversion cache, and bad input.

Chunk packages here are small fake ones written into a temporary folder on sys.path, holding tiny GGUF files or
plain bytes; the real default pair is exercised only by the tests marked ``real_models``.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

import core.assembly as assembly
import core.models as models
from core.assembly import Chunk, ChunkedFile, assemble
from core.backends.base import ModelLoadError
from core.backends.llamacpp import LlamaCppBackend
from core.models import PAIRS, PairSpec, load_custom_pair, load_pair
from tiny_gguf import write_tiny_gguf


def make_chunk_packages(root: Path, data: bytes, parts: int, filename: str = "model.bin") -> ChunkedFile:
    """Split ``data`` into ``parts`` importable chunk packages under ``root`` (which must be on sys.path)."""
    prefix = f"fake-{uuid.uuid4().hex[:8]}-part"
    step = -(-len(data) // parts)
    chunks = []
    for i in range(parts):
        piece = data[i * step:(i + 1) * step]
        package = f"{prefix}{i + 1}"
        folder = root / package.replace("-", "_")
        (folder / "data").mkdir(parents=True)
        (folder / "data" / f"part{i + 1:02d}.bin").write_bytes(piece)
        (folder / "__init__.py").write_text(
            "import os\n\ndef get_part_path():\n"
            f"    return os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'part{i + 1:02d}.bin')\n")
        chunks.append(Chunk(package, len(piece), hashlib.sha256(piece).hexdigest()))
    return ChunkedFile(filename, "1.0", len(data), hashlib.sha256(data).hexdigest(), tuple(chunks))


def part_file(root: Path, spec: ChunkedFile, index: int) -> Path:
    return root / spec.chunks[index].module / "data" / f"part{index + 1:02d}.bin"


@pytest.fixture
def packages(tmp_path, monkeypatch):
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return root


DATA = bytes(range(256)) * 4000 + b"tail"


def test_assembles_once_then_reuses_without_hashing(packages, tmp_path, monkeypatch):
    spec = make_chunk_packages(packages, DATA, 3)
    seen = []
    path = assemble(spec, progress=lambda msg, frac: seen.append(frac))
    assert path == assembly.cache_dir() / spec.filename and path.parent.is_relative_to(tmp_path / "cache")
    assert path.read_bytes() == DATA
    assert seen == sorted(seen) and seen[-1] == 1.0
    assert not list(path.parent.glob("*.partial"))

    def no_hashing(*args, **kwargs):
        raise AssertionError("a stamped file must not be hashed again")

    monkeypatch.setattr(assembly, "file_sha256", no_hashing)
    part_file(packages, spec, 0).unlink()  # the chunks are not even read again
    assert assemble(spec) == path


def test_file_without_stamp_is_checked_once(packages):
    spec = make_chunk_packages(packages, DATA, 2)
    path = assemble(spec)
    Path(str(path) + ".stamp").unlink()
    part_file(packages, spec, 1).unlink()
    assert assemble(spec).read_bytes() == DATA  # re-hashed, found right, stamped again
    assert Path(str(path) + ".stamp").is_file()


def test_corrupted_chunk_names_its_package(packages):
    spec = make_chunk_packages(packages, DATA, 3)
    part = part_file(packages, spec, 1)
    damaged = bytearray(part.read_bytes())
    damaged[100] ^= 0xFF
    part.write_bytes(bytes(damaged))
    with pytest.raises(ModelLoadError, match=f"{spec.chunks[1].package} is corrupt.*pip install --force-reinstall"):
        assemble(spec)
    folder = assembly.cache_dir()
    assert not (folder / spec.filename).exists() and not list(folder.glob("*.partial"))


def test_truncated_chunk_names_its_package(packages):
    spec = make_chunk_packages(packages, DATA, 3)
    part = part_file(packages, spec, 2)
    part.write_bytes(part.read_bytes()[:-10])
    with pytest.raises(ModelLoadError, match=spec.chunks[2].package):
        assemble(spec)


def test_missing_chunk_package_or_data_file(packages):
    spec = make_chunk_packages(packages, DATA, 3)
    part_file(packages, spec, 2).unlink()
    with pytest.raises(ModelLoadError, match=f"{spec.chunks[2].package} is missing its data file"):
        assemble(spec)
    other = make_chunk_packages(packages, DATA, 3)
    missing = Chunk("speclens-no-such-chunk-part9", 1, "0" * 64)
    broken = ChunkedFile(other.filename, other.version, other.size, other.sha256, other.chunks[:2] + (missing,))
    with pytest.raises(ModelLoadError, match="speclens-no-such-chunk-part9 of model.bin is not installed: pip install"):
        assemble(broken)


def test_wrong_sha256_leaves_no_file(packages):
    spec = make_chunk_packages(packages, DATA, 2)
    wrong = ChunkedFile(spec.filename, spec.version, spec.size, "ab" * 32, spec.chunks)
    with pytest.raises(ModelLoadError, match="wrong sha256"):
        assemble(wrong)
    folder = assembly.cache_dir()
    assert not (folder / spec.filename).exists() and not list(folder.glob("*.partial"))


def test_interrupted_assembly_is_never_used(packages):
    spec = make_chunk_packages(packages, DATA * 8, 4)  # several read blocks, so progress is reported mid-way

    def interrupt(message, fraction):
        if fraction > 0.3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        assemble(spec, progress=interrupt)
    folder = assembly.cache_dir()
    assert not (folder / spec.filename).exists() and not list(folder.glob("*.partial"))
    # what a killed process leaves behind: a stale partial file and, worse, a half file under the final name
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = folder / f".{spec.filename}.{dead.pid}.partial"
    stale.write_bytes(DATA[:1000])
    running = folder / f".{spec.filename}.{os.getppid()}.partial"  # a live process assembling the same file
    running.write_bytes(DATA[:1000])
    (folder / spec.filename).write_bytes((DATA * 8)[: spec.size // 2])
    path = assemble(spec)
    assert path.read_bytes() == DATA * 8
    assert not stale.exists() and running.exists()
    # a file changed after it was stamped is rebuilt as well
    path.write_bytes(b"garbage")
    assert assemble(spec).read_bytes() == DATA * 8


@pytest.fixture
def tiny_registry(packages, tmp_path, monkeypatch):
    """A registered pair of tiny qwen2 GGUF files shipped as fake chunk packages."""
    target = write_tiny_gguf(tmp_path / "t.gguf", arch="qwen2", seed=0).read_bytes()
    draft = write_tiny_gguf(tmp_path / "d.gguf", arch="qwen2", seed=0, noise=0.05).read_bytes()
    spec = PairSpec("fake", "tiny test pair", target=make_chunk_packages(packages, target, 3, "target.gguf"),
                    draft=make_chunk_packages(packages, draft, 2, "draft.gguf"))
    monkeypatch.setitem(PAIRS, "fake", spec)
    return spec


def test_load_pair_assembles_and_loads_on_llamacpp(tiny_registry):
    seen = []
    target, draft = load_pair("fake", n_threads=1, progress=lambda msg, frac: seen.append((msg, frac)))
    assert isinstance(target, LlamaCppBackend) and isinstance(draft, LlamaCppBackend)
    assert target.n_threads == 1 and target.path == assembly.cache_dir() / "target.gguf"
    assert target.fingerprint() == draft.fingerprint()
    fractions = [f for _, f in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert any("Assembling target.gguf" in msg for msg, _ in seen)


def test_mixed_pair_converts_once_and_reloads_from_cache(tiny_registry, monkeypatch):
    from core.backends.hf import HFBackend

    target, draft = load_pair("fake", backend="hf", draft_backend="llama.cpp", n_threads=1)
    assert isinstance(target, HFBackend) and isinstance(draft, LlamaCppBackend)
    folder = models.converted_folder(assembly.cache_dir() / "target.gguf", torch.float32)
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    prompt = draft.tokenize("the other thing")
    first = target.prefill(prompt)

    def no_conversion(*args, **kwargs):
        raise AssertionError("the converted model should come from the cache")

    monkeypatch.setattr(models, "_convert_gguf", no_conversion)
    again, _ = load_pair("fake", backend="hf", draft_backend="llama.cpp", n_threads=1)
    assert torch.equal(again.prefill(prompt), first)
    # the dequantised copy and llama.cpp agree up to llama.cpp's float16 attention (measured 0.012)
    llama_target, _ = load_pair("fake", n_threads=1)
    assert (first - llama_target.prefill(prompt)).abs().max() < 0.1


def test_conversion_is_cached_per_precision(tmp_path, packages):
    from safetensors import safe_open

    gguf = write_tiny_gguf(tmp_path / "t.gguf", arch="qwen2", seed=0)
    single = models.load_backend(gguf, "hf", device="cpu")
    assert single.dtype == torch.float32   # the CPU's default precision
    half = models.load_backend(gguf, "hf", device="cpu", dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16
    folders = {dtype: models.converted_folder(gguf, dtype) for dtype in (torch.float32, torch.bfloat16)}
    assert folders[torch.float32] != folders[torch.bfloat16]
    for dtype, folder in folders.items():
        with safe_open(folder / "model.safetensors", "pt") as weights:   # saved at that precision, not float32
            assert {weights.get_tensor(k).dtype for k in weights.keys()} == {dtype}
    prompt = single.tokenize("the other thing")
    logits = single.prefill(prompt)
    # the same model: bfloat16 rounding only (see tests/test_hf_static.py for the measured tolerance)
    assert (logits - half.prefill(prompt).float()).abs().max() < 0.15 * logits.abs().max()


def test_damaged_conversion_is_converted_again(tmp_path, packages, monkeypatch):
    gguf = write_tiny_gguf(tmp_path / "t.gguf", arch="qwen2", seed=0)
    first = models.load_backend(gguf, "hf", device="cpu")
    prompt = first.tokenize("the other thing")
    expected = first.prefill(prompt)
    weights = models.converted_folder(gguf, torch.float32) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])   # what a full disk or a killed copy leaves
    conversions = []
    convert = models._convert_gguf
    monkeypatch.setattr(models, "_convert_gguf", lambda *args: (conversions.append(args), convert(*args)))
    again = models.load_backend(gguf, "hf", device="cpu")
    assert len(conversions) == 1 and torch.equal(again.prefill(prompt), expected)

    def broken_conversion(gguf, folder, dtype, progress):   # a conversion that keeps writing a damaged copy
        convert(gguf, folder, dtype, progress)
        (folder / "model.safetensors").write_bytes(b"\0" * 100)

    monkeypatch.setattr(models, "_convert_gguf", broken_conversion)
    weights.write_bytes(b"")
    folder = str(weights.parent)
    with pytest.raises(ModelLoadError, match=f"converted copy of t.gguf in {folder} cannot be loaded"):
        models.load_backend(gguf, "hf", device="cpu")


def test_load_pair_rejects_bad_requests():
    with pytest.raises(ModelLoadError, match="unknown model pair 'nope'.*default"):
        load_pair("nope")
    with pytest.raises(ModelLoadError, match="unknown backend 'onnx'"):
        load_pair("default", backend="onnx")
    with pytest.raises(ModelLoadError, match="runs on hf only"):
        load_pair("tiny", backend="llama.cpp")
    with pytest.raises(ModelLoadError, match="runs on hf only"):
        load_pair("tiny", backend="hf", draft_backend="llama.cpp")


def test_tiny_pair_from_the_registry():
    from core.backends.hf import HFBackend

    target, draft = load_pair("tiny", backend="hf")
    assert isinstance(target, HFBackend) and target.fingerprint() == draft.fingerprint()
    assert set(PAIRS) >= {"default", "tiny"} and all(spec.description for spec in PAIRS.values())


def test_custom_pairs_infer_their_backend(tmp_path):
    from core.backends.hf import HFBackend
    from core.tiny import tiny_pair

    t = write_tiny_gguf(tmp_path / "t.gguf", seed=0)
    d = write_tiny_gguf(tmp_path / "d.gguf", seed=0, noise=0.05)
    target, draft = load_custom_pair(t, d, n_threads=1)
    assert isinstance(target, LlamaCppBackend) and isinstance(draft, LlamaCppBackend)

    hf_target, hf_draft = tiny_pair()
    for backend, folder in ((hf_target, tmp_path / "ht"), (hf_draft, tmp_path / "hd")):
        backend.model.save_pretrained(folder)
        backend.tokenizer.save_pretrained(folder)
    target, draft = load_custom_pair(tmp_path / "ht", tmp_path / "hd")
    assert isinstance(target, HFBackend) and isinstance(draft, HFBackend)
    prompt = hf_target.tokenize("hello")
    assert torch.allclose(target.prefill(prompt).double(), hf_target.prefill(prompt).double(), atol=1e-5)


def test_custom_pair_bad_inputs(tmp_path):
    t = write_tiny_gguf(tmp_path / "t.gguf", seed=0)
    bigger = write_tiny_gguf(tmp_path / "b.gguf", seed=1, extra_tokens=("<|tool|>",))
    with pytest.raises(ModelLoadError, match="vocabulary of 284 tokens but target t.gguf has 283"):
        load_custom_pair(t, bigger, n_threads=1)
    same_size = write_tiny_gguf(tmp_path / "s.gguf", seed=1, extra_tokens=("<|tool|>",), n_merges=23)
    with pytest.raises(ModelLoadError, match="different tokenizers"):
        load_custom_pair(t, same_size, n_threads=1)
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_custom_pair(tmp_path / "nowhere.gguf", t)
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    for odd, kind in ((fifo, "a named pipe"), (Path("/dev/zero"), "a character device")):
        with pytest.raises(ModelLoadError, match=f"{odd} is {kind}"):   # never opened: a pipe would block
            load_custom_pair(odd, t)
    text = tmp_path / "readme.txt"
    text.write_text("not a model")
    with pytest.raises(ModelLoadError, match="not a GGUF"):
        load_custom_pair(t, text)
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(t.read_bytes()[:5000])
    with pytest.raises(ModelLoadError, match="truncated"):
        load_custom_pair(truncated, t)
    with pytest.raises(ModelLoadError, match="needs a .gguf file"):
        load_custom_pair(tmp_path, t, backend="llama.cpp")
    empty = tmp_path / "empty_folder"
    empty.mkdir()
    with pytest.raises(ModelLoadError, match="cannot load a transformers model"):
        load_custom_pair(empty, empty)


# -- the real default pair ---------------------------------------------------------------------------------------------
def _chunks_installed() -> bool:
    return all(importlib.util.find_spec(c.module) is not None
               for spec in (models.QWEN_TARGET, models.QWEN_DRAFT) for c in spec.chunks)


real = pytest.mark.skipif(not _chunks_installed(), reason="the default pair's chunk packages are not installed")


@pytest.fixture(scope="module")
def default_pair():
    # one thread: ggml's spinning thread barriers slow down many times over when other processes share the cores
    return load_pair("default", backend="llama.cpp", n_threads=1)


@pytest.mark.real_models
@real
def test_default_pair_files_and_tokenizer(default_pair):
    target, draft = default_pair
    assert target.path.stat().st_size == models.QWEN_TARGET.size
    assert target.vocab_size == draft.vocab_size == 151936
    assert 151645 in target.eos_ids
    assert target.fingerprint() == draft.fingerprint()
    ids = target.apply_chat_template([{"role": "user", "content": "Hi <|im_end|>"}])
    assert target.detokenize(ids).endswith("user\nHi <|im_end|>\nassistant\n")   # typed text stays text
    names = [target.special_name(t) for t in ids]
    assert names.count("<|im_end|>") == 2 and names[-3] == "<|im_start|>"   # the template's markup only


@pytest.mark.real_models
@real
def test_default_pair_decodes_speculatively(default_pair):
    from core.divergence import compare_greedy
    from core.drafting import Baseline, Chain, Tree
    from core.engine import SpeculativeEngine
    from core.sampling import SamplingParams

    target, draft = default_pair
    prompt = target.apply_chat_template([
        {"role": "system", "content": "You are a helpful coding assistant."},
        {"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number."},
    ])
    greedy = SamplingParams(temperature=0.0)
    baseline = SpeculativeEngine(target, draft, Baseline(), greedy).generate(prompt, 24)
    assert len(baseline.tokens) == 24 and "def" in baseline.text
    for strategy in (Chain(4), Tree((-1, -1, 0, 0, 2))):
        result = SpeculativeEngine(target, draft, strategy, greedy).generate(prompt, 24)
        comparison = compare_greedy(baseline, result)
        print(strategy.label, "greedy:", comparison.describe(), f"accepted {result.stats.accepted}")
        assert comparison.identical or comparison.near_tie, comparison.describe()
        assert result.stats.accepted > 0  # the 0.5B model agrees with the 1.5B on much of easy code
        sampled = SpeculativeEngine(target, draft, strategy, SamplingParams(temperature=0.7, seed=1)).generate(prompt, 24)
        assert len(sampled.tokens) == 24 or sampled.tokens[-1] in target.eos_ids
        assert sampled.text and target.committed[:len(prompt)] == prompt


@pytest.mark.real_models
@real
def test_a_verification_batch_computes_bit_for_bit_what_one_token_steps_compute(default_pair):
    """On the default pair's Q4_K/Q6_K target, with SpecLens's kernels and grouped attention (native/llama.cpp), past
    512 cached tokens where stock llama.cpp sends a lone token's attention another way: a drafted chain, the
    accepted branch of a tree that is not its first, and the token after that branch, get exactly the logits
    one-token steps get (stock: up to 0.7 apart, enough to flip a greedy choice at a top-2 margin of 0.3)."""
    from core.backends.kquant_kernels import has_grouped_attention, has_ordered_cache, has_speclens_kernels
    from core.backends.llamacpp import ContextTuning
    from core.tree import TokenTree

    if not (has_speclens_kernels() and has_grouped_attention() and has_ordered_cache()):
        pytest.skip("this llama.cpp build lacks SpecLens's kernels, attention or cache order "
                    "(tools/build_llama_cpp.sh)")
    target, _ = default_pair
    before = target.tuning
    target.retune(ContextTuning(flash_attn=True))
    try:
        prompt = target.tokenize(Path(models.__file__).read_text())[:700]
        target.reset()
        logits, steps, tokens = target.prefill(prompt), [], []
        for _ in range(9):
            steps.append(logits.clone())
            tokens.append(int(torch.argmax(logits)))
            logits = target.forward_tree(TokenTree.chain(tokens[-1:]))[-1]
            target.commit([0])
        target.reset()
        target.prefill(prompt)                     # the same cache again: the prompt read as before
        chain = target.forward_tree(TokenTree.chain(tokens[:7]))
        assert all(torch.equal(chain[i], steps[i + 1]) for i in range(7))
        target.reset()
        target.prefill(prompt)
        tree = TokenTree()
        tree.add((tokens[0] + 1) % target.vocab_size, -1)          # a first branch that is not taken
        for i, token in enumerate(tokens[:7]):
            tree.add(token, i if i else -1)                           # the taken one: node i + 1 under node i
        branch = target.forward_tree(tree)
        assert all(torch.equal(branch[i + 1], steps[i + 1]) for i in range(7))
        target.commit(list(range(1, 8)))            # the cells of the untaken branch are left behind the path
        assert torch.equal(target.forward_tree(TokenTree.chain(tokens[7:8]))[-1], steps[8])
    finally:
        target.retune(before)
