"""One served request as an engine job: template, check, draft from the client's prediction, decode, report.

It runs on the engine thread (the executor's) and pushes plain items for the HTTP layer to translate: ``Started``
(the prompt was accepted), ``Delta`` (text that may be sent, stop sequences held back and cut), then ``Finished``
(finish reason, OpenAI's ``usage``, llama-server's ``timings``). The engine itself is the chat's: the same strategy
objects, verifiers and lossless guarantees; a prediction is only a memory document for this request.
"""
from __future__ import annotations

import difflib
import threading
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Sequence

from core.auto import attach_memory
from core.backends.base import BackendError, Cancelled, cached_prompt
from core.backends.infill import infill_prompt, repo_prompt
from core.engine import SpeculativeEngine
from core.events import GenerationResult, GenerationStats, StepEvent, StopReason
from core.memory import SuffixMemory
from core.sampling import Rng
from core.serve.native import budget
from core.serve.request import RequestError, ServeRequest
from core.serve.stops import WORD, StopText
from core.serve.tools import CLOSE, OPEN
from core.serve.vocab import token_ids


@dataclass(frozen=True)
class Started:
    prompt_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class Delta:
    text: str
    tokens: int = 0             # tokens decoded so far


@dataclass(frozen=True)
class Finished:
    finish_reason: str          # "stop", "length", or "cancelled" (the client went away)
    text: str
    usage: dict
    timings: dict
    result: GenerationResult
    stop_type: str = "eos"      # llama-server's: "eos", "word" (a stop sequence), "limit", "none" (cancelled)
    stopping_word: str = ""


@dataclass(frozen=True)
class ServedRecord:
    """A finished request as the window lists it: who asked, what, and how it was decoded."""

    client: str
    request: ServeRequest
    prompt_ids: tuple[int, ...]
    finished: Finished
    started_at: float            # time.time() when decoding began


class Observer:
    """What watches served requests (the window): every step as it is decoded, and each finished request. Called on
    the engine thread."""

    def started(self, client: str, request: ServeRequest, strategy: str) -> None:
        """A request begins decoding."""

    def step(self, event: StepEvent) -> None:
        """One step of the request being decoded."""

    def finished(self, record: ServedRecord) -> None:
        """The request ended (whatever the reason)."""


PROBE_TOOL = {"type": "function", "function": {"name": "probe", "description": "",
                                               "parameters": {"type": "object", "properties": {}}}}


@dataclass
class ServedModels:
    """The pair a server decodes with, its strategy, and the memory its drafts copy from: this process's own (never
    the user's chat memory), holding a request's prediction while that request decodes and, unless
    ``remember_answers`` is off, the answers served so far."""

    target: object
    draft: object
    strategy: object
    name: str
    remember_answers: bool = True
    rng_factory: Callable = Rng      # the random source of each request's engine (tests enumerate it exactly)
    memory: SuffixMemory = field(init=False)

    def __post_init__(self) -> None:
        self.memory = SuffixMemory(self.target.fingerprint())
        self._empty = self.memory.snapshot()
        self.strategy = attach_memory(self.strategy, self.memory)

    def forget(self) -> None:
        """Drop the answers remembered: the next request drafts only from itself and its prediction."""
        self.memory.restore(self._empty)

    def prompt_ids(self, request: ServeRequest) -> list[int]:
        """RequestError when the request fills in the middle and the model has no tokens to do it with."""
        if request.chat:
            return self.chat_prompt(request.messages, request.tools)
        if request.pieces is not None:
            return token_ids(self.target, request.pieces)
        if request.suffix is None and request.infill is None:
            return self.target.tokenize_special(request.prompt)
        tokens = self.target.infill_tokens()
        if tokens is None:
            if request.infill is not None:
                raise RequestError(f"{self.name} has no fill-in-the-middle tokens: it cannot complete at a cursor "
                                   "(serve a code model, e.g. Qwen2.5-Coder)", 501, kind="not_supported_error")
            raise RequestError(f"{self.name} has no fill-in-the-middle tokens: it cannot complete between a prompt "
                               "and a 'suffix'", param="suffix")
        if request.infill is not None:
            infill = request.infill
            return repo_prompt(tokens, self.target.tokenize, infill.prefix, infill.suffix, infill.typed, infill.extra,
                               budget(self.target.context_length, request.max_tokens))
        return infill_prompt(tokens, self.target.tokenize(request.prompt), self.target.tokenize(request.suffix))

    def chat_prompt(self, messages: Sequence[dict], tools: Sequence[dict] = ()) -> list[int]:
        """A chat's prompt, with the tools it offers where the model's template puts them; RequestError where the
        template has no place for them or asks for calls in a form other than the one SpecLens reads."""
        try:
            if tools and self.tools_refused is not None:
                raise RequestError(self.tools_refused, param="tools")
            return self.target.apply_chat_template(list(messages), tools)
        except BackendError as exc:      # a model without a chat template (or a tokenizer): it serves no chats
            raise RequestError(str(exc), 501, kind="not_supported_error") from None

    @cached_property
    def tools_refused(self) -> str | None:
        """Why this model's template cannot offer tools in the form SpecLens reads, None where it can: a property of
        the template, read once from a chat of one message rendered with a tool and without (a conversation's own
        text, an earlier call say, cannot pass for the template's instructions)."""
        chat = [{"role": "user", "content": "?"}]
        offered = self.target.apply_chat_template(chat, (PROBE_TOOL,))
        if offered == self.target.apply_chat_template(chat):
            return f"{self.name}'s chat template has no place for tools: it cannot be offered any"
        if OPEN not in self.target.detokenize(offered):
            return (f"{self.name}'s chat template asks for tool calls in a form SpecLens does not read (it reads the "
                    f"Hermes and Qwen form, {OPEN}...{CLOSE})")
        return None


def accepted_prediction_tokens(prediction: Sequence[int], completion: Sequence[int]) -> int:
    """OpenAI's definition: the tokens of the prediction that appeared in the completion (matched in order)."""
    matcher = difflib.SequenceMatcher(None, list(prediction), list(completion), autojunk=False)
    return sum(block.size for block in matcher.get_matching_blocks())


def _limits(models: ServedModels, request: ServeRequest, prompt: list[int]) -> int:
    """How many tokens may be generated: ``max_tokens``, within the context; RequestError when it cannot fit."""
    context = models.target.context_length
    room = context - len(prompt)
    where = "messages" if request.chat else "prompt"
    if not prompt:       # a text completion's empty text, where the model puts no begin-of-text token before it
        raise RequestError("the prompt is empty: there is nothing to continue", param=where)
    if room < 1:
        raise RequestError(f"This model's maximum context length is {context} tokens, but the {where} has "
                           f"{len(prompt)} tokens. Shorten it, or serve a larger context (speclens serve -c N, 0 for "
                           "all the model was trained with; in the window, Settings > Context).", param=where,
                           code="context_length_exceeded")
    if request.within_context and request.max_tokens is not None:
        return min(request.max_tokens, room)
    if request.max_tokens is not None and request.max_tokens > room:
        raise RequestError(f"This model's maximum context length is {context} tokens: the {where} has {len(prompt)} "
                           f"tokens, so at most {room} can be generated, not {request.max_tokens}.",
                           param="max_tokens", code="context_length_exceeded")
    return room if request.max_tokens is None else request.max_tokens


def _timings(result: GenerationResult) -> dict:
    """llama-server's timing names (with ``draft_n_verif_steps``, the steps that verified a draft)."""
    s = result.stats
    first = s.time_to_first_token or s.seconds
    read, decoded = s.prompt_tokens - s.cached_tokens, s.seconds - first
    return {"prompt_n": read, "prompt_ms": 1000 * first, "cache_n": s.cached_tokens,
            "prompt_per_token_ms": 1000 * first / read if read else 0.0,
            "prompt_per_second": read / first if first > 0 else 0.0,
            "predicted_n": s.new_tokens, "predicted_ms": 1000 * decoded,
            # as llama-server: the first token comes with the prompt, the rest in the decode time (0 when there is none),
            # and what a first step drafted came with it (GenerationStats.tokens_per_second)
            "predicted_per_second": s.tokens_per_second if decoded > 0 else 0.0,
            "predicted_per_token_ms": 1000 / s.tokens_per_second if decoded > 0 and s.tokens_per_second else 0.0,
            "draft_n": s.drafted, "draft_n_accepted": s.accepted,
            "draft_n_verif_steps": sum(1 for step in result.steps if step.nodes)}


def _usage(result: GenerationResult, prediction: Sequence[int] | None) -> dict:
    s = result.stats
    usage = {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.new_tokens,
             "total_tokens": s.prompt_tokens + s.new_tokens,
             "prompt_tokens_details": {"cached_tokens": s.cached_tokens}}
    if prediction is not None:
        accepted = accepted_prediction_tokens(prediction, result.tokens)
        usage["completion_tokens_details"] = {"accepted_prediction_tokens": accepted,
                                              "rejected_prediction_tokens": len(prediction) - accepted}
    return usage


def run_request(models: ServedModels, request: ServeRequest, push: Callable[[object], None],
                cancel: threading.Event, observer: Observer | None = None, client: str = "") -> None:
    """Decode ``request`` on the calling (engine) thread, pushing Started, Deltas and Finished; RequestError before
    Started when the request cannot be served. ``cancel`` (a client that went away) stops it within one step."""
    target = models.target
    prompt = models.prompt_ids(request)
    max_new = _limits(models, request, prompt)
    if max_new == 0:
        _read_only(target, prompt, push, cancel)
        return
    prediction = target.tokenize(request.prediction) if request.prediction else None
    memory = models.memory
    before = memory.snapshot() if models.remember_answers else models._empty
    memory.restore(before)
    if prediction:
        memory.add_document(prediction, source="prediction")
    engine = SpeculativeEngine(target, models.draft, models.strategy, request.sampling,
                               rng_factory=models.rng_factory)
    push(Started(len(prompt), cached_prompt(target, prompt)))
    if observer is not None:
        observer.started(client, request, models.strategy.label)
    stops = StopText(request.stop, request.min_indent, request.newline_after_s)
    started_at = time.time()
    steps = engine.stream(prompt, max_new, cancel)
    try:
        for event in steps:
            if observer is not None:
                observer.step(event)
            out = stops.push(event.text)
            if out:
                push(Delta(out, event.stats.new_tokens))
            if stops.stopped:
                break
    finally:
        steps.close()   # at a stop sequence the engine ends here: nothing after it is decoded
        # the prediction was this request's alone; what the server answered is remembered (unless it should not be)
        memory.restore(before)
    result = engine.last_result
    if models.remember_answers and result.tokens:
        memory.add_answer(prompt, result.tokens, result.token_probs, engine.sampling.distribution_key)
    tail = stops.flush()
    if tail:
        push(Delta(tail, result.stats.new_tokens))
    if stops.stopped:
        reason, stop_type = "stop" if stops.reason == WORD else "length", stops.reason
    elif result.stop_reason == StopReason.EOS:
        reason, stop_type = "stop", "eos"
    elif result.stop_reason == StopReason.CANCELLED:
        reason, stop_type = "cancelled", "none"
    else:
        reason, stop_type = "length", "limit"
    finished = Finished(reason, stops.text, _usage(result, prediction), _timings(result), result, stop_type,
                        stops.stopping_word)
    push(finished)
    if observer is not None:
        observer.finished(ServedRecord(client, request, tuple(prompt), finished, started_at))


def _read_only(target, prompt: list[int], push: Callable[[object], None], cancel: threading.Event) -> None:
    """A request for no tokens: its prompt is read into the cache (all but the last token, as a generation would),
    so that the next request sharing its beginning starts from there; nothing is decoded, drafted or remembered."""
    cached = cached_prompt(target, prompt)
    push(Started(len(prompt), cached))
    t0 = time.perf_counter()
    stop = StopReason.MAX_TOKENS
    try:
        if len(prompt) > 1:
            target.prefill(prompt[:-1], cancel=cancel)
    except Cancelled:
        stop = StopReason.CANCELLED
    seconds = time.perf_counter() - t0
    result = GenerationResult((), "", (), GenerationStats(seconds=seconds, prefill_seconds=seconds,
                                                          prompt_tokens=len(prompt), cached_tokens=cached), stop)
    cancelled = stop == StopReason.CANCELLED
    push(Finished("cancelled" if cancelled else "length", "", _usage(result, None), _timings(result), result,
                  "none" if cancelled else "limit"))
