"""Each engine's speculative-decoding statistics, read in its own names and said in one vocabulary: tokens drafted,
drafts accepted, verification steps, accepted drafts per draft position. Where an engine says nothing, the value is
None and ``source`` says so: nothing is guessed.

* llama.cpp's llama-server (and SpecLens's own server, which uses its names): ``timings.draft_n``,
  ``timings.draft_n_accepted`` (omitted when nothing was drafted), SpecLens adds ``draft_n_verif_steps``;
  ``/metrics`` with ``llamacpp:spec_decode_*_total`` counters.
* vLLM: per request with ``--per-request-spec-decode-metrics``: ``metrics.speculative_decoding`` (``num_spec_steps``,
  ``num_draft_tokens``, ``num_accepted_draft_tokens``, ``acceptance_histogram``: steps that accepted exactly j);
  ``/metrics``: ``vllm:spec_decode_*_total`` counters with ``model_name`` and ``engine`` labels.
* SGLang: ``sglext.spec_tokens_details`` on OpenAI responses (``return_spec_tokens_details``) or ``meta_info`` on
  /generate: ``spec_verify_ct``, and by version ``spec_num_correct_drafts`` / ``spec_accept_token_num`` /
  ``spec_accepted_drafts``, ``spec_num_proposed_drafts`` / ``spec_draft_token_num`` / ``spec_proposed_drafts``,
  ``spec_correct_drafts_histogram`` / ``spec_accept_histogram``.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

LLAMA_CPP, VLLM, SGLANG, SPECLENS, UNKNOWN = "llama.cpp", "vllm", "sglang", "speclens", "unknown"
METRIC_PREFIXES = {LLAMA_CPP: "llamacpp:", VLLM: "vllm:", SPECLENS: "speclens:"}


@dataclass(frozen=True)
class SpecStats:
    engine: str
    drafted: int | None = None
    accepted: int | None = None
    verify_steps: int | None = None
    accepted_per_position: tuple[int, ...] | None = None
    source: str = ""

    @property
    def reported(self) -> bool:
        return any(v is not None for v in (self.drafted, self.accepted, self.verify_steps))

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted and self.accepted is not None else None

    @property
    def accepted_per_step(self) -> float | None:
        return self.accepted / self.verify_steps if self.verify_steps and self.accepted is not None else None

    def describe(self) -> str:
        if not self.reported:
            return f"{self.engine}: no speculative statistics ({self.source or 'none reported'})"
        parts = []
        if self.drafted is not None and self.accepted is not None:
            rate = f" ({100 * self.acceptance_rate:.0f}%)" if self.acceptance_rate is not None else ""
            parts.append(f"draft {self.accepted} accepted / {self.drafted} drafted{rate}")
        elif self.accepted is not None:
            parts.append(f"{self.accepted} drafts accepted")
        if self.verify_steps is not None:
            parts.append(f"{self.verify_steps} verification steps")
        return f"{self.engine}: " + ", ".join(parts)


def _int(value) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def from_llama_cpp(timings: dict | None, engine: str = LLAMA_CPP) -> SpecStats:
    """llama-server's ``timings`` (SpecLens's server uses the same names, with ``draft_n_verif_steps``)."""
    if not isinstance(timings, dict):
        return SpecStats(engine, source="no timings in the response")
    if "draft_n" not in timings:   # llama-server leaves the draft fields out when it drafted nothing
        return SpecStats(engine, 0, 0, _int(timings.get("draft_n_verif_steps")),
                         source="timings: no draft_n, so nothing was drafted")
    return SpecStats(engine, _int(timings.get("draft_n")), _int(timings.get("draft_n_accepted")),
                     _int(timings.get("draft_n_verif_steps")), source="timings.draft_n, timings.draft_n_accepted")


def _per_position(histogram) -> tuple[int, ...] | None:
    """From a histogram of steps by how many drafts they accepted (index j: exactly j; or {"j": steps}), the accepted
    drafts at each position: a draft at position p was accepted in every step that accepted more than p."""
    if isinstance(histogram, dict):
        dense: list[int] = []
        for key, count in histogram.items():
            j = int(key)
            dense += [0] * (j + 1 - len(dense))
            dense[j] += int(count)
        histogram = dense
    if not isinstance(histogram, list) or not histogram:
        return None
    return tuple(int(sum(histogram[p + 1:])) for p in range(len(histogram) - 1))


def from_vllm(response: dict) -> SpecStats:
    """vLLM's per-request ``metrics.speculative_decoding`` (or the older per-choice ``speculative_decoding_stats``)."""
    metrics = (response.get("metrics") or {}).get("speculative_decoding") if isinstance(response, dict) else None
    if metrics is None and isinstance(response, dict):
        choices = response.get("choices") or [{}]
        metrics = choices[0].get("speculative_decoding_stats") if isinstance(choices[0], dict) else None
    if not isinstance(metrics, dict):
        return SpecStats(VLLM, source="no metrics.speculative_decoding: start vLLM with "
                                      "--per-request-spec-decode-metrics summary, or read its /metrics")
    return SpecStats(VLLM, _int(metrics.get("num_draft_tokens")), _int(metrics.get("num_accepted_draft_tokens")),
                     _int(metrics.get("num_spec_steps")), _per_position(metrics.get("acceptance_histogram")),
                     source="metrics.speculative_decoding")


def _first(fields: dict, *names: str):
    return next((fields[n] for n in names if n in fields), None)


def from_sglang(response: dict, completion_tokens: int | None = None) -> SpecStats:
    """SGLang's ``sglext.spec_tokens_details`` (OpenAI endpoints) or ``meta_info`` (/generate), in any of the
    spellings its versions used."""
    fields = None
    if isinstance(response, dict):
        fields = (response.get("sglext") or {}).get("spec_tokens_details") or response.get("meta_info")
    if not isinstance(fields, dict) or "spec_verify_ct" not in fields:
        return SpecStats(SGLANG, source="no spec_tokens_details: ask with return_spec_tokens_details (SGLang with "
                                        "--speculative-algorithm)")
    steps = _int(fields["spec_verify_ct"])
    accepted = _int(_first(fields, "spec_num_correct_drafts", "spec_accept_token_num", "spec_accepted_drafts"))
    drafted = _int(_first(fields, "spec_num_proposed_drafts", "spec_draft_token_num", "spec_proposed_drafts"))
    if accepted is None and steps is not None and completion_tokens is not None:
        accepted = completion_tokens - steps   # every verification step adds one token of the target's own
    histogram = _first(fields, "spec_correct_drafts_histogram", "spec_accept_histogram")
    return SpecStats(SGLANG, drafted, accepted, steps, _per_position(histogram),
                     source="sglext.spec_tokens_details" if "sglext" in response else "meta_info")


def _counters(text: str, prefix: str) -> dict:
    """Counter totals of ``prefix``spec_decode_* summed over label sets (engines), per position for the per-position
    counter."""
    totals: dict = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith(prefix + "spec_decode_") or not sample.name.endswith("_total"):
                continue
            name = sample.name[len(prefix):]
            if "position" in sample.labels:
                totals[(name, int(sample.labels["position"]))] += sample.value
            else:
                totals[name] += sample.value
    return totals


def from_metrics(before: str, after: str, engine: str) -> SpecStats:
    """What one request added to an engine's Prometheus counters (the scrape before it and the one after)."""
    prefix = METRIC_PREFIXES.get(engine)
    if prefix is None:
        return SpecStats(engine, source=f"{engine} has no spec_decode counters")
    a, b = _counters(before, prefix), _counters(after, prefix)
    if not any(isinstance(k, str) for k in b):
        return SpecStats(engine, source=f"/metrics has no {prefix}spec_decode_* counters")

    def delta(name: str) -> int | None:
        return int(b[name] - a.get(name, 0.0)) if name in b else None

    positions = sorted(k[1] for k in b if isinstance(k, tuple))
    per_pos = tuple(int(b[("spec_decode_num_accepted_tokens_per_pos_total", p)]
                        - a.get(("spec_decode_num_accepted_tokens_per_pos_total", p), 0.0)) for p in positions)
    return SpecStats(engine, delta("spec_decode_num_draft_tokens_total"),
                     delta("spec_decode_num_accepted_tokens_total"), delta("spec_decode_num_drafts_total"),
                     per_pos or None, source=f"/metrics {prefix}spec_decode_* (the request's difference)")


def detect(owned_by: str, headers: dict) -> str:
    """Which engine answers, from ``/v1/models``' ``owned_by`` and the response headers."""
    lowered = {k.lower(): str(v).lower() for k, v in headers.items()}
    if lowered.get("x-served-by") == SPECLENS or owned_by == SPECLENS:
        return SPECLENS
    if "llama.cpp" in lowered.get("server", "") or owned_by == "llamacpp":
        return LLAMA_CPP
    if owned_by in (VLLM, SGLANG):
        return owned_by
    return UNKNOWN


def from_response(engine: str, response: dict, completion_tokens: int | None = None) -> SpecStats:
    """The statistics a finished response (or a stream's last chunk) carries, by engine."""
    if engine in (LLAMA_CPP, SPECLENS):
        return from_llama_cpp(response.get("timings"), engine)
    if engine == VLLM:
        return from_vllm(response)
    if engine == SGLANG:
        return from_sglang(response, completion_tokens)
    return SpecStats(engine, source="this engine reports no speculative statistics that SpecLens knows")
