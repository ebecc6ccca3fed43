"""The HTTP face of the engine (FastAPI): it only translates. OpenAI's chat and text completions, its Responses API
(core.serve.responses), Anthropic's Messages API (core.serve.messages) and llama-server's own endpoints
(core.serve.native, core.serve.vocab).

Requests become engine jobs (core.serve.job) with a cancel event, queued in order on the one engine thread; the
job's items become each API's JSON or server-sent events; finished requests become metrics. Every refusal has the
API's error shape (OpenAI's ``{"error": {"message", "type", "param", "code"}}``, Anthropic's on its own) and a 4xx
status, and no traceback ever reaches a client. A client that goes away cancels its generation within one step.
"""
from __future__ import annotations

import asyncio
import json
import logging
import secrets
import threading
import time
import uuid
from datetime import datetime, timezone
from importlib import metadata
from dataclasses import dataclass
from typing import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from core.serve import vocab
from core.serve.executor import Executor
from core.serve.job import Delta, Finished, Observer, ServedModels, Started, run_request
from core.serve.kept import ResponseStore
from core.serve.messages import MessagesReply, count_body, error_body, parse_messages
from core.serve.metrics import CONTENT_TYPE, ServerMetrics
from core.serve.native import NativeReply, parse_completion, parse_infill, props
from core.serve.request import RequestError, ServeRequest, json_object, messages_of, parse
from core.serve.responses import ResponsesReply, parse_responses
from core.serve.tools import Argued, Began, Called, Holdback, PartsReply, Said, offered

log = logging.getLogger(__name__)

MAX_BODY = 16 * 2**20      # bytes: a long file to edit and its prediction fit many times over
POLL_S = 0.25              # how often a waiting request looks whether its client is still there
FINGERPRINT = "speclens"
MESSAGES = "/v1/messages"  # Anthropic's API: its own error shape and named stream events


@dataclass(frozen=True)
class _Failed:
    error: BaseException


class _ClientGone(Exception):
    pass


class _Queue:
    """Requests submitted and not yet finished, and whether one is decoding (for --max-queue and the status bar)."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.pending = 0
        self.running = 0
        self.metrics = metrics
        self.lock = threading.Lock()
        self.listeners: list = []

    @property
    def waiting(self) -> int:
        return self.pending - self.running

    def change(self, pending: int = 0, running: int = 0) -> None:
        with self.lock:
            self.pending += pending
            self.running += running
            waiting, running_now = self.waiting, self.running
        self.metrics.queue(waiting, running_now)
        for listener in self.listeners:
            listener(waiting, running_now)


def _error(exc: RequestError, path: str = "") -> JSONResponse:
    """A refusal in the shape of the API asked: Anthropic's on its Messages API, OpenAI's elsewhere."""
    body = error_body(exc) if path.startswith(MESSAGES) else exc.body()
    return JSONResponse(body, status_code=exc.status, headers=exc.headers)


def create_app(models: ServedModels, executor: Executor, *, api_key: str | None = None, max_queue: int = 16,
               observer: Observer | None = None, max_body: int = MAX_BODY) -> FastAPI:
    """The ASGI app serving ``models`` on ``executor`` (its one engine thread)."""
    app = FastAPI(title="SpecLens", docs_url=None, redoc_url=None, openapi_url=None)
    metrics = ServerMetrics(models.name)
    queue = _Queue(metrics)
    kept = ResponseStore()
    app.state.queue, app.state.metrics, app.state.models, app.state.kept = queue, metrics, models, kept
    created = int(time.time())

    @app.exception_handler(RequestError)
    async def request_error(request: Request, exc: RequestError) -> JSONResponse:
        metrics.refused(exc.status)
        return _error(exc, request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        metrics.refused(exc.status_code)
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return _error(RequestError(str(exc.detail), exc.status_code, kind=kind), request.url.path)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(RequestError(f"invalid request: {exc.errors()[:1]}"), request.url.path)

    @app.exception_handler(_ClientGone)
    async def client_gone(request: Request, exc: _ClientGone) -> Response:
        return Response(status_code=499)   # nobody is there to read it (nginx's "client closed request")

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("serving %s failed", request.url.path)
        metrics.refused(500)
        return _error(RequestError(f"the server failed to answer: {type(exc).__name__}: {exc}", 500,
                                   kind="server_error"), request.url.path)

    @app.middleware("http")
    async def authorise(request: Request, call_next):
        if api_key and request.url.path != "/health":
            # OpenAI's clients send the key as a bearer token, Anthropic's in x-api-key
            bearer = request.headers.get("authorization", "")
            given = (bearer.removeprefix("Bearer ") if bearer.startswith("Bearer ") else "",
                     request.headers.get("x-api-key", ""))
            if not any(secrets.compare_digest(key.encode(), api_key.encode()) for key in given):
                metrics.refused(401)
                return _error(RequestError("Incorrect API key provided: pass it as 'Authorization: Bearer KEY' "
                                           "(or as 'x-api-key: KEY').", 401, code="invalid_api_key"),
                              request.url.path)
        response = await call_next(request)
        response.headers["X-Served-By"] = FINGERPRINT
        return response

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": models.name, "waiting": queue.waiting, "running": queue.running}

    @app.get("/v1/models")
    async def list_models() -> dict:
        """The one model, as OpenAI's, Anthropic's and llama-server's clients each read a model list."""
        model = {"id": models.name, "object": "model", "created": created, "owned_by": FINGERPRINT,
                 "max_model_len": models.target.context_length,
                 "meta": {"n_ctx": models.target.context_length, "n_vocab": models.target.vocab_size},
                 "type": "model", "display_name": models.name,
                 "created_at": datetime.fromtimestamp(created, timezone.utc).isoformat().replace("+00:00", "Z")}
        return {"object": "list", "data": [model], "has_more": False, "first_id": models.name,
                "last_id": models.name}

    @app.get("/props")
    async def properties() -> dict:
        return await asyncio.to_thread(props, models, _build())

    # llama-server's tokenizer endpoints (core.serve.vocab): off the engine's thread, beside a decoding answer
    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict:
        return await asyncio.to_thread(vocab.tokenize, models.target, await _json_body(request, max_body))

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict:
        return await asyncio.to_thread(vocab.detokenize, models.target, await _json_body(request, max_body))

    @app.post("/apply-template")
    async def apply_template(request: Request) -> dict:
        body = json_object(await _json_body(request, max_body))
        messages, tools = messages_of(body), offered(body)
        ids = await asyncio.to_thread(models.chat_prompt, messages, tools)
        return {"prompt": vocab.text_of(models.target, ids)}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.text(), media_type=CONTENT_TYPE)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _complete(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _complete(request, chat=False)

    @app.post("/infill")
    async def infill(request: Request):
        """llama-server's own endpoint for completion at the cursor (core.serve.native); like llama-server, it serves
        whatever model it has, whichever a request names."""
        req, fields, ignored = parse_infill(await _json_body(request, max_body), models.target.context_length)
        return await _native(req, fields, ignored, request)

    @app.post("/completion")
    @app.post("/completions")
    async def native_completion(request: Request):
        """llama-server's own text completion (core.serve.native), at both its paths; it too serves whatever model
        it has."""
        req, fields, ignored = parse_completion(await _json_body(request, max_body), models.target.context_length)
        return await _native(req, fields, ignored, request)

    @app.post(MESSAGES)
    async def messages(request: Request):
        """Anthropic's Messages API (core.serve.messages); like llama-server, whatever model a request names."""
        req = parse_messages(await _json_body(request, max_body), models.target.context_length)
        items, cancel, started = await _start(req, request)
        return await _answer(MessagesReply(req, models.name, started), req, items, request, cancel)

    @app.post("/v1/responses")
    async def responses(request: Request):
        """OpenAI's Responses API (core.serve.responses); like llama-server, whatever model a request names."""
        asked = parse_responses(await _json_body(request, max_body), models.target.context_length, kept)
        items, cancel, started = await _start(asked.request, request)
        return await _answer(ResponsesReply(asked, models.name, started, kept), asked.request, items, request, cancel)

    @app.get("/v1/responses/{response_id}")
    async def kept_response(response_id: str) -> dict:
        return kept.find(response_id).response

    @app.delete("/v1/responses/{response_id}")
    async def forget_response(response_id: str) -> dict:
        kept.forget(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    @app.post(f"{MESSAGES}/count_tokens")
    async def count_tokens(request: Request) -> dict:
        chat, tools = count_body(await _json_body(request, max_body))
        return {"input_tokens": len(await asyncio.to_thread(models.chat_prompt, chat, tools))}

    async def _native(req: ServeRequest, fields: tuple[str, ...], ignored: list[str], request: Request):
        items, cancel, started = await _start(req, request)
        return await _answer(NativeReply(req, models.name, fields, ignored, started), req, items, request, cancel)

    async def _complete(request: Request, chat: bool):
        body = await _json_body(request, max_body)
        req = parse(body, chat, models.target.context_length)
        if req.model and req.model != models.name:
            raise RequestError(f"The model '{req.model}' does not exist here: this server has '{models.name}' "
                               "(GET /v1/models).", 404, param="model", code="model_not_found")
        items, cancel, _ = await _start(req, request)
        return await _answer(_Reply(req, models.name, chat), req, items, request, cancel)

    async def _start(req: ServeRequest, request: Request) -> tuple[asyncio.Queue, threading.Event, Started]:
        """The request queued on the engine, once its prompt was accepted (its refusal raised)."""
        if queue.pending and queue.waiting >= max_queue:   # it would have to wait, and enough already do
            raise RequestError(f"{queue.waiting} requests are already waiting (--max-queue {max_queue}); try again "
                               "shortly.", 503, code="server_busy", kind="server_error", headers={"Retry-After": "5"})
        client = f"{request.client.host}:{request.client.port}" if request.client else "?"
        agent = request.headers.get("user-agent", "")
        items, cancel = _submit(req, f"{client} {agent}".strip())
        first = await _next(items, request, cancel)
        if isinstance(first, _Failed):
            raise first.error
        return items, cancel, first

    async def _answer(reply, req: ServeRequest, items: asyncio.Queue, request: Request, cancel: threading.Event):
        if req.stream:
            return StreamingResponse(_stream(reply, items, request, cancel), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return JSONResponse(reply.whole(await _collect(items, request, cancel)))

    def _submit(req: ServeRequest, client: str) -> tuple[asyncio.Queue, threading.Event]:
        loop = asyncio.get_running_loop()
        items: asyncio.Queue = asyncio.Queue()
        cancel = threading.Event()

        def push(item) -> None:
            loop.call_soon_threadsafe(items.put_nowait, item)

        def job() -> None:
            if cancel.is_set():   # its client left while it waited
                return
            queue.change(running=1)
            try:
                run_request(models, req, push, cancel, observer, client)
            finally:
                queue.change(running=-1)

        def done(future) -> None:
            queue.change(pending=-1)
            if future.exception() is not None:
                push(_Failed(future.exception()))

        queue.change(pending=1)
        executor.submit(job).add_done_callback(done)
        return items, cancel

    async def _collect(items: asyncio.Queue, request: Request, cancel: threading.Event) -> list:
        out = []
        while True:
            item = await _next(items, request, cancel)
            out.append(item)
            if isinstance(item, Finished):
                _record(item)
                return out
            if isinstance(item, _Failed):
                raise item.error

    async def _stream(reply: "_Reply | NativeReply", items: asyncio.Queue, request: Request,
                      cancel: threading.Event) -> AsyncIterator[str]:
        try:
            for chunk in reply.opening():
                yield _sse(chunk, reply.NAMED)
            while True:
                item = await _next(items, request, cancel)
                if isinstance(item, Delta):
                    for chunk in reply.deltas(item):
                        yield _sse(chunk, reply.NAMED)
                elif isinstance(item, Finished):
                    _record(item)
                    for chunk in reply.closing(item):
                        yield _sse(chunk, reply.NAMED)
                    if reply.END:
                        yield reply.END
                    return
                elif isinstance(item, _Failed):   # after the stream began: said in-band, as OpenAI and Anthropic do
                    log.warning("a streamed request failed: %s", item.error)
                    failed = RequestError(f"generation failed: {item.error}", 500, kind="server_error")
                    yield _sse(error_body(failed) if reply.NAMED else failed.body(), reply.NAMED)
                    return
        except _ClientGone:
            return
        finally:
            cancel.set()   # a client that went away stops its generation within one step

    def _record(finished: Finished) -> None:
        metrics.observe(finished.result, finished.finish_reason, finished.usage)

    return app


async def _json_body(request: Request, limit: int):
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise RequestError(f"the request body is {int(declared)} bytes; the limit is {limit}", 413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(f"the request body is over the limit of {limit} bytes", 413)
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}") from None


async def _next(items: asyncio.Queue, request: Request, cancel: threading.Event):
    """The job's next item; cancels the job and gives up if the client disconnects meanwhile."""
    while True:
        try:
            return await asyncio.wait_for(items.get(), POLL_S)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                cancel.set()
                raise _ClientGone() from None


class _Reply(PartsReply):
    """OpenAI's response shapes for one request: a chat completion or a text completion, whole or streamed. A chat
    that offers tools has its answer's calls cut out as ``tool_calls`` (core.serve.tools); streamed, its text goes
    out as it comes up to where a call begins, then each call's name and its arguments as they are written."""

    END = "data: [DONE]\n\n"     # what a stream ends with, after its closing chunks
    NAMED = False                  # its events are data alone

    def __init__(self, req: ServeRequest, model: str, chat: bool) -> None:
        self.req, self.model, self.chat = req, model, chat
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.held = Holdback(req.tools)

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": FINGERPRINT}

    def _chunk(self, choice: dict) -> dict:
        head = self._head("chat.completion.chunk" if self.chat else "text_completion")
        out = {**head, "choices": [{"index": 0, **choice, "logprobs": None}]}
        if self.req.include_usage:
            out["usage"] = None
        return out

    def _text_chunk(self, text: str) -> dict:
        return self._chunk({"delta": {"content": text}, "finish_reason": None} if self.chat
                           else {"text": text, "finish_reason": None})

    def opening(self) -> list[dict]:
        return [self._chunk({"delta": {"role": "assistant", "content": ""}, "finish_reason": None} if self.chat
                            else {"text": "", "finish_reason": None})]

    def _said(self, text: str) -> list[dict]:
        return [self._text_chunk(text)]

    def _began(self, part: Began) -> list[dict]:
        call = {"index": part.index, "id": part.id, "type": "function",
                "function": {"name": part.name, "arguments": ""}}
        return [self._chunk({"delta": {"tool_calls": [call]}, "finish_reason": None})]

    def _argued(self, part: Argued) -> list[dict]:
        call = {"index": part.index, "function": {"arguments": part.text}}
        return [self._chunk({"delta": {"tool_calls": [call]}, "finish_reason": None})]

    def _called(self, part: Called) -> list[dict]:
        return []

    def closing(self, finished: Finished) -> list[dict]:
        """What was held back and the rest of the calls, the finish chunk, then the usage chunk when asked;
        llama-server's timings ride on the last one."""
        chunks = self._events(self.held.finish(finished.text, opened=True))     # its opening chunk's empty text
        reason = _called(finished.finish_reason) if self.held.called else finished.finish_reason
        last = self._chunk({"delta": {}, "finish_reason": reason} if self.chat
                           else {"text": "", "finish_reason": reason})
        chunks.append(last)
        if self.req.include_usage:
            chunks.append({**self._head(last["object"]), "choices": [], "usage": finished.usage})
        chunks[-1]["timings"] = finished.timings
        return chunks

    def whole(self, items: list) -> dict:
        finished = items[-1]
        reason = finished.finish_reason
        if not self.chat:
            choice = {"text": finished.text}
        else:
            parts = self.held.whole(finished.text)
            content = "".join(p.text for p in parts if isinstance(p, Said))
            calls = [p.call.openai() for p in parts if isinstance(p, Called)]
            choice = {"message": {"role": "assistant", "content": content}}
            if calls:
                choice["message"] = {"role": "assistant", "content": content.strip() or None, "tool_calls": calls}
                reason = _called(reason)
        return {**self._head("chat.completion" if self.chat else "text_completion"),
                "choices": [{"index": 0, **choice, "logprobs": None, "finish_reason": reason}],
                "usage": finished.usage, "timings": finished.timings}


def _called(reason: str) -> str:
    """OpenAI's finish reason for an answer that calls tools: it ended to let them run, unless it was cut short."""
    return "tool_calls" if reason == "stop" else reason


def _sse(payload: dict, named: bool = False) -> str:
    """A server-sent event; ``named``: under its payload's type (Anthropic's streams name each event)."""
    data = f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"
    return f"event: {payload['type']}\n{data}" if named else data


def _build() -> str:
    try:
        return f"{FINGERPRINT} {metadata.version('speclens')}"
    except metadata.PackageNotFoundError:    # run from a checkout that was never installed
        return f"{FINGERPRINT} (not installed)"

