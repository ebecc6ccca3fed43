"""The server's Prometheus metrics: vLLM's speculative-decoding counter names under a ``speclens:`` prefix, request
counts and latency histograms, in prometheus_client's text format (its own registry, so two servers in one process
never mix)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from core.events import GenerationResult

PREFIX = "speclens:"
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
RATE_BUCKETS = (1, 2, 5, 10, 15, 20, 30, 40, 60, 80, 120, 200, 400)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServerMetrics:
    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"model_name": model}
        self._labels = labels
        names = list(labels)

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(PREFIX + name, doc, names + list(extra), registry=self.registry)

        self.drafts = counter("spec_decode_num_drafts", "Number of spec decoding drafts (steps that verified one).")
        self.draft_tokens = counter("spec_decode_num_draft_tokens", "Number of draft tokens.")
        self.accepted_tokens = counter("spec_decode_num_accepted_tokens", "Number of accepted tokens.")
        self.accepted_per_pos = counter("spec_decode_num_accepted_tokens_per_pos",
                                        "Accepted tokens per draft position (depth in the draft tree, from 0).",
                                        ("position",))
        self.requests = counter("request_success", "Requests finished, by reason.", ("finished_reason",))
        self.failures = counter("request_failure", "Requests refused or failed, by HTTP status.", ("status",))
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished requests.")
        self.cached_tokens = counter("prompt_tokens_cached", "Prompt tokens found in the KV cache.")
        self.generation_tokens = counter("generation_tokens", "Generated tokens.")
        self.prediction_accepted = counter("prediction_tokens_accepted",
                                           "Predicted Outputs: tokens of predictions that appeared in completions.")
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds", "Time to the first token.", names,
                              buckets=LATENCY_BUCKETS, registry=self.registry)
        self.e2e = Histogram(PREFIX + "e2e_request_latency_seconds", "Time from start of decoding to the last token.",
                             names, buckets=LATENCY_BUCKETS, registry=self.registry)
        self.rate = Histogram(PREFIX + "request_decode_tokens_per_second",
                              "Decode speed of each request after its first token.", names, buckets=RATE_BUCKETS,
                              registry=self.registry)
        self.waiting = Gauge(PREFIX + "num_requests_waiting", "Requests waiting for the engine.", names,
                             registry=self.registry)
        self.running = Gauge(PREFIX + "num_requests_running", "Requests being decoded.", names,
                             registry=self.registry)

    def observe(self, result: GenerationResult, reason: str, usage: dict) -> None:
        """A finished request's counts."""
        s, labels = result.stats, self._labels
        self.requests.labels(**labels, finished_reason=reason).inc()
        self.prompt_tokens.labels(**labels).inc(s.prompt_tokens)
        self.cached_tokens.labels(**labels).inc(s.cached_tokens)
        self.generation_tokens.labels(**labels).inc(s.new_tokens)
        self.drafts.labels(**labels).inc(sum(1 for step in result.steps if step.nodes))
        self.draft_tokens.labels(**labels).inc(s.drafted)
        self.accepted_tokens.labels(**labels).inc(s.accepted)
        for depth, accepted in enumerate(s.accepted_by_depth):
            self.accepted_per_pos.labels(**labels, position=str(depth)).inc(accepted)
        details = usage.get("completion_tokens_details") or {}
        self.prediction_accepted.labels(**labels).inc(details.get("accepted_prediction_tokens", 0))
        if s.time_to_first_token is not None:
            self.ttft.labels(**labels).observe(s.time_to_first_token)
        self.e2e.labels(**labels).observe(s.seconds)
        if s.new_tokens > 1:
            self.rate.labels(**labels).observe(s.tokens_per_second)

    def refused(self, status: int) -> None:
        self.failures.labels(**self._labels, status=str(status)).inc()

    def queue(self, waiting: int, running: int) -> None:
        self.waiting.labels(**self._labels).set(waiting)
        self.running.labels(**self._labels).set(running)

    def text(self) -> bytes:
        return generate_latest(self.registry)
