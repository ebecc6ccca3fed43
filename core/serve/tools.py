"""Tool calls on the chat endpoint, as OpenAI defines them: the ``tools`` a request offers, the calls a model makes,
and the history of calls and their results that a request sends back.

The model learns of the tools from its own chat template (Qwen2.5's, Qwen3's and Hermes' put them in the system
prompt) and calls one by writing ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (or, a small model, the
same object in a json fence or alone: :func:`scan`); the answer's text is cut at those blocks into OpenAI's
``tool_calls``. Nothing here touches sampling: the tokens are the model's own, drafted
and verified as any answer's, so the output keeps exactly the target's distribution. A model is never made to call a
tool (``tool_choice`` "required" or a named function is refused): that needs constrained decoding, which SpecLens does
not do.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from core.serve.errors import RequestError

OPEN, CLOSE, FENCE = "<tool_call>", "</tool_call>", "```"
_FENCE = re.compile(r"```(?:json|xml)?[ \t]*\n")    # a fence a call may be written in


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str      # JSON text, as OpenAI sends it
    id: str

    def openai(self, index: int | None = None) -> dict:
        out = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else {"index": index, **out}


def offered(body: dict) -> tuple[dict, ...]:
    """The tools a chat request offers the model, checked (OpenAI's ``tools`` and ``tool_choice``); none where it
    offers none or says ``tool_choice: "none"``."""
    tools = body.get("tools")
    choice = body.get("tool_choice", "auto")
    if tools is None or tools == [] or choice == "none":
        return ()
    if choice != "auto":
        raise RequestError("only tool_choice \"auto\" or \"none\" is supported: SpecLens does not constrain what the "
                           "model says, so it cannot make it call a tool", param="tool_choice")
    if not isinstance(tools, list):
        raise RequestError("'tools' must be a list of {\"type\": \"function\", \"function\": {...}}", param="tools")
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise RequestError(f"{where} must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
                               param=where)
        if not isinstance(function.get("parameters", {}), dict):
            raise RequestError(f"{where}.function.parameters must be a JSON schema object", param=where)
        out.append({"type": "function", "function": function})
    return tuple(out)


def names(tools: tuple[dict, ...]) -> frozenset[str]:
    """The names of the tools offered (:func:`offered`): what a call must name to be read as one."""
    return frozenset(tool["function"]["name"] for tool in tools)


def history_calls(calls, where: str) -> list[dict]:
    """An assistant message's earlier ``tool_calls`` as a chat template renders them: the arguments as an object, as
    llama-server and transformers give them to Qwen's and Hermes' templates (a string would be rendered quoted)."""
    if not isinstance(calls, list):
        raise RequestError(f"{where} must be a list of tool calls", param=where)
    out = []
    for i, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise RequestError(f"{where}[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\", "
                               "\"arguments\"}}}}", param=where)
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except json.JSONDecodeError:
                raise RequestError(f"{where}[{i}].function.arguments must be JSON text", param=where) from None
        out.append({"id": call.get("id", ""), "type": "function",
                    "function": {"name": function["name"], "arguments": arguments}})
    return out


def _call(block: str, names: frozenset[str]) -> ToolCall | None:
    """The call a block of JSON makes: an object naming one of the offered tools, with its arguments. Line breaks and
    tabs written raw inside a string are read as the characters they are (small models write a file's text into an
    argument so); the arguments go out as strict JSON."""
    try:
        call = json.loads(block, strict=False)
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or call.get("name") not in names:
        return None
    arguments = call.get("arguments", call.get("parameters", {}))
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ToolCall(call["name"], text, f"call_{uuid.uuid4().hex[:24]}")


def _held_tail(text: str) -> int:
    """How many of the last characters may be the start of a tag or a fence: they wait for the next ones."""
    for n in range(len(OPEN) - 1, 0, -1):
        if text.endswith(OPEN[:n]) or (n < len(FENCE) and text.endswith(FENCE[:n])):
            return n
    return 0


def scan(text: str, names: frozenset[str], final: bool) -> tuple[list[tuple[int, int, ToolCall]], int]:
    """The calls in an answer's ``text`` (start, end, call), and how much of it is decided: all of it once
    ``final``; while it streams, up to where a call may be beginning.

    A call is what llama-server reads in the Hermes and Qwen form: a JSON object naming an offered tool inside
    ``<tool_call>...</tool_call>``, or alone in a json (or untagged) code fence (small models write that), or as the
    whole answer. A block that is not a call (broken JSON, a name that was not offered) is the answer's text."""
    calls: list[tuple[int, int, ToolCall]] = []
    n = len(text)
    lead = n - len(text.lstrip())
    if text[lead:lead + 1] == "{":           # an answer that may be a call and nothing else
        call = _call(text.strip(), names) if final else None
        return ([(lead, n, call)] if call else []), (n if final else lead)
    pos = 0
    while (i := min((j for j in (text.find(OPEN, pos), text.find(FENCE, pos)) if j >= 0), default=-1)) >= 0:
        if text.startswith(OPEN, i):
            body, closing = i + len(OPEN), CLOSE
        else:
            fence = _FENCE.match(text, i)
            line_end = text.find("\n", i)
            if line_end < 0 or (fence and not text[fence.end():].strip()):
                if not final:                # the fence's language or its first line is still to come
                    return calls, i
                break
            if not fence or not text[fence.end():].lstrip().startswith("{"):
                close = text.find(FENCE, line_end)           # a code block: the answer's text
                pos = n if close < 0 else close + len(FENCE)
                continue
            body, closing = fence.end(), FENCE
        close = text.find(closing, body)
        if close < 0 and not final:
            return calls, i
        end = n if close < 0 else close + len(closing)
        call = _call(text[body:close if close >= 0 else n].strip(), names)
        if call:
            calls.append((i, end, call))
        pos = end
    return calls, (n if final else n - _held_tail(text))


def split_calls(text: str, names: frozenset[str]) -> tuple[str, list[ToolCall]]:
    """A finished answer's text without its calls, and the calls."""
    calls, _ = scan(text, names, final=True)
    content, pos = [], 0
    for start, end, _call_ in calls:
        content.append(text[pos:start])
        pos = end
    content.append(text[pos:])
    return "".join(content), [call for _, _, call in calls]


def sendable(text: str, names: frozenset[str]) -> int:
    """How much of a streaming answer's ``text`` may go out as content now: what is decided, before any call."""
    calls, decided = scan(text, names, final=False)
    return min([decided] + [start for start, _, _ in calls])


class Holdback:
    """A streaming answer's text as it may go out when tools are offered: all of it as it comes when none are, else
    up to where a call may be beginning; at the end, the rest of its content and its calls."""

    def __init__(self, tools: tuple[dict, ...]) -> None:
        self.names = names(tools)
        self._text, self._sent = "", 0

    def push(self, text: str) -> str:
        """What of the answer so far may be sent now, given the next ``text`` of it."""
        if not self.names:
            return text
        self._text += text
        upto = sendable(self._text, self.names)
        if upto <= self._sent or not self._text[:upto].strip():    # blank so far: a call may yet be all there is
            return ""
        piece, self._sent = self._text[self._sent:upto], upto
        return piece

    def whole(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """A finished answer's ``text`` answered whole: its content without the calls (None where that is blank
        beside calls: there is no text to show), and the calls."""
        content, calls = split_calls(text, self.names) if self.names else (text, [])
        return (None if calls and not content.strip() else content), calls

    def finish(self, text: str, begun: bool = True) -> tuple[str | None, list[ToolCall]]:
        """The finished answer's ``text``: what of its content is still to be sent, and its calls. None where
        nothing is: a blank rest beside calls, or an empty one once text has ``begun`` (an answer with neither text
        nor calls still sends its one empty text)."""
        rest, calls = "", []
        if self.names:
            content, calls = split_calls(text, self.names)
            rest = content[self._sent:]
        shows = rest.strip() or (not calls and (rest or not begun))
        return (rest if shows else None), calls


class TextThenCalls:
    """A streamed reply of named events whose answer's text opens its first block (``_text``, which sets
    ``begun``) as it may go out, and whose calls follow in their own blocks (Anthropic's and the Responses API)."""

    held: Holdback
    begun = 0        # blocks begun: the text's, once it has any

    def _text(self, text: str) -> list[dict]:
        raise NotImplementedError

    def deltas(self, delta) -> list[dict]:
        piece = self.held.push(delta.text)
        return self._text(piece) if piece else []

    def rest(self, finished) -> tuple[list[dict], list[ToolCall]]:
        """The events of the text still held at the end, and the answer's calls."""
        rest, calls = self.held.finish(finished.text, begun=bool(self.begun))
        return (self._text(rest) if rest is not None else []), calls
