"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``), as llama-server also serves it:
for agents written against it (Claude Code with ``ANTHROPIC_BASE_URL``, the ``anthropic`` SDK).

A request is read into the chat request the OpenAI endpoint decodes (core.serve.request), so the engine, the prompt
cache and the lossless guarantees are the same: ``system``, ``messages`` of text, ``tool_use`` and ``tool_result``
blocks, ``tools`` (``input_schema``), ``tool_choice`` auto or none, ``max_tokens`` (required), ``stop_sequences``,
``temperature`` (default 1), ``top_p``, ``top_k``, ``stream``. The answer is a message of ``text`` and ``tool_use``
blocks (calls read as the chat endpoint reads them, core.serve.tools), whole or as Anthropic's named stream events.
Like llama-server it serves its one model whatever model a request names (an agent names its own). Images and
documents are refused, not dropped; earlier ``thinking`` blocks are not rendered again.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import replace

from core.serve.request import (RequestError, ServeRequest, json_object, messages_of, parse, stop_sequences,
                                text_of, within)
from core.serve.tools import Argued, Began, Called, Holdback, PartsReply, Said, offered

MAX_STOPS = 64
SKIPPED = ("thinking", "redacted_thinking")    # an assistant's earlier reasoning: templates drop it too
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


def error_body(exc: RequestError) -> dict:
    """A refusal in Anthropic's shape."""
    return {"type": "error", "error": {"type": ERROR_TYPES.get(exc.status, "api_error"), "message": exc.message}}


def _turn(message, where: str) -> list[dict]:
    """One Anthropic message as chat messages: a user's tool results first (each its own ``tool`` message), then its
    text; an assistant's text with the calls it made."""
    role = message.get("role") if isinstance(message, dict) else None
    if role not in ("user", "assistant"):
        raise RequestError(f"{where} needs a 'role' of user or assistant", param=where)
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise RequestError(f"{where}.content must be a string or a list of content blocks", param=where)
    texts, calls, results = [], [], []
    for i, block in enumerate(content):
        at = f"{where}.content[{i}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use" and role == "assistant" and isinstance(block.get("name"), str):
            calls.append({"id": str(block.get("id", "")), "type": "function",
                          "function": {"name": block["name"], "arguments": json.dumps(block.get("input", {}))}})
        elif kind == "tool_result" and role == "user":
            results.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")),
                            "content": text_of(block.get("content", ""), f"{at}.content")})
        elif kind in SKIPPED and role == "assistant":
            continue
        else:
            raise RequestError(f"{at}: a {kind!r} block is not supported from the {role} (text, tool_use and "
                               "tool_result are; SpecLens serves text models)", param=at)
    turn = {"role": role, "content": "".join(texts)}
    if calls:
        turn["tool_calls"] = calls
    return results + ([turn] if texts or calls or not results else [])


def _tools(body: dict) -> dict:
    """The request's tools and tool choice in OpenAI's form (core.serve.tools checks them)."""
    tools = body.get("tools")
    if not tools:
        return {}
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise RequestError("'tools' must be a list of {\"name\", \"description\", \"input_schema\"}", param="tools")
    choice = body.get("tool_choice") or {"type": "auto"}
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("auto", "none"):
        raise RequestError(f"tool_choice {kind!r} is not supported, only \"auto\" or \"none\": SpecLens does not "
                           "constrain what the model says, so it cannot make it call a tool", param="tool_choice")
    return {"tool_choice": kind, "tools": [
        {"type": "function", "function": {"name": t.get("name"), "description": t.get("description", ""),
                                          "parameters": t.get("input_schema", {})}} for t in tools]}


def _chat_body(body: dict, need_max_tokens: bool) -> dict:
    """The OpenAI chat request an Anthropic one asks for."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list of {role, content}", param="messages")
    if need_max_tokens and "max_tokens" not in body:
        raise RequestError("'max_tokens' is required", param="max_tokens")
    chat = [{"role": "system", "content": text_of(body["system"], "system")}] if body.get("system") else []
    for i, message in enumerate(messages):
        chat.extend(_turn(message, f"messages[{i}]"))
    fields = {name: body[name] for name in ("max_tokens", "temperature", "top_p", "top_k", "stream", "min_tokens")
              if name in body}
    return {"messages": chat, **fields, **_tools(body)}


def parse_messages(body, context_length: int) -> ServeRequest:
    """The ``/v1/messages`` request in ``body`` as the chat request it asks for; RequestError if unusable."""
    body = json_object(body)
    request = parse(within(_chat_body(body, need_max_tokens=True), context_length), chat=True,
                    context_length=context_length)
    return replace(request, stop=stop_sequences({"stop": body.get("stop_sequences") or None}, MAX_STOPS),
                   within_context=True)


def count_body(body) -> tuple[tuple[dict, ...], tuple[dict, ...]]:
    """``/v1/messages/count_tokens``: the chat's messages and tools, as a request would render them."""
    chat = _chat_body(json_object(body), need_max_tokens=False)
    return messages_of(chat), offered(chat)


class MessagesReply(PartsReply):
    """Anthropic's message for one request, whole or as its stream of named events (``started``:
    core.serve.job.Started)."""

    END = ""             # the stream ends with its message_stop event
    NAMED = True         # each event is sent under its type's name

    def __init__(self, req: ServeRequest, model: str, started) -> None:
        self.req, self.model = req, model
        self.id = f"msg_{uuid.uuid4().hex[:24]}"
        self.held = Holdback(req.tools)
        self.blocks, self.open = 0, None     # blocks stopped; the kind of the one open
        self.read = started.prompt_tokens - started.cached_tokens
        self.cached = started.cached_tokens

    def _usage(self, output: int) -> dict:
        return {"input_tokens": self.read, "cache_read_input_tokens": self.cached, "cache_creation_input_tokens": 0,
                "output_tokens": output}

    def _message(self, content: list, stop_reason, stop_sequence, output: int) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "content": content, "model": self.model,
                "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": self._usage(output)}

    def opening(self) -> list[dict]:
        return [{"type": "message_start", "message": self._message([], None, None, 0)}, {"type": "ping"}]

    def _block(self, kind: str, block: dict) -> list[dict]:
        """Starts the next content block, after stopping the one open."""
        events = self._stop()
        self.open = kind
        return events + [{"type": "content_block_start", "index": self.blocks, "content_block": block}]

    def _stop(self) -> list[dict]:
        if self.open is None:
            return []
        self.open = None
        self.blocks += 1
        return [{"type": "content_block_stop", "index": self.blocks - 1}]

    def _said(self, text: str) -> list[dict]:
        events = [] if self.open == "text" else self._block("text", {"type": "text", "text": ""})
        return events + [{"type": "content_block_delta", "index": self.blocks,
                          "delta": {"type": "text_delta", "text": text}}]

    def _began(self, part: Began) -> list[dict]:
        return self._block("tool_use", {"type": "tool_use", "id": part.id, "name": part.name, "input": {}})

    def _argued(self, part: Argued) -> list[dict]:
        return [{"type": "content_block_delta", "index": self.blocks,
                 "delta": {"type": "input_json_delta", "partial_json": part.text}}]

    def _called(self, part: Called) -> list[dict]:
        return self._stop()

    def closing(self, finished) -> list[dict]:
        events = self._events(self.held.finish(finished.text)) + self._stop()
        reason, word = _stop(finished, self.held.called)
        output = finished.usage["completion_tokens"]
        return events + [{"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": word},
                          "usage": {"output_tokens": output}, "timings": finished.timings},
                         {"type": "message_stop"}]

    def whole(self, items: list) -> dict:
        finished = items[-1]
        parts = self.held.whole(finished.text)
        content = [{"type": "text", "text": p.text} if isinstance(p, Said) else
                   {"type": "tool_use", "id": p.call.id, "name": p.call.name, "input": _input(p.call.arguments)}
                   for p in parts]
        reason, word = _stop(finished, any(isinstance(p, Called) for p in parts))
        return {**self._message(content, reason, word, finished.usage["completion_tokens"]),
                "timings": finished.timings}


def _input(arguments: str) -> dict:
    """A call's arguments as the object Anthropic sends; none where the answer was cut inside them (its stop
    reason says so)."""
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return {}


def _stop(finished, called: bool) -> tuple[str, str | None]:
    """Anthropic's stop reason and the stop sequence met, if one was."""
    if finished.finish_reason == "length":
        return "max_tokens", None
    if finished.stop_type == "word":
        return "stop_sequence", finished.stopping_word
    return ("tool_use" if called else "end_turn"), None
