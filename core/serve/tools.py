"""Tool calls on the chat endpoint, as OpenAI defines them: the ``tools`` a request offers, the calls a model makes,
and the history of calls and their results that a request sends back.

The model learns of the tools from its own chat template (Qwen2.5's, Qwen3's and Hermes' put them in the system
prompt) and calls one by writing ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (or, a small model, the
same object in a json fence or alone: :func:`scan`); the answer's text is cut at those blocks into OpenAI's
``tool_calls``. Streamed, a call that names its tool first goes out named as soon as that is written, then its
arguments as they are (:class:`Holdback`'s parts, which each API turns into its own events). Nothing here touches
sampling: the tokens are the model's own, drafted
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
# a call's start as models write it, its name first: what lets its arguments go out while they are being written
_OPENING = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)')
_STRUCTURE = re.compile(r'[{}\[\]"]')          # what a JSON value's depth turns on, outside its strings
_IN_STRING = re.compile(r'["\\\x00-\x1f]')      # what ends a string, escapes, or must be escaped in it


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str      # JSON text, as OpenAI sends it
    id: str

    def openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


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


def _object(text: str, start: int) -> tuple[str, int | None]:
    """The JSON object or array that begins at ``text[start]``, as far as it is written: its text as strict JSON
    (line breaks and tabs written raw inside a string escaped, as small models write a file's text into an argument)
    and where it ends, None while it is still open. The text of a longer answer only ever extends it, so what went
    out of a shorter one is never taken back."""
    out, depth, i = [], 0, start
    while m := _STRUCTURE.search(text, i):
        out.append(text[i:m.end()])
        i = m.end()
        if m.group() in "{[":
            depth += 1
        elif m.group() in "}]":
            depth -= 1
            if depth == 0:
                return "".join(out), i
        else:
            while (s := _IN_STRING.search(text, i)) and s.group() != '"':
                out.append(text[i:s.start()])
                if s.group() == "\\":
                    out.append(text[s.start():s.end() + 1])
                    i = s.end() + 1
                else:
                    out.append(json.dumps(s.group())[1:-1])
                    i = s.end()
            if not s:
                break
            out.append(text[i:s.end()])
            i = s.end()
    return "".join(out) + text[i:], None


@dataclass(frozen=True)
class Opened:
    """A call whose name and the start of its arguments are written: they stream from here."""
    name: str
    arguments: str           # as far as written (strict JSON once ``end`` is known)
    end: int | None          # where the arguments end in the answer, None while they are being written


def opened(text: str, at: int, names: frozenset[str]) -> Opened | None:
    """The call begun at ``text[at]`` (the body of a tag or fence, or the answer's first brace), when it names an
    offered tool before its arguments, and its arguments are an object."""
    m = _OPENING.match(text, at)
    if not m:
        return None
    try:
        name = json.loads(f'"{m.group(1)}"')
    except json.JSONDecodeError:
        return None
    if name not in names:
        return None
    arguments, end = _object(text, m.end())
    return Opened(name, arguments, end)


def _call(block: str, names: frozenset[str]) -> ToolCall | None:
    """The call a block of JSON makes, in any other shape (its arguments a string, or written before its name): an
    object naming one of the offered tools, with its arguments, read whole once the block is."""
    try:
        call = json.loads(block, strict=False)
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or call.get("name") not in names:
        return None
    arguments = call.get("arguments", call.get("parameters", {}))
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ToolCall(call["name"], text, _new_id())


def _new_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _held_tail(text: str) -> int:
    """How many of the last characters may be the start of a tag or a fence: they wait for the next ones."""
    for n in range(len(OPEN) - 1, 0, -1):
        if text.endswith(OPEN[:n]) or (n < len(FENCE) and text.endswith(FENCE[:n])):
            return n
    return 0


def _block(text: str, body: int, closing: str, names: frozenset[str], final: bool) -> tuple[int, ToolCall | None]:
    """Where a tag's or fence's block that starts at ``body`` ends (-1 while it may go on), and the call it makes.
    A call that opened with its name ends at the first ``closing`` after its arguments (a fence inside a string
    argument is the argument's text), and is a call even when its outer brace is missing or the answer was cut in
    its arguments; the arguments are as written."""
    call = opened(text, body, names)
    if call is None:
        close = text.find(closing, body)
        if close < 0 and not final:
            return -1, None
        end = len(text) if close < 0 else close + len(closing)
        return end, _call(text[body:close if close >= 0 else len(text)].strip(), names)
    close = -1 if call.end is None else text.find(closing, call.end)
    if close < 0 and not final:
        return -1, None
    return (len(text) if close < 0 else close + len(closing)), ToolCall(call.name, call.arguments, _new_id())


def _whole(text: str, lead: int, names: frozenset[str], final: bool) -> tuple[int, ToolCall | None] | None:
    """An answer that begins with a brace: a call that opened with its name ends after its outer brace (or its
    arguments, where that is missing), and text may follow it; any other object is a call only if it is the whole
    answer. None while undecided; (end, None) where it is text."""
    call = opened(text, lead, names)
    if call is None:
        if not final:
            return None
        whole = _call(text.strip(), names)
        return len(text), whole
    if call.end is None and not final:
        return None
    after = len(text) if call.end is None else call.end
    rest = text[after:].lstrip()
    if not rest and not final:
        return None            # its outer brace may still come
    end = after + (len(text) - after - len(rest)) + 1 if rest.startswith("}") else after
    return end, ToolCall(call.name, call.arguments, _new_id())


def scan(text: str, names: frozenset[str], final: bool) -> tuple[list[tuple[int, int, ToolCall]], int]:
    """The calls in an answer's ``text`` (start, end, call), and how much of it is decided: all of it once
    ``final``; while it streams, up to where a call may be beginning or is being written.

    A call is what llama-server reads in the Hermes and Qwen form: a JSON object naming an offered tool inside
    ``<tool_call>...</tool_call>``, or alone in a json (or untagged) code fence (small models write that), or
    beginning the answer. A block that is not a call (broken JSON, a name that was not offered) is the answer's
    text."""
    calls: list[tuple[int, int, ToolCall]] = []
    n = len(text)
    pos = lead = n - len(text.lstrip())
    if text[lead:lead + 1] == "{":
        whole = _whole(text, lead, names, final)
        if whole is None:
            return calls, lead
        pos, call = whole
        if call is None:
            return calls, n
        calls.append((lead, pos, call))
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
        end, call = _block(text, body, closing, names, final)
        if end < 0:
            return calls, i
        if call:
            calls.append((i, end, call))
        pos = end
    return calls, (n if final else n - _held_tail(text))


def _gaps(text: str, calls: list[tuple[int, int, ToolCall]]) -> list[str]:
    """The answer's text around its calls: before the first, between each two, after the last."""
    starts, ends = [start for start, _, _ in calls] + [len(text)], [0] + [end for _, end, _ in calls]
    return [text[end:start] for end, start in zip(ends, starts)]


def split_calls(text: str, names: frozenset[str]) -> tuple[str, list[ToolCall]]:
    """A finished answer's text without its calls, and the calls."""
    calls, _ = scan(text, names, final=True)
    return "".join(_gaps(text, calls)), [call for _, _, call in calls]


def sendable(text: str, names: frozenset[str]) -> int:
    """How much of a streaming answer's ``text`` may go out as content now: what is decided, before any call."""
    calls, decided = scan(text, names, final=False)
    return min([decided] + [start for start, _, _ in calls])


def being_written(text: str, at: int, names: frozenset[str]) -> Opened | None:
    """The call being written from ``text[at]`` (where :func:`scan` stopped deciding), once its name is."""
    if text.startswith(OPEN, at):
        return opened(text, at + len(OPEN), names)
    fence = _FENCE.match(text, at)
    if fence:
        return opened(text, fence.end(), names)
    return opened(text, at, names) if text[at:at + 1] == "{" and not text[:at].strip() else None


# -- a streamed answer, in parts ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Said:
    """Text of the answer that goes out as its content."""
    text: str


@dataclass(frozen=True)
class Began:
    """A call begins: its id and name are known, its arguments follow."""
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class Argued:
    """More of a call's arguments, as written."""
    index: int
    text: str


@dataclass(frozen=True)
class Called:
    """A call is complete."""
    index: int
    call: ToolCall


class Holdback:
    """A streaming answer as the parts that may go out: all of its text as it comes when no tools are offered;
    else its text up to where a call begins, each call's name once it is written and its arguments as they are
    (an agent shows a file being written as it is), and at the end the text that came after the calls."""

    def __init__(self, tools: tuple[dict, ...]) -> None:
        self.names = names(tools)
        self._text, self._sent = "", 0
        self._calls: list[ToolCall] = []    # begun, with the arguments sent so far
        self._done = 0                       # how many of them are complete
        self._said = False                   # whether any text went out

    def push(self, text: str) -> list:
        """The parts that may go out now, given the next ``text`` of the answer."""
        if not self.names:
            self._said |= bool(text)
            return [Said(text)] if text else []
        self._text += text
        calls, decided = scan(self._text, self.names, final=False)
        upto = min([decided] + [start for start, _, _ in calls])
        parts = []
        if not self._calls and upto > self._sent and self._text[:upto].strip():   # blank: a call may be all
            parts.append(Said(self._text[self._sent:upto]))
            self._sent, self._said = upto, True
        for index, (_, _, call) in enumerate(calls):
            parts += self._advance(index, call.name, call.arguments, done=True)
        writing = being_written(self._text, decided, self.names) if decided < len(self._text) else None
        if writing is not None:
            parts += self._advance(len(calls), writing.name, writing.arguments, done=False)
        return parts

    def _advance(self, index: int, name: str, arguments: str, done: bool) -> list:
        parts = []
        if index == len(self._calls):
            self._calls.append(ToolCall(name, "", _new_id()))
            parts.append(Began(index, self._calls[index].id, name))
        sent = self._calls[index]
        if len(arguments) > len(sent.arguments):
            parts.append(Argued(index, arguments[len(sent.arguments):]))
            self._calls[index] = sent = ToolCall(name, arguments, sent.id)
        if done and index == self._done:
            parts.append(Called(index, sent))
            self._done += 1
        return parts

    def whole(self, text: str) -> list:
        """A finished answer answered whole, as the parts its stream ends up with: its text before its first call,
        the calls, and its text after them, each text only where it is not blank (an answer that calls nothing is
        its text, whatever that is)."""
        calls, _ = scan(text, self.names, final=True) if self.names else ([], 0)
        if not calls:
            return [Said(text)]
        gaps = _gaps(text, calls)
        texts = [gaps[0], "".join(gaps[1:])]
        return ([Said(texts[0])] if texts[0].strip() else []) + [
            Called(i, call) for i, (_, _, call) in enumerate(calls)] + ([Said(texts[1])] if texts[1].strip() else [])

    @property
    def called(self) -> bool:
        """Whether a call has gone out (begun, at least)."""
        return bool(self._calls)

    def finish(self, text: str, opened: bool = False) -> list:
        """The parts of the finished answer's ``text`` still to go out: the rest of its calls and of its text. No
        text where none is left: a blank rest beside calls, or an empty one once text has begun (some went out, or
        the reply ``opened`` with an empty text of its own); an answer with neither text nor calls still sends its
        one empty text."""
        begun = opened or self._said
        if not self.names:
            return [] if begun else [Said("")]
        content, calls = split_calls(text, self.names)
        rest = content[self._sent:]
        said = [Said(rest)] if rest.strip() or (not calls and (rest or not begun)) else []
        parts = [] if self._calls else said
        for index, call in enumerate(calls):
            parts += self._advance(index, call.name, call.arguments, done=True)
        return parts + (said if self._calls else [])


class PartsReply:
    """A streamed reply whose events are made from an answer's parts (:class:`Holdback`): each API says how."""

    held: Holdback

    def _said(self, text: str) -> list[dict]:
        raise NotImplementedError

    def _began(self, part: Began) -> list[dict]:
        raise NotImplementedError

    def _argued(self, part: Argued) -> list[dict]:
        raise NotImplementedError

    def _called(self, part: Called) -> list[dict]:
        raise NotImplementedError

    def _events(self, parts: list) -> list[dict]:
        events = []
        for part in parts:
            match part:
                case Said(text):
                    events += self._said(text)
                case Began():
                    events += self._began(part)
                case Argued():
                    events += self._argued(part)
                case Called():
                    events += self._called(part)
        return events

    def deltas(self, delta) -> list[dict]:
        return self._events(self.held.push(delta.text))
