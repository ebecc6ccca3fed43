"""The chat answered by another engine (Settings: chat through an endpoint): the job the chat session runs instead of
decoding locally. The chat is fitted to the context with the local tokenizer, sent as messages, and streamed back as
the StepEvents every face draws; what the engine said of its speculation comes last, in its own words."""
from __future__ import annotations

from dataclasses import dataclass

from app.secrets import get_key
from core.context import fit_chat
from core.endpoints.client import Endpoint, EndpointRun, probe


@dataclass(frozen=True)
class EngineReport:
    """Pushed after an endpoint's answer: its speculative statistics, described (or why there are none)."""

    text: str


def endpoint_of(settings) -> Endpoint:
    return Endpoint(settings.endpoint_url, get_key(settings.endpoint_url), settings.endpoint_model)


def endpoint_job(settings, target, system: str, messages: list[dict], max_new: int, start: int, sampling,
                 fitted_item):
    """A worker job (push, cancel) -> GenerationResult answering ``messages`` on the settings' endpoint;
    ``fitted_item(fitted)`` is pushed first, as the local job does."""
    endpoint = endpoint_of(settings)

    def job(push, cancel):
        fitted = fit_chat(system, messages, target.apply_chat_template, target.context_length, max_new, start)
        push(fitted_item(fitted))
        found = probe(endpoint)
        model = endpoint.model or found.models[0]
        run = EndpointRun.for_target(Endpoint(endpoint.url, endpoint.api_key, model), found.engine, target)
        head = [{"role": "system", "content": system}] if system else []
        for event in run.stream(head + messages[fitted.start:], max_new, sampling, cancel):
            push(event)
        push(EngineReport(run.result.stats.describe()))
        return run.result.result

    return job
