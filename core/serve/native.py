"""llama-server's own endpoints, the ones clients made for local models call: ``/infill`` (the editor plugins
llama.vim and llama.vscode) and ``/completion`` (Continue's llama.cpp provider, scripts written for llama-server): their
requests and their answer, whole or streamed, so such a client pointed at SpecLens works unchanged.

An ``/infill`` request gives the text before the cursor's line (``input_prefix``), that line up to the cursor
(``prompt``), the text after the cursor (``input_suffix``) and other files (``input_extra``: ``[{"filename",
"text"}]``); the prompt is llama-server's repository-level one (core.backends.infill.repo_prompt), cut to the same
budget. A ``/completion`` request gives ``prompt``: text (its special-token text read as those tokens, after the
model's begin-of-text token), token ids, or both mixed in one list, as llama-server reads them.

Both take ``n_predict`` (or ``max_tokens``; -1: no limit; 0 only reads the prompt into the cache, as a plugin does to
have its extra files read before the user next pauses), ``n_indent`` and ``t_max_predict_ms`` (core.serve.stops),
``stop``, ``stream``, ``seed`` and ``response_fields``, meaning what they mean there.

Sampling is SpecLens's lossless one: ``temperature`` (<= 0: greedy), ``top_k``, ``top_p`` and ``min_p``, with
llama-server's defaults (0.8, 40, 0.95, 0.05); a ``samplers`` list names which of them apply (a chain without
``temperature`` samples at 1.0), applied min-p first (on the raw logits, as in llama-server's default chain), then
temperature, top-k and top-p whatever the order listed: what the draft and the verifier share, so the answer keeps
exactly that distribution. llama-server's other samplers (the plugins' ``infill``, ``typ_p``, penalties, ...) are not
implemented here and not applied: the answer's ``generation_settings.ignored`` names them, and the server says so
once in its log. What would make the answer follow a form (``grammar``, ``json_schema``, ``logit_bias``) is refused
rather than ignored: a client that asks for JSON must not get prose it takes for JSON.
"""
from __future__ import annotations

import logging

from core.backends.infill import Budget
from core.sampling import MAX_TEMPERATURE, SamplingError, SamplingParams
from core.serve.request import (MIN_P_ONE, Infill, RequestError, ServeRequest, json_object, number,
                                prompt_of, refuse_forms, stop_sequences, within)

log = logging.getLogger(__name__)

DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}      # llama-server's
KEEP_THE_LIKELIEST = ("typ_p", "typical_p", "top_n_sigma")
APPLIED = ("temperature", "top_k", "top_p", "min_p")
MAX_STOPS = 64
# llama-server's names of what changes the distribution beyond the four, with the value that leaves it unchanged
NEUTRAL = {"typical_p": 1.0, "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
           "dry_multiplier": 0.0, "xtc_probability": 0.0, "mirostat": 0, "top_n_sigma": -1.0}
RANDOM_SEEDS = (-1, 0xFFFFFFFF)   # llama-server's "pick one"
LETTERS = {"k": "top_k", "p": "top_p", "t": "temperature", "m": "min_p", "y": "typ_p", "x": "xtc", "d": "dry",
           "s": "top_n_sigma", "i": "infill", "e": "penalties"}
WINDOW = 2048    # tokens of prefix and suffix around the cursor: llama-server's default batch, with which it cuts them
_warned: set[str] = set()   # the samplers the log has named already


def budget(context_length: int, max_tokens: int | None) -> Budget:
    """How much of a request's text its prompt keeps: llama-server's cut, and at most half the context around the
    cursor where the context is small; the extra files fill what is left but room for twice the answer."""
    window = max(4, min(WINDOW, context_length // 2))
    return Budget(window, max(0, context_length - window - 2 * (max_tokens or 0)))


def _string(body: dict, name: str) -> str:
    value = body.get(name, "")
    if not isinstance(value, str):
        raise RequestError(f"'{name}' must be a string", param=name)
    return value


def _extra(body: dict) -> tuple[tuple[str, str], ...]:
    chunks = body.get("input_extra") or []
    if not isinstance(chunks, list):
        raise RequestError("'input_extra' must be a list of {\"filename\", \"text\"}", param="input_extra")
    out = []
    for i, chunk in enumerate(chunks):
        where = f"input_extra[{i}]"
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise RequestError(f"{where} must be an object with a string 'text'", param=where)
        filename = chunk.get("filename", "tmp")
        if not isinstance(filename, str):
            raise RequestError(f"{where}.filename must be a string", param=where)
        out.append((filename, chunk["text"]))
    return tuple(out)


def _samplers(body: dict) -> tuple[set[str], list[str]]:
    """Which of temperature, top-k, top-p and min-p apply, and what the request asks that is not applied."""
    named = body.get("samplers")
    if named is None:
        chain = set(APPLIED)
    else:
        if isinstance(named, str):   # llama-server's other spelling: a letter a sampler
            named = [LETTERS.get(c, c) for c in named]
        if not isinstance(named, list) or not all(isinstance(n, str) for n in named):
            raise RequestError("'samplers' must be a list of sampler names", param="samplers")
        chain = {n for n in named if n in APPLIED}
    ignored = [n for n in (named or ()) if n not in APPLIED]
    for name, neutral in NEUTRAL.items():
        value = body.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value != neutral and name not in ignored:
            ignored.append(name)
    return chain, ignored


def _sampling(body: dict, context_length: int) -> tuple[SamplingParams, list[str]]:
    chain, ignored = _samplers(body)
    temperature = number(body, "temperature", DEFAULTS["temperature"], -MAX_TEMPERATURE, MAX_TEMPERATURE)
    top_k = number(body, "top_k", DEFAULTS["top_k"], -2**31, 2**31, integer=True)
    top_p = number(body, "top_p", DEFAULTS["top_p"], 0.0, 1.0)
    min_p = number(body, "min_p", DEFAULTS["min_p"], 0.0, 1.0)
    seed = number(body, "seed", -1, -1, 2**63 - 1, integer=True)
    min_tokens = context_length if body.get("ignore_eos") is True else 0
    try:
        sampling = SamplingParams(
            temperature=max(0.0, float(temperature)) if "temperature" in chain else 1.0,
            top_k=max(0, top_k) if "top_k" in chain else 0,
            top_p=(float(top_p) if top_p > 0 else 1e-9) if "top_p" in chain else 1.0,
            min_p=min(float(min_p), MIN_P_ONE) if "min_p" in chain else 0.0,
            seed=None if seed in RANDOM_SEEDS else seed, min_tokens=min_tokens)
    except SamplingError as exc:
        raise RequestError(str(exc)) from None
    if sampling.greedy:     # filters that always keep the likeliest token change nothing for a greedy answer
        ignored = [n for n in ignored if n not in KEEP_THE_LIKELIEST]
    return sampling, ignored


def parse_infill(body, context_length: int) -> tuple[ServeRequest, tuple[str, ...], list[str]]:
    """The ``/infill`` request in ``body`` (parsed JSON): the engine's request, the ``response_fields`` asked for, and
    the samplers asked for that are not applied; RequestError if unusable."""
    body = json_object(body)
    infill = Infill(_string(body, "input_prefix"), _string(body, "input_suffix"), _string(body, "prompt"),
                    _extra(body))
    return _native(body, context_length, "/infill", infill=infill)


def parse_completion(body, context_length: int) -> tuple[ServeRequest, tuple[str, ...], list[str]]:
    """The ``/completion`` request in ``body``, as :func:`parse_infill` reads an ``/infill`` one."""
    body = json_object(body)
    prompt = prompt_of(body)
    if isinstance(prompt, str):
        return _native(body, context_length, "/completion", prompt=prompt)
    return _native(body, context_length, "/completion", pieces=prompt)


def _native(body: dict, context_length: int, endpoint: str, prompt: str | None = None,
            pieces: tuple[str | int, ...] | None = None,
            infill: Infill | None = None) -> tuple[ServeRequest, tuple[str, ...], list[str]]:
    """The fields both endpoints share, around the prompt (one of ``prompt``, ``pieces``, ``infill``)."""
    if number(body, "n_probs", 0, 0, 2**31, integer=True):
        raise RequestError("'n_probs' is not supported: SpecLens does not report token probabilities",
                           param="n_probs")
    refuse_forms(body)
    name = "n_predict" if "n_predict" in body else "max_tokens"
    limit = number(within(body, context_length, name), name, -1, -1, context_length, integer=True)
    sampling, ignored = _sampling(body, context_length)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("'stream' must be true or false", param="stream")
    fields = body.get("response_fields") or []
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        raise RequestError("'response_fields' must be a list of field names", param="response_fields")
    min_indent = number(body, "n_indent", 0, 0, 2**31, integer=True)
    newline_ms = number(body, "t_max_predict_ms", 0, 0, 2**53)
    request = ServeRequest(
        model=_string(body, "model"), messages=None, prompt=prompt, max_tokens=None if limit < 0 else limit,
        sampling=sampling, stop=stop_sequences(body, MAX_STOPS), stream=stream, include_usage=False, prediction=None,
        infill=infill, pieces=pieces, min_indent=min_indent,
        newline_after_s=newline_ms / 1000 if newline_ms > 0 else None, within_context=True)
    for sampler in ignored:
        if sampler not in _warned:
            _warned.add(sampler)
            log.warning("%s: the sampler '%s' is not applied (SpecLens samples with temperature, top_k, top_p and "
                        "min_p only); answers name what was not applied in generation_settings.ignored", endpoint,
                        sampler)
    return request, tuple(fields), ignored


def _field(whole: dict, path: str):
    value = whole
    for key in path.split("/"):
        if not isinstance(value, dict) or key not in value:
            return None, False
        value = value[key]
    return value, True


def only(whole: dict, fields: tuple[str, ...]) -> dict:
    """``whole`` with only the ``fields`` asked for, each under its path (``timings/prompt_n``), as llama-server
    answers ``response_fields``; all of it when none are asked for."""
    if not fields:
        return whole
    out = {}
    for path in fields:
        value, found = _field(whole, path)
        if found:
            out[path] = value
    return out


class NativeReply:
    """llama-server's answer shapes for one ``/infill`` or ``/completion`` request (``started``:
    core.serve.job.Started): whole, or streamed as a chunk a delta and the whole answer, its text already sent, to
    end."""

    END = ""     # llama-server's own stream ends with its last chunk
    NAMED = False

    def __init__(self, request: ServeRequest, model: str, fields: tuple[str, ...], ignored: list[str],
                 started) -> None:
        self.request, self.model, self.fields, self.ignored = request, model, fields, ignored
        self.prompt_tokens = started.prompt_tokens

    def opening(self) -> list[dict]:
        return []

    def deltas(self, delta) -> list[dict]:
        return [{"index": 0, "content": delta.text, "tokens": [], "stop": False, "id_slot": 0,
                 "tokens_predicted": delta.tokens, "tokens_evaluated": self.prompt_tokens}]

    def closing(self, finished) -> list[dict]:
        return [self._final(finished, streamed=True)]

    def whole(self, items: list) -> dict:
        return self._final(items[-1], streamed=False)

    def _final(self, finished, streamed: bool) -> dict:
        result, s, r = finished.result, finished.result.stats, self.request
        settings = {"n_predict": -1 if r.max_tokens is None else r.max_tokens,
                    "temperature": r.sampling.temperature, "top_k": r.sampling.top_k, "top_p": r.sampling.top_p,
                    "min_p": r.sampling.min_p,
                    "seed": r.sampling.seed if r.sampling.seed is not None else -1, "stop": list(r.stop),
                    "n_indent": r.min_indent, "stream": r.stream,
                    "samplers": [n for n in APPLIED if _applies(r.sampling, n)], "ignored": list(self.ignored)}
        whole = {"index": 0, "content": "" if streamed else finished.text,
                 "tokens": [] if streamed else list(result.tokens), "id_slot": 0, "stop": True, "model": self.model,
                 "tokens_predicted": s.new_tokens, "tokens_evaluated": s.prompt_tokens,
                 "generation_settings": settings, "has_new_line": "\n" in finished.text, "truncated": False,
                 "stop_type": finished.stop_type, "stopping_word": finished.stopping_word,
                 "tokens_cached": s.prompt_tokens + s.new_tokens, "timings": finished.timings}
        return only(whole, self.fields)


def _applies(sampling: SamplingParams, name: str) -> bool:
    return {"temperature": sampling.temperature != 1.0, "top_k": sampling.top_k > 0,
            "top_p": sampling.top_p < 1.0, "min_p": sampling.min_p > 0}[name]


def props(models, build: str) -> dict:
    """``GET /props`` as llama-server answers it, for the clients that read a server's context size, chat template
    and defaults there: the native endpoints' sampling defaults, one slot (one engine answers one request at a
    time), and how SpecLens decodes."""
    target = models.target
    template = getattr(target, "chat_template", None) or ""
    tools = bool(template) and models.tools_refused is None
    params = {**DEFAULTS, "n_predict": -1, "max_tokens": -1, "seed": RANDOM_SEEDS[1], "stream": False,
              "samplers": list(APPLIED), "speculative.types": models.strategy.label}
    return {"default_generation_settings": {"params": params, "n_ctx": target.context_length},
            "total_slots": 1, "model_alias": models.name, "model_path": str(getattr(target, "path", models.name)),
            "modalities": {"vision": False, "video": False, "audio": False},
            "endpoint_slots": False, "endpoint_props": False, "endpoint_metrics": True,
            "chat_template": template, "chat_template_caps": {"supports_tools": tools, "supports_tool_calls": tools},
            "build_info": build,
            "speclens": {"strategy": models.strategy.label,
                         "draft": getattr(models.draft, "name", None)}}
