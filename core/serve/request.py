"""An OpenAI request, checked and turned into what the engine needs; every refusal in OpenAI's error shape.

Chat completions take ``messages`` (text content, or a list of text parts); text completions take ``prompt`` (a
string, its special-token text read as those tokens, as llama-server and vLLM read it, or token ids) and ``suffix``
(an editor's fill in the middle: the prompt is the text before the cursor, the suffix the text after it). Both take
``max_tokens`` / ``max_completion_tokens``, ``temperature``, ``top_p`` (and vLLM's ``top_k`` and ``min_p``),
``seed``, ``stop``, ``n`` (1 only), ``stream`` with ``stream_options.include_usage``, and ``prediction`` (Predicted
Outputs: the text the answer is expected to repeat, e.g. the file being edited), plus vLLM's ``min_tokens`` and
``ignore_eos`` and llama-server's ``n_predict``. Chats take ``tools`` and the calls and results of earlier turns
(core.serve.tools). A request for a form (``response_format`` JSON, a grammar) or a ``logit_bias`` is refused, not
ignored.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from core.sampling import SamplingError, SamplingParams
from core.serve.errors import RequestError
from core.serve.tools import history_calls, offered

MAX_STOPS = 4              # as OpenAI
ROLES = ("system", "user", "assistant", "developer", "tool")
MIN_P_ONE = 1 - 1e-9       # min-p 1 keeps only the likeliest tokens: the floor a hair under them
MIDDLE_MARK = "\u2038"     # where a fill-in-the-middle request's answer goes, as the window shows it


@dataclass(frozen=True)
class Infill:
    """A completion at an editor's cursor as llama-server's ``/infill`` takes it: the text before the cursor's line
    (``prefix``), that line up to the cursor (``typed``), the text after the cursor (``suffix``), and other files the
    editor thinks relevant (``extra``: (filename, text))."""

    prefix: str
    suffix: str
    typed: str = ""
    extra: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ServeRequest:
    """One generation asked over HTTP: messages (chat) or a prompt (text completion), how to sample, when to stop."""

    model: str
    messages: tuple[dict, ...] | None
    prompt: str | None
    max_tokens: int | None          # None: as many as the context allows
    sampling: SamplingParams
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    prediction: str | None
    suffix: str | None = None       # a text completion that fills in the middle (core.backends.infill)
    infill: Infill | None = None    # llama-server's /infill (core.serve.native); max_tokens 0 only reads the prompt
    pieces: tuple[str | int, ...] | None = None   # llama-server's /completion prompt of token ids and texts
    tools: tuple[dict, ...] = ()    # OpenAI's tools a chat offers the model (core.serve.tools)
    min_indent: int = 0             # core.serve.stops.StopText's rules
    newline_after_s: float | None = None
    # the agents' APIs (Anthropic's, Responses) and llama-server's own: max_tokens is a ceiling that the context left
    # lowers, as llama-server takes it (an agent asks for 32k tokens whatever the model), where OpenAI's endpoints
    # refuse what cannot fit
    within_context: bool = False

    @property
    def chat(self) -> bool:
        return self.messages is not None

    @property
    def text(self) -> str:
        """A text completion as a reader sees it: the prompt (a token id given as such shows as ``⟨id⟩``), and where
        the middle is filled in, a mark for it and the suffix."""
        if self.infill is not None:
            return f"{self.infill.prefix}{self.infill.typed}{MIDDLE_MARK}{self.infill.suffix}"
        if self.pieces is not None:
            return "".join(p if isinstance(p, str) else f"⟨{p}⟩" for p in self.pieces)
        return self.prompt if self.suffix is None else f"{self.prompt}{MIDDLE_MARK}{self.suffix}"


def number(body: dict, name: str, default, low: float, high: float, integer: bool = False):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise RequestError(f"'{name}' must be {'an integer' if integer else 'a number'}, not {value!r}", param=name)
    if not math.isfinite(value) or not low <= value <= high:
        raise RequestError(f"'{name}' must be between {low:g} and {high:g}, got {value!r}", param=name)
    return value


def text_of(content, where: str, kinds: tuple[str, ...] = ("text",)) -> str:
    """A message's content as text: a string, or a list of text parts (of the ``kinds`` the API names them; other
    kinds of part, images say, are refused)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind not in kinds or not isinstance(part.get("text"), str):
                raise RequestError(f"{where}[{i}]: only text parts are supported, not {kind!r} (SpecLens serves text "
                                   "models)", param=where)
            parts.append(part["text"])
        return "".join(parts)
    raise RequestError(f"{where} must be a string or a list of text parts", param=where)


def messages_of(body: dict) -> tuple[dict, ...]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list of {role, content}", param="messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise RequestError(f"{where} needs a 'role' of {', '.join(ROLES)}", param=where)
        role = "system" if m["role"] == "developer" else m["role"]
        message = {"role": role}
        if role == "assistant" and m.get("tool_calls"):    # a call made earlier: its text may be empty
            message["tool_calls"] = history_calls(m["tool_calls"], f"{where}.tool_calls")
            content = m.get("content") or ""
        else:
            content = m.get("content")
        if role == "tool":
            message["tool_call_id"] = str(m.get("tool_call_id", ""))
        message["content"] = text_of(content, f"{where}.content")
        out.append(message)
    return tuple(out)


def stop_sequences(body: dict, limit: int = MAX_STOPS) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > limit:
        raise RequestError(f"'stop' must be a non-empty string or a list of up to {limit}", param="stop")
    return tuple(stops)


def json_object(body) -> dict:
    """A request's parsed JSON ``body``, which every endpoint needs to be an object; RequestError otherwise."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return body


def refuse_forms(body: dict) -> None:
    """RequestError where the request asks the answer to follow a form or a bias (OpenAI's ``response_format`` other
    than text and ``logit_bias``, llama-server's ``grammar`` and ``json_schema``): SpecLens cannot constrain what the
    model says, and an answer that ignored it could be taken for one that followed it."""
    form = body.get("response_format")
    if form is not None and form != {"type": "text"}:
        raise RequestError("'response_format' other than {\"type\": \"text\"} is not supported: SpecLens does not "
                           "constrain what the model says", param="response_format")
    for name in ("grammar", "json_schema", "logit_bias"):
        if body.get(name):
            raise RequestError(f"'{name}' is not supported: SpecLens does not constrain or bias what the model says",
                               param=name)


def is_integer(value) -> bool:
    """A JSON whole number (a token id, a limit), which true and false are not."""
    return isinstance(value, int) and not isinstance(value, bool)


def prompt_of(body: dict) -> str | tuple[str | int, ...]:
    """A text completion's ``prompt`` as text, or as token ids (OpenAI's other form), or as token ids and texts mixed
    (llama-server's): one prompt, given alone or as a list of one."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]      # a list of one prompt
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(is_integer(p) or isinstance(p, str) for p in prompt) and (
            any(is_integer(p) for p in prompt)):
        return tuple(prompt)
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise RequestError(f"'prompt' holds {len(prompt)} prompts: SpecLens answers one per request (one engine "
                           "decodes one answer at a time); send them one after another", param="prompt")
    raise RequestError("'prompt' must be given: text, a list of token ids, or a list mixing both", param="prompt")


def _prediction(body: dict) -> str | None:
    prediction = body.get("prediction")
    if prediction is None:
        return None
    if not isinstance(prediction, dict) or prediction.get("type") != "content":
        raise RequestError("'prediction' must be {\"type\": \"content\", \"content\": ...}", param="prediction")
    return text_of(prediction.get("content"), "prediction.content")


def _limit(body: dict, context_length: int) -> int | None:
    """How many tokens may be generated: OpenAI's ``max_completion_tokens`` or ``max_tokens``, else llama-server's
    ``n_predict``, which its own clients send here too (-1: no limit; 0: only read the prompt into the cache, as
    llama.vim does to warm up while its user types an instruction)."""
    if "max_completion_tokens" in body or "max_tokens" in body:
        name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        return number(body, name, None, 1, context_length, integer=True)
    limit = number(body, "n_predict", -1, -1, context_length, integer=True)
    return None if limit < 0 else limit


def within(body: dict, context_length: int, name: str = "max_tokens") -> dict:
    """A request with its limit ``name`` lowered to the context, where it is a ceiling rather than a demand (see
    ``ServeRequest.within_context``)."""
    limit = body.get(name)
    return {**body, name: context_length} if is_integer(limit) and limit > context_length else body


def parse(body, chat: bool, context_length: int) -> ServeRequest:
    """The request in ``body`` (parsed JSON) for a chat (``chat``) or text completion; RequestError if unusable."""
    body = json_object(body)
    refuse_forms(body)
    model = body.get("model", "")
    if not isinstance(model, str):
        raise RequestError("'model' must be a string", param="model")
    if number(body, "n", 1, 1, 128, integer=True) != 1:
        raise RequestError("only n=1 is supported: one engine decodes one answer at a time", param="n")
    max_tokens = _limit(body, context_length)
    min_tokens = number(body, "min_tokens", 0, 0, context_length, integer=True)
    if body.get("ignore_eos") is True:
        min_tokens = max_tokens or context_length
    temperature = number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = number(body, "top_p", 1.0, 0.0, 1.0)
    top_k = number(body, "top_k", 0, -1, 2**31, integer=True)       # vLLM's and llama-server's extra fields
    min_p = number(body, "min_p", 0.0, 0.0, 1.0)
    seed = number(body, "seed", None, 0, 2**63 - 1, integer=True)
    try:
        sampling = SamplingParams(temperature=float(temperature), top_p=float(top_p) if top_p > 0 else 1e-9,
                                  top_k=max(0, top_k), min_p=min(float(min_p), MIN_P_ONE), seed=seed,
                                  min_tokens=min_tokens)
    except SamplingError as exc:
        raise RequestError(str(exc)) from None
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("'stream' must be true or false", param="stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise RequestError("'stream_options' must be an object", param="stream_options")
    if chat:
        messages, prompt = messages_of(body), None
    else:
        prompt = prompt_of(body)
        suffix = body.get("suffix")
        if suffix is not None and not isinstance(suffix, str):
            raise RequestError("'suffix' must be a string", param="suffix")
        if not isinstance(prompt, str) and suffix is not None:
            raise RequestError("a 'suffix' needs the prompt as text", param="suffix")
        # filling in the middle, the cursor may be at the file's start
        if prompt == "" and not suffix:
            raise RequestError("'prompt' must be a non-empty string", param="prompt")
        messages = None
    pieces = None if chat or isinstance(prompt, str) else prompt
    return ServeRequest(model, messages, None if pieces else prompt, max_tokens, sampling, stop_sequences(body),
                        stream, bool(options.get("include_usage", False)), _prediction(body),
                        None if chat else suffix, tools=offered(body) if chat else (), pieces=pieces)
