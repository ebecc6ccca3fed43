"""OpenAI's Responses API (``POST /v1/responses``, ``GET``/``DELETE /v1/responses/{id}``), as llama-server also
serves it: for agents written against it (Codex CLI, the ``openai`` SDK's ``responses``).

A request is read into the chat request the chat endpoint decodes (core.serve.request), so the engine, the prompt
cache and the lossless guarantees are the same: ``instructions``, ``input`` (text, or items: messages of
``input_text``/``output_text`` parts, earlier ``function_call`` items and their ``function_call_output``),
``previous_response_id`` (the conversation a kept response answered, then its output, come before ``input``;
its instructions do not, as OpenAI's), ``store``, ``tools`` (functions), ``tool_choice`` auto or none,
``max_output_tokens``, ``temperature``, ``top_p``, ``stream``. The answer is a response whose output is a message and
the function calls the model wrote (read as the chat endpoint reads them, core.serve.tools), whole or as the API's
named stream events; it is kept (core.serve.kept) unless ``store`` is false. Images, files, structured output and
tools other than functions are refused. Like llama-server it serves its one model whatever model a request names.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, replace

from core.serve.kept import ResponseStore
from core.serve.request import RequestError, ServeRequest, json_object, parse, text_of, within
from core.serve.tools import Argued, Began, Called, Holdback, PartsReply, Said, ToolCall

SKIPPED = ("reasoning",)             # an earlier answer's reasoning: templates drop it too
TEXT_PARTS = ("input_text", "output_text", "text")


def _items(body: dict) -> tuple[dict, ...]:
    """The request's own ``input`` as items: text is one user message."""
    items = body.get("input")
    if isinstance(items, str):
        return ({"type": "message", "role": "user", "content": items},)
    if not isinstance(items, list) or not items:
        raise RequestError("'input' must be text or a non-empty list of items", param="input")
    return tuple(items)


def _messages(instructions, items: tuple[dict, ...], first: int) -> list[dict]:
    """The conversation as chat messages: ``instructions`` first, then each item (the request's own from ``first``:
    those before it were read when they were sent); an earlier function call joins the assistant message before it,
    its output is a ``tool`` message."""
    chat = [{"role": "system", "content": text_of(instructions, "instructions", TEXT_PARTS)}] if instructions else []
    for i, item in enumerate(items, start=-first):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message" and item.get("role") in ("user", "assistant", "system", "developer"):
            chat.append({"role": item["role"],
                         "content": text_of(item.get("content"), f"{where}.content", TEXT_PARTS)})
        elif kind == "function_call" and isinstance(item.get("name"), str):
            call = {"id": str(item.get("call_id", "")), "type": "function",
                    "function": {"name": item["name"], "arguments": item.get("arguments") or "{}"}}
            if not (chat and chat[-1]["role"] == "assistant"):
                chat.append({"role": "assistant", "content": ""})
            chat[-1].setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            chat.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")),
                         "content": text_of(item.get("output", ""), f"{where}.output", TEXT_PARTS)})
        elif kind in SKIPPED:
            continue
        else:
            raise RequestError(f"{where}: a {kind!r} item is not supported (messages, function_call and "
                               "function_call_output are)", param=where)
    return chat


def _tools(body: dict) -> dict:
    """The request's function tools and tool choice in the chat endpoint's form (core.serve.tools checks them)."""
    tools = body.get("tools")
    if not tools:
        return {}
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise RequestError("'tools' must be a list of {\"type\": \"function\", \"name\", \"parameters\"}",
                           param="tools")
    other = sorted({str(t.get("type")) for t in tools} - {"function"})
    if other:
        raise RequestError(f"only function tools are supported, not {', '.join(other)}", param="tools")
    choice = body.get("tool_choice", "auto")
    return {"tool_choice": choice if isinstance(choice, str) else "required", "tools": [
        {"type": "function", "function": {key: t[key] for key in ("name", "description", "parameters") if key in t}}
        for t in tools]}


@dataclass(frozen=True)
class Asked:
    """A Responses request: the chat request it asks for, and what its response shows and keeps of it."""
    request: ServeRequest
    earlier: tuple[dict, ...]       # the kept conversation it goes on from (previous_response_id's)
    own: tuple[dict, ...]           # its own input items
    previous: str | None
    instructions: str | None
    store: bool


def parse_responses(body, context_length: int, kept: ResponseStore) -> Asked:
    """The ``/v1/responses`` request in ``body``, going on from a response in ``kept`` where it names one;
    RequestError if unusable."""
    body = json_object(body)
    store, previous = body.get("store", True), body.get("previous_response_id")
    if not isinstance(store, bool):
        raise RequestError("'store' must be true or false", param="store")
    if previous is not None and not isinstance(previous, str):
        raise RequestError("'previous_response_id' must be the id of a response", param="previous_response_id")
    form = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(form, dict) and form.get("type") not in (None, "text"):
        raise RequestError(f"text.format {form.get('type')!r} is not supported: SpecLens cannot constrain what the "
                           "model says to a form", param="text.format")
    earlier = kept.find(previous, "previous_response_id").items if previous else ()
    own = _items(body)
    instructions = body.get("instructions") or None
    chat = {"messages": _messages(instructions, earlier + own, len(earlier)), **_tools(body),
            **{name: body[name] for name in ("temperature", "top_p", "stream", "min_tokens") if name in body}}
    if "max_output_tokens" in body:
        chat["max_tokens"] = body["max_output_tokens"]
    request = replace(parse(within(chat, context_length), chat=True, context_length=context_length),
                      within_context=True)
    return Asked(request, earlier, own, previous, instructions if isinstance(instructions, str) else None, store)


class ResponsesReply(PartsReply):
    """The response to one request, whole or as its stream of named events (``started``: core.serve.job.Started)."""

    END = ""             # the stream ends with its response.completed event
    NAMED = True         # each event is sent under its type's name

    def __init__(self, asked: Asked, model: str, started, kept: ResponseStore) -> None:
        self.asked, self.req, self.model, self.kept = asked, asked.request, model, kept
        self.id = f"resp_{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.held = Holdback(self.req.tools)
        self.sequence = 0
        self.output: list[dict] = []    # the items done
        self.text: str | None = None    # what of the message item open went out (None: none is open)
        self.message_id = self.calling = ""      # the items open

    def _event(self, kind: str, **fields) -> dict:
        self.sequence += 1
        return {"type": kind, "sequence_number": self.sequence - 1, **fields}

    def _response(self, status: str, output: list, finished=None) -> dict:
        out = {"id": self.id, "object": "response", "created_at": self.created, "status": status, "model": self.model,
               "output": output, "error": None, "incomplete_details": None, "instructions": self.asked.instructions,
               "previous_response_id": self.asked.previous, "metadata": {},
               "parallel_tool_calls": True, "temperature": self.req.sampling.temperature,
               "top_p": self.req.sampling.top_p, "tool_choice": "auto" if self.req.tools else "none",
               "tools": [{"type": "function", **t["function"]} for t in self.req.tools], "store": self.asked.store,
               "text": {"format": {"type": "text"}}, "usage": None}
        if finished is not None:
            u = finished.usage
            out["usage"] = {"input_tokens": u["prompt_tokens"], "output_tokens": u["completion_tokens"],
                            "total_tokens": u["total_tokens"],
                            "input_tokens_details": {"cached_tokens": u["prompt_tokens_details"]["cached_tokens"]},
                            "output_tokens_details": {"reasoning_tokens": 0}}
            if finished.finish_reason == "length":
                out["status"], out["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
            out["timings"] = finished.timings
        return out

    @staticmethod
    def _message(id_: str, text: str, status: str) -> dict:
        return {"type": "message", "id": id_, "status": status, "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if text or
                status == "completed" else []}

    @staticmethod
    def _call(call, status: str = "completed") -> dict:
        return {"type": "function_call", "id": f"fc_{call.id.removeprefix('call_')}", "call_id": call.id,
                "name": call.name, "arguments": call.arguments, "status": status}

    def opening(self) -> list[dict]:
        started = self._response("in_progress", [])
        return [self._event("response.created", response=started),
                self._event("response.in_progress", response=started)]

    def _said(self, text: str) -> list[dict]:
        events = []
        if self.text is None:       # a message item begins: the answer's text, or text after its calls
            self.text, self.message_id = "", f"msg_{uuid.uuid4().hex[:24]}"
            events += [self._event("response.output_item.added", output_index=len(self.output),
                                   item=self._message(self.message_id, "", "in_progress")),
                       self._event("response.content_part.added", item_id=self.message_id,
                                   output_index=len(self.output), content_index=0,
                                   part={"type": "output_text", "text": "", "annotations": []})]
        self.text += text
        return events + [self._event("response.output_text.delta", item_id=self.message_id,
                                     output_index=len(self.output), content_index=0, delta=text, logprobs=[])]

    def _said_done(self) -> list[dict]:
        """The message item open, done."""
        if self.text is None:
            return []
        index, item = len(self.output), self._message(self.message_id, self.text, "completed")
        part = item["content"][0]
        events = [self._event("response.output_text.done", item_id=self.message_id, output_index=index,
                              content_index=0, text=self.text, logprobs=[]),
                  self._event("response.content_part.done", item_id=self.message_id, output_index=index,
                              content_index=0, part=part),
                  self._event("response.output_item.done", output_index=index, item=item)]
        self.output.append(item)
        self.text = None
        return events

    def _began(self, part: Began) -> list[dict]:
        events = self._said_done()
        item = self._call(ToolCall(part.name, "", part.id), "in_progress")
        self.calling = item["id"]
        return events + [self._event("response.output_item.added", output_index=len(self.output), item=item)]

    def _argued(self, part: Argued) -> list[dict]:
        return [self._event("response.function_call_arguments.delta", item_id=self.calling,
                            output_index=len(self.output), delta=part.text)]

    def _called(self, part: Called) -> list[dict]:
        item, index = self._call(part.call), len(self.output)
        self.output.append(item)
        return [self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                            arguments=part.call.arguments),
                self._event("response.output_item.done", output_index=index, item=item)]

    def closing(self, finished) -> list[dict]:
        events = self._events(self.held.finish(finished.text)) + self._said_done()
        # response.completed even for a cut answer (its status says incomplete): as llama-server, and what the SDK's
        # stream helper and agents wait for
        return events + [self._event("response.completed", response=self._kept(self.output, finished))]

    def whole(self, items: list) -> dict:
        finished = items[-1]
        output = [self._message(f"msg_{uuid.uuid4().hex[:24]}", p.text, "completed") if isinstance(p, Said) else
                  self._call(p.call) for p in self.held.whole(finished.text)]
        return self._kept(output, finished)

    def _kept(self, output: list, finished) -> dict:
        """The finished response, kept unless the request said ``store: false``."""
        response = self._response("completed", output, finished)
        if self.asked.store:
            self.kept.keep(response, self.asked.earlier, self.asked.own)
        return response
