"""llama.cpp's own server (``llama-server``), started on the same model files and threads as SpecLens: the tool a
user would otherwise pick, with its own speculative decoding.

Configurations, as llama-server offers them:

* ``plain``: no speculation;
* ``ngram``: ``--spec-default``, its n-gram drafts (ngram-mod: a 24-token lookup, drafts of 48-64 tokens), which
  learn from every request the process served;
* ``draft``: a draft model (``--spec-type draft-simple -md DRAFT``), drafting chains of up to 3 tokens by default;
* ``both``: the two chained (ngram-mod first, the draft model where it has nothing).

The binary is found where the user says (``--llama-server PATH`` or SPECLENS_LLAMA_SERVER), else on PATH, else where
``tools/build_llama_server.sh`` puts it.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from core.sampling import SamplingParams

BINARY_ENV = "SPECLENS_LLAMA_SERVER"
BUILT_HERE = Path.home() / ".cache" / "speclens-anchors" / "llama-server" / "llama-server"
NGRAM_DEFAULT = ["--spec-default"]
CONFIGS = ("plain", "ngram", "draft", "both")
START_TIMEOUT_S = 300.0


class LlamaServerError(RuntimeError):
    """llama-server could not be found, started, or asked."""


def find_binary(given: str | Path | None = None) -> Path:
    """The llama-server executable: ``given``, else $SPECLENS_LLAMA_SERVER, else on PATH, else the build folder."""
    candidates = [given, os.environ.get(BINARY_ENV), shutil.which("llama-server"), BUILT_HERE]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    if given:
        raise LlamaServerError(f"{given} is not an executable llama-server")
    raise LlamaServerError("llama-server was not found: pass --llama-server PATH, set SPECLENS_LLAMA_SERVER, put it on "
                           "PATH, or build it with tools/build_llama_server.sh (about 8 minutes on 2 cores)")


def spec_arguments(config: str, draft: str | Path | None) -> list[str]:
    """llama-server's command-line options for one configuration."""
    if config not in CONFIGS:
        raise LlamaServerError(f"unknown llama-server configuration {config!r}; choose one of {', '.join(CONFIGS)}")
    if config in ("draft", "both") and draft is None:
        raise LlamaServerError(f"llama-server:{config} needs the draft model's file")
    return {"plain": [], "ngram": list(NGRAM_DEFAULT),
            "draft": ["--spec-type", "draft-simple", "-md", str(draft)],
            # --spec-default's ngram-mod, then the draft model where it has nothing to offer
            "both": ["--spec-type", "ngram-mod,draft-simple", "--spec-ngram-mod-n-match", "24",
                     "--spec-ngram-mod-n-min", "48", "--spec-ngram-mod-n-max", "64", "-md", str(draft)]}[config]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# llama-server's sampler chain that samples as SpecLens does: min-p on the raw logits, then temperature, then top-k and
# top-p on the tempered distribution, nothing else (its own default chain adds top-k 40, top-p 0.95 and min-p 0.05)
SAMPLERS = ["min_p", "temperature", "top_k", "top_p"]


def chain_fields(sampling: SamplingParams) -> dict:
    """The sampler fields of a request to llama-server that make it sample from SpecLens's distribution."""
    return {"top_k": sampling.top_k, "min_p": sampling.min_p, "samplers": SAMPLERS}


def sampling_fields(max_new_tokens: int, sampling: SamplingParams) -> dict:
    """The fields of a request to llama-server's own endpoints (/completion, /infill) that make it sample as SpecLens
    does (:func:`chain_fields`)."""
    fields = {"n_predict": max_new_tokens, "temperature": sampling.temperature, "top_p": sampling.top_p,
              **chain_fields(sampling), "ignore_eos": sampling.min_tokens >= max_new_tokens}
    if sampling.seed is not None:
        fields["seed"] = sampling.seed
    return fields


def completion_body(prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams) -> dict:
    """A /completion request of ``prompt_ids`` sampled as SpecLens samples (:func:`sampling_fields`)."""
    # every run reads its whole prompt, as SpecLens's timed runs do
    return {"prompt": list(prompt_ids), "return_tokens": True, "cache_prompt": False,
            **sampling_fields(max_new_tokens, sampling)}


class LlamaServer:
    """One llama-server process on loopback; ``start``/``stop``/``restart``, or use it as a context manager."""

    def __init__(self, model: str | Path, *, binary: str | Path | None = None, config: str = "plain",
                 draft: str | Path | None = None, threads: int | None = None, context: int | None = None,
                 api_key: str | None = None, metrics: bool = False, extra: tuple[str, ...] = ()) -> None:
        self.binary = find_binary(binary)
        self.model = Path(model)
        self.config = config
        self.api_key = api_key
        args = [str(self.binary), "-m", str(self.model), "--host", "127.0.0.1", "-np", "1",
                *spec_arguments(config, draft)]
        if threads:
            args += ["-t", str(threads), "-tb", str(threads)]
            if config in ("draft", "both"):
                args += ["-td", str(threads), "-tbd", str(threads)]
        if context:
            args += ["-c", str(context)]
        if api_key:
            args += ["--api-key", api_key]
        if metrics:
            args.append("--metrics")
        self._args = args + list(extra)
        self._process: subprocess.Popen | None = None
        self._log = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout: float = START_TIMEOUT_S) -> "LlamaServer":
        """Start the process and wait until it answers /health (the models loaded and warmed up)."""
        self.stop()
        self.port = free_port()
        self._log = tempfile.TemporaryFile()
        # a build's shared libraries lie beside its binary (the build folder it was linked in may be gone)
        env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(
            p for p in (str(self.binary.parent), os.environ.get("LD_LIBRARY_PATH", "")) if p)}
        self._process = subprocess.Popen(self._args + ["--port", str(self.port)], stdout=self._log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise LlamaServerError(f"llama-server exited with code {self._process.returncode} while starting:\n"
                                       f"{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise LlamaServerError(f"llama-server did not become ready within {timeout:.0f} s")

    def stop(self) -> None:
        if self._process is not None:
            if self._process.poll() is None:
                self._process.terminate()
                try:
                    self._process.wait(10)
                except subprocess.TimeoutExpired:
                    self._process.kill()
                    self._process.wait()
            self._process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def restart(self) -> None:
        """A fresh process: nothing it learnt from earlier requests (n-gram drafts, cached prompts) is left."""
        self.start()

    def log_tail(self, lines: int = 15) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return "\n".join(self._log.read().decode("utf-8", "replace").splitlines()[-lines:])

    def completion(self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams) -> dict:
        """POST /completion on token ids (the very prompt SpecLens decodes); llama-server's JSON answer."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            response = httpx.post(f"{self.url}/completion", json=completion_body(prompt_ids, max_new_tokens, sampling),
                                  headers=headers, timeout=None)
        except httpx.HTTPError as exc:
            raise LlamaServerError(f"llama-server at {self.url} did not answer: {exc}\n{self.log_tail()}") from None
        if response.status_code != 200:
            raise LlamaServerError(f"llama-server answered {response.status_code}: {response.text[:500]}")
        return response.json()

    def __enter__(self) -> "LlamaServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __del__(self) -> None:
        self.stop()
