"""The references SpecLens is measured against, run outside its engine on the same model files and threads.

* ``native``: llama-cpp-python's high-level ``Llama.generate`` loop with its own C sampler — what a Python user
  would otherwise write — on the target's GGUF, with the same context size and threads and llama-cpp-python's
  default context settings, reading the very weights the target loaded.
* ``hf-assisted``: transformers' own assisted generation (``generate(assistant_model=...)``) on the same pair.
* ``llama-server[:ngram|:draft|:both]``: llama.cpp's own server, plain or with its own speculation
  (core.endpoints.llama_server), on the target's GGUF (and the draft's re-quantised one) with the same threads and
  context, fed the same prompt tokens; its own timings give the time to the first token and to the last.

Each returns the same timings as the engine: the time to the first token and to the last.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Protocol

from core.bench.modes import BenchError
from core.sampling import SamplingParams


def earlier_sampling(sampling: SamplingParams) -> SamplingParams:
    """How a regenerated prompt's earlier answer is drawn: sampled with another seed than the timed run, as Regenerate
    asks for a new sample. With the same seed a server would draw the very answer it was shown (seen: llama-server's
    n-gram drafts 2.1x on the regenerations at T 0.7 against 1.0x for SpecLens, whose speculative sampling draws a
    different path from the same seed)."""
    return replace(sampling, seed=sampling.seed + 1) if sampling.seed is not None else sampling


@dataclass(frozen=True)
class RunnerResult:
    tokens: tuple[int, ...]
    seconds: float
    time_to_first_token: float
    drafted: int | None = None      # what the runner's own speculation drafted and the target accepted, if it says
    accepted: int | None = None
    first_tokens: int = 1           # tokens that arrived with the first (a server's first chunk may carry several)


class Runner(Protocol):
    """A reference decoding outside the engine, of the prompt as token ids (``prompt_ids``) or as the conversation
    they template (``messages``, for servers that take a chat). ``regenerate``: the prompt's earlier answer is
    remembered by SpecLens before this run (a runner that learns from what it served is shown it first; the others
    keep nothing)."""

    def run(self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams,
            regenerate: bool = False, messages: list[dict] | None = None) -> RunnerResult:
        ...

    def close(self) -> None:
        ...


class NativeRunner:
    """``Llama.generate`` on the target's loaded weights (llama.cpp backend only)."""

    def __init__(self, target) -> None:
        from core.backends.llamacpp import LlamaCppBackend

        if not isinstance(target, LlamaCppBackend):
            raise BenchError("mode native needs the llama.cpp backend for the target (--backend llama.cpp)")
        import llama_cpp

        self.eos = target.eos_ids
        with _target_weights(target):
            self.llm = llama_cpp.Llama(str(target.path), n_ctx=target.context_length, n_threads=target.n_threads,
                                       n_threads_batch=target.n_threads,
                                       n_gpu_layers=-1 if target.device == "gpu" else 0, verbose=False)
        # the weights are the target's to free: llama-cpp-python must not free them when this runner goes
        self.llm._model._exit_stack.pop_all()
        self._target = target   # and the target must outlive the contexts made on its weights

    def run(self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams,
            regenerate: bool = False, messages: list[dict] | None = None) -> RunnerResult:
        if sampling.seed is not None:
            self.llm.set_seed(sampling.seed)
        tokens: list[int] = []
        t0 = time.perf_counter()
        first = None
        for token in self.llm.generate(prompt_ids, temp=sampling.temperature, top_k=sampling.top_k,
                                       top_p=sampling.top_p, min_p=sampling.min_p, typical_p=1.0, repeat_penalty=1.0,
                                       reset=True):
            if first is None:
                first = time.perf_counter() - t0
            tokens.append(int(token))
            if token in self.eos or len(tokens) >= max_new_tokens:
                break
        return RunnerResult(tuple(tokens), time.perf_counter() - t0, first or 0.0)

    def close(self) -> None:
        self.llm.close()


@contextmanager
def _target_weights(target):
    """Build ``Llama`` on the model ``target`` already loaded instead of a second copy of the file.

    Two copies of the same weights do not run at the same speed: in one bench run on a 2-core EPYC a second,
    identical ``native`` (``native:again``, when each loaded its own copy) decoded at 0.92x of the first on every prompt
    (docs/bench/aa-controls-epyc.md), more than any difference the bench is there to find. Sharing one copy
    compares the loops, not where each copy landed in memory; it also gets the target's weight placement (with
    llama.cpp's default one every decode dies of an illegal instruction on an AMX CPU) and saves the memory of a
    second model. ``Llama`` takes no model object, so its loader is given the target's while it loads; contexts,
    caches and samplers stay its own.
    """
    import llama_cpp._internals as internals

    load = internals.llama_cpp.llama_model_load_from_file
    internals.llama_cpp.llama_model_load_from_file = lambda path, params: target._model
    try:
        yield
    finally:
        internals.llama_cpp.llama_model_load_from_file = load


class HFAssisted:
    """transformers' own assisted generation (``generate(assistant_model=...)``), greedy, on the same pair."""

    def __init__(self, target, draft, pair: str) -> None:
        from core.backends.hf import HFBackend

        if not isinstance(target, HFBackend):
            raise BenchError("mode hf-assisted needs the transformers backend for the target (--backend hf)")
        self.target = target
        if isinstance(draft, HFBackend):
            self.assistant = draft.model
        else:  # the draft runs elsewhere (llama.cpp): load the same draft weights in transformers for this mode
            from core import models
            from core.assembly import assemble

            self.assistant = models.load_backend(assemble(models.PAIRS[pair].draft), "hf",
                                                 device=target.device).model

    def run(self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams,
            regenerate: bool = False, messages: list[dict] | None = None) -> RunnerResult:
        import torch

        if not sampling.greedy:
            raise BenchError("hf-assisted is benchmarked greedy only: use --temperature 0")
        ids = torch.tensor([prompt_ids], device=self.target.device)
        eos = sorted(self.target.eos_ids)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.target.model.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=self.assistant,
                                             do_sample=False, max_new_tokens=max_new_tokens,
                                             eos_token_id=eos or None, pad_token_id=eos[0] if eos else None)
        seconds = time.perf_counter() - t0
        # transformers' loop reports no first-token time; its first token costs one plain step like everyone's
        return RunnerResult(tuple(int(t) for t in out[0, len(prompt_ids):]), seconds, 0.0)

    def close(self) -> None:
        """Nothing to free beyond the models the pair owns."""


class LlamaServerRunner:
    """llama.cpp's own server in one configuration (core.endpoints.llama_server.CONFIGS) on the target's file and
    threads (and the draft's file, as SpecLens drafts with it).

    A configuration that learns from the requests it served (ngram-mod drafts from every earlier text) gets a fresh
    process before each timed run, as SpecLens's own memory starts each run from the same state; a regenerated prompt
    is first answered once, untimed, by that process, as SpecLens first remembers the earlier answer."""

    def __init__(self, target, draft, config: str, binary: str | None = None) -> None:
        from core.backends.llamacpp import LlamaCppBackend
        from core.endpoints.llama_server import LlamaServer

        if not isinstance(target, LlamaCppBackend):
            raise BenchError("the llama-server modes need the llama.cpp backend for the target (--backend llama.cpp)")
        draft_path = getattr(draft, "path", None) if config in ("draft", "both") else None
        self.server = LlamaServer(target.path, binary=binary, config=config, draft=draft_path,
                                  threads=target.n_threads, context=target.context_length)
        self.learns = config in ("ngram", "both")
        self.server.start()

    def run(self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams,
            regenerate: bool = False, messages: list[dict] | None = None) -> RunnerResult:
        if self.learns:
            self.server.restart()
            if regenerate:
                self.server.completion(prompt_ids, max_new_tokens, earlier_sampling(sampling))
        out = self.server.completion(prompt_ids, max_new_tokens, sampling)
        t = out["timings"]
        prompt_s, decode_s = t["prompt_ms"] / 1000, t["predicted_ms"] / 1000
        return RunnerResult(tuple(int(x) for x in out["tokens"]), prompt_s + decode_s, prompt_s,
                            t.get("draft_n", 0), t.get("draft_n_accepted", 0))

    def close(self) -> None:
        self.server.stop()


class EndpointRunner:
    """Any OpenAI-compatible server (``endpoint:URL[#model]``), sent the prompt's conversation through the openai client
    and timed on this machine's clock; its tokens are the answer's text in the target's tokenizer (the server is meant
    to run the same model, for the greedy identity check). A server keeps whatever it keeps between requests: a
    regenerated prompt is answered once, untimed, first, as SpecLens remembers its earlier answer."""

    def __init__(self, spec: str, target, api_key: str = "") -> None:
        from core.endpoints.client import Endpoint, EndpointError, EndpointRun, probe

        url, _, model = spec.partition("#")
        endpoint = Endpoint(url, api_key)
        try:
            found = probe(endpoint)
        except EndpointError as exc:
            raise BenchError(str(exc)) from None
        if model and model not in found.models:
            raise BenchError(f"{url} has no model {model!r}; it lists {', '.join(found.models)}")
        self.endpoint = Endpoint(url, api_key, model or found.models[0])
        self.engine = found.engine
        self._run = lambda: EndpointRun.for_target(self.endpoint, self.engine, target)

    def run(self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams,
            regenerate: bool = False, messages: list[dict] | None = None) -> RunnerResult:
        if messages is None:
            raise BenchError("an endpoint is sent the prompt's conversation, and none was given")
        if regenerate:
            self._answer(messages, max_new_tokens, earlier_sampling(sampling))
        out = self._answer(messages, max_new_tokens, sampling)
        stats = out.result.stats
        return RunnerResult(out.result.tokens, stats.seconds, stats.time_to_first_token or stats.seconds,
                            out.stats.drafted, out.stats.accepted, max(stats.first_tokens, 1))

    def _answer(self, messages, max_new_tokens: int, sampling: SamplingParams):
        run = self._run()
        for _ in run.stream(messages, max_new_tokens, sampling):
            pass
        return run.result

    def close(self) -> None:
        """Nothing to free: the server is someone else's."""