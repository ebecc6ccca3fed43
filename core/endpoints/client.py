"""Another engine behind an OpenAI-compatible URL (llama-server, vLLM, SGLang, another SpecLens), decoded through the
real ``openai`` client and recorded the way SpecLens records its own runs: one StepEvent per streamed chunk, timed on
this machine's clock from the moment the request leaves (time to first token, then decode tokens per second after
it), with the engine's own speculative statistics read in its own names (core.endpoints.spec_stats).

A chunk carries text, not token ids: its tokens are counted with the local tokenizer when one is given (the race
runs both sides on the same model), else one per chunk, and the total is corrected to the engine's own
``usage.completion_tokens`` at the end.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath
from typing import Callable, Iterator, Sequence

import httpx
import openai

from core.endpoints import spec_stats
from core.endpoints.llama_server import chain_fields, sampling_fields
from core.endpoints.spec_stats import SpecStats
from core.events import GenerationResult, GenerationStats, Origin, StepEvent, StopReason
from core.sampling import SamplingParams

TIMEOUT_S = 600.0
PROBE_TIMEOUT_S = 10.0


class EndpointError(RuntimeError):
    """The endpoint could not be used; the message says why in a user's words."""


@dataclass(frozen=True)
class Endpoint:
    """Where another engine listens: its base URL (with or without /v1), the API key, the model to ask for ("" for
    the first the endpoint lists)."""

    url: str
    api_key: str = ""
    model: str = ""

    @property
    def root(self) -> str:
        url = self.url.strip().rstrip("/")
        if not url.startswith(("http://", "https://")):
            url = "http://" + url
        return url[:-3] if url.endswith("/v1") else url

    @property
    def base(self) -> str:
        return self.root + "/v1"

    @property
    def label(self) -> str:
        model = self.model or "?"
        if model.startswith("/"):   # llama-server names its model by the file it loaded: the folders only crowd it
            model = PurePosixPath(model).name
        return f"{model} @ {self.root.split('://', 1)[1]}"


@dataclass(frozen=True)
class EndpointResult:
    """A run on an endpoint: the recording every face draws, and what the engine said about its speculation."""

    result: GenerationResult
    stats: SpecStats
    engine: str
    finish_reason: str
    usage: dict = field(default_factory=dict)     # as the engine reported it (OpenAI's, with its details)
    timings: dict = field(default_factory=dict)   # llama-server's timings, where the engine gives them


@dataclass
class Probe:
    """What an endpoint says about itself."""

    models: list[str]
    engine: str
    owned_by: str = ""
    headers: dict = field(default_factory=dict)


def _explain(exc: Exception, endpoint: Endpoint) -> EndpointError:
    where = endpoint.root
    if isinstance(exc, openai.AuthenticationError) or getattr(exc, "status_code", None) in (401, 403):
        return EndpointError(f"{where} refused the API key (HTTP {getattr(exc, 'status_code', 401)}): check the key "
                             "in Settings")
    if isinstance(exc, (openai.APIConnectionError, httpx.ConnectError, httpx.ConnectTimeout)):
        return EndpointError(f"cannot reach {where}: is the server running, and is the address right? ({exc})")
    if isinstance(exc, openai.NotFoundError) or getattr(exc, "status_code", None) == 404:
        return EndpointError(f"{where} does not answer like an OpenAI-compatible API (404 on {endpoint.base}): give "
                             "its base URL, e.g. http://127.0.0.1:8080/v1")
    if isinstance(exc, openai.APIStatusError):
        return EndpointError(f"{where} answered HTTP {exc.status_code}: {exc.message}")
    if isinstance(exc, (openai.APIResponseValidationError, ValueError)):
        return EndpointError(f"{where} does not answer like an OpenAI-compatible API ({exc})")
    return EndpointError(f"{where}: {type(exc).__name__}: {exc}")


def probe(endpoint: Endpoint) -> Probe:
    """The models an endpoint lists and which engine it is (EndpointError with the reason when it cannot say)."""
    headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
    try:
        response = httpx.get(f"{endpoint.base}/models", headers=headers, timeout=PROBE_TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise _explain(exc, endpoint) from None
    if response.status_code in (401, 403):
        raise EndpointError(f"{endpoint.root} refused the API key (HTTP {response.status_code}): check the key")
    try:
        data = response.json()["data"]
        models = [str(m["id"]) for m in data]
        owned_by = str(data[0].get("owned_by", "")) if data else ""
    except (ValueError, KeyError, TypeError, IndexError):
        raise EndpointError(f"{endpoint.root} does not answer like an OpenAI-compatible API: GET {endpoint.base}/models"
                            f" gave HTTP {response.status_code} without a model list") from None
    if not models:
        raise EndpointError(f"{endpoint.root} lists no models")
    return Probe(models, spec_stats.detect(owned_by, dict(response.headers)), owned_by, dict(response.headers))


def scrape(endpoint: Endpoint) -> str | None:
    """The endpoint's Prometheus text, or None where it has none (llama-server without --metrics, a remote API)."""
    headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
    try:
        response = httpx.get(f"{endpoint.root}/metrics", headers=headers, timeout=PROBE_TIMEOUT_S)
    except httpx.HTTPError:
        return None
    return response.text if response.status_code == 200 else None


def _extra_body(engine: str, sampling: SamplingParams, max_new_tokens: int, prediction: str | None) -> dict:
    """What this engine needs beyond OpenAI's fields to sample as SpecLens does and to report its speculation."""
    body: dict = {}
    if engine == spec_stats.SGLANG:
        body["return_spec_tokens_details"] = True
    if engine == spec_stats.LLAMA_CPP:   # its defaults add top-k 40, top-p 0.95 and min-p 0.05
        body.update(chain_fields(sampling))
        if sampling.min_tokens:   # it has no min_tokens, only "never stop at end-of-text"
            body["ignore_eos"] = sampling.min_tokens >= max_new_tokens
    else:                         # vLLM's and SGLang's extra sampling fields
        body.update({name: value for name, value in (("top_k", sampling.top_k), ("min_p", sampling.min_p)) if value})
    if sampling.min_tokens and engine != spec_stats.LLAMA_CPP:
        body["min_tokens"] = sampling.min_tokens
    if prediction is not None:
        body["prediction"] = {"type": "content", "content": prediction}
    return body


class EndpointRun:
    """One chat completion streamed from an endpoint, recorded as StepEvents; ``count_tokens`` counts a chunk's
    tokens (a local tokenizer of the same model), ``tokenize`` gives the whole answer's ids (for the greedy identity
    check against a local run)."""

    def __init__(self, endpoint: Endpoint, engine: str, *, count_tokens: Callable[[str], int] | None = None,
                 tokenize: Callable[[str], list[int]] | None = None) -> None:
        self.endpoint, self.engine = endpoint, engine
        self.count_tokens = count_tokens or (lambda text: 1 if text else 0)
        self.tokenize = tokenize
        self.client = openai.OpenAI(base_url=endpoint.base, api_key=endpoint.api_key or "none", max_retries=0,
                                    timeout=TIMEOUT_S)
        self.result: EndpointResult | None = None

    @classmethod
    def for_target(cls, endpoint: Endpoint, engine: str, target) -> "EndpointRun":
        """A run read with ``target``'s tokenizer: the local model the endpoint is meant to serve too."""
        return cls(endpoint, engine, count_tokens=lambda text: len(target.tokenize(text)), tokenize=target.tokenize)

    def stream(self, messages: Sequence[dict], max_new_tokens: int, sampling: SamplingParams,
               cancel: threading.Event | None = None, prediction: str | None = None,
               tools: Sequence[dict] = ()) -> Iterator[StepEvent]:
        """One StepEvent per chunk that carries text (an answer's content, or the arguments of the ``tools`` it calls);
        the EndpointResult is then in ``self.result``. ``cancel`` closes the stream (the endpoint stops generating, as
        a client that disconnects)."""
        asked = {"messages": list(messages), **({"tools": list(tools)} if tools else {})}
        chunks = self._create(self.client.chat.completions.create, asked, max_new_tokens, sampling, prediction)
        return self._recorded(_openai_pieces(chunks, _chat_text), sampling, cancel)

    def stream_text(self, prompt: str, max_new_tokens: int, sampling: SamplingParams,
                    cancel: threading.Event | None = None) -> Iterator[StepEvent]:
        """:meth:`stream` of a text completion of the raw ``prompt`` (an editor's fill-in-the-middle prompt, its
        special tokens spelt out)."""
        chunks = self._create(self.client.completions.create, {"prompt": prompt}, max_new_tokens, sampling)
        return self._recorded(_openai_pieces(chunks, lambda c: c.text or ""), sampling, cancel)

    def stream_infill(self, body: dict, max_new_tokens: int, sampling: SamplingParams,
                      cancel: threading.Event | None = None) -> Iterator[StepEvent]:
        """:meth:`stream` of a completion at the cursor from llama-server's own ``/infill`` (``body``: its
        ``input_prefix``, ``prompt``, ``input_suffix``, ``input_extra``), as editor plugins ask for it."""
        asked = {**body, **sampling_fields(max_new_tokens, sampling), "stream": True}
        headers = {"Authorization": f"Bearer {self.endpoint.api_key}"} if self.endpoint.api_key else {}
        http = httpx.Client(timeout=TIMEOUT_S)
        try:
            response = http.send(http.build_request("POST", f"{self.endpoint.root}/infill", json=asked,
                                                    headers=headers), stream=True)
        except httpx.HTTPError as exc:
            http.close()
            raise _explain(exc, self.endpoint) from None
        if response.status_code != 200:
            message = response.read().decode("utf-8", errors="replace")[:500]
            http.close()
            raise EndpointError(f"{self.endpoint.root}/infill answered HTTP {response.status_code}: {message}")
        return self._recorded(_native_pieces(http, response), sampling, cancel)

    def _create(self, create: Callable, asked: dict, max_new_tokens: int, sampling: SamplingParams,
                prediction: str | None = None):
        try:
            return create(
                model=self.endpoint.model, **asked, max_tokens=max_new_tokens,
                temperature=sampling.temperature, top_p=sampling.top_p,
                seed=sampling.seed if sampling.seed is not None else openai.NOT_GIVEN, stream=True,
                stream_options={"include_usage": True},
                extra_body=_extra_body(self.engine, sampling, max_new_tokens, prediction))
        except openai.OpenAIError as exc:
            raise _explain(exc, self.endpoint) from None

    def _recorded(self, pieces: Iterator["_Piece"], sampling: SamplingParams,
                  cancel: threading.Event | None) -> Iterator[StepEvent]:
        before = scrape(self.endpoint) if self.engine in (spec_stats.VLLM, spec_stats.LLAMA_CPP) else None
        t0 = time.perf_counter()
        steps: list[StepEvent] = []
        stats = GenerationStats()
        text: list[str] = []
        last: dict = {}
        finish = ""
        completion = None
        try:
            for piece in pieces:
                if cancel is not None and cancel.is_set():
                    pieces.close()
                    finish = "cancelled"
                    break
                last = piece.payload
                completion = piece.completion_tokens if piece.completion_tokens is not None else completion
                finish = piece.finish or finish
                if not piece.text:
                    continue
                now = time.perf_counter() - t0
                n = max(1, self.count_tokens(piece.text))
                first = stats.time_to_first_token is None
                stats = replace(stats, new_tokens=stats.new_tokens + n, seconds=now, target_calls=stats.target_calls + 1,
                                time_to_first_token=now if first else stats.time_to_first_token,
                                first_tokens=n if first else stats.first_tokens)
                start = sum(len(t) for t in text)
                text.append(piece.text)
                steps.append(StepEvent(
                    step=len(steps), nodes=(), accepted_path=(), tokens=(), origins=(Origin.CORRECTION,),
                    token_texts=(piece.text,), specials=("",), text=piece.text, spans=((start, start + len(piece.text)),),
                    margins=(), draft_seconds=0.0, verify_seconds=0.0, timestamp=now, stats=stats,
                    strategy=self.endpoint.label, greedy=sampling.greedy))
                yield steps[-1]
        except (openai.OpenAIError, httpx.HTTPError, ValueError) as exc:
            raise EndpointError(f"the stream from {self.endpoint.root} broke off after {len(steps)} chunks "
                                f"({type(exc).__name__}: {exc}); the text so far is kept") from None
        if not finish:
            raise EndpointError(f"the stream from {self.endpoint.root} ended without saying why (no finish_reason) "
                                f"after {len(steps)} chunks; the text so far is kept")
        if completion is not None and steps:
            stats = replace(stats, new_tokens=completion)
        reported = spec_stats.from_response(self.engine, last, completion)
        if not reported.reported and before is not None:
            after = scrape(self.endpoint)
            if after is not None:
                reported = spec_stats.from_metrics(before, after, self.engine)
        stats = replace(stats, drafted=reported.drafted or 0, accepted=reported.accepted or 0,
                        target_calls=reported.verify_steps or stats.target_calls,
                        accepted_by_depth=reported.accepted_per_position or ())
        answer = "".join(text)
        stop = {"stop": StopReason.EOS, "length": StopReason.MAX_TOKENS, "cancelled": StopReason.CANCELLED}.get(
            finish, StopReason.EOS)
        tokens = tuple(self.tokenize(answer)) if self.tokenize is not None else ()
        result = GenerationResult(tokens, answer, tuple(steps), stats, stop)
        self.result = EndpointResult(result, reported, self.engine, finish, last.get("usage") or {},
                                     last.get("timings") or {})


@dataclass(frozen=True)
class _Piece:
    """One streamed chunk as the recording reads it, whichever API sent it."""

    text: str
    finish: str                    # OpenAI's finish_reason, "" until the end
    completion_tokens: int | None  # the engine's own count, where the chunk gives it
    payload: dict                  # the chunk itself (the last one carries the engine's timings or usage)


def _chat_text(choice) -> str:
    """What a chat chunk's choice says: its content, then the arguments of the calls it makes (a server streams them
    piece by piece, or whole at the end)."""
    delta = choice.delta
    if delta is None:
        return ""
    return (delta.content or "") + "".join(call.function.arguments or "" for call in delta.tool_calls or ()
                                           if call.function is not None)


def _openai_pieces(chunks, piece_of: Callable[[object], str]) -> Iterator[_Piece]:
    """OpenAI's chunks; ``piece_of`` says where a choice of this kind of completion puts its text."""
    try:
        for chunk in chunks:
            usage = getattr(chunk.usage, "completion_tokens", None) if chunk.usage else None
            choice = chunk.choices[0] if chunk.choices else None
            yield _Piece(piece_of(choice) if choice is not None else "",
                         (choice.finish_reason or "") if choice is not None else "", usage, chunk.model_dump())
    finally:
        chunks.close()


def _native_pieces(http: httpx.Client, response: httpx.Response) -> Iterator[_Piece]:
    """llama-server's own stream: ``data:`` lines of ``content``, the last with ``stop`` and its ``stop_type``."""
    try:
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            chunk = json.loads(line[len("data: "):])
            if "error" in chunk:
                raise ValueError(chunk["error"].get("message", chunk["error"]))
            done = chunk.get("stop") is True
            finish = ("stop" if chunk.get("stop_type") in ("eos", "word") else "length") if done else ""
            yield _Piece(chunk.get("content", ""), finish, chunk.get("tokens_predicted") if done else None, chunk)
    finally:
        response.close()
        http.close()
