"""llama-server's own endpoints on `speclens serve`: ``/infill`` as the editor plugins for local models call it
(llama.vim, llama.vscode) and ``/completion`` as Continue's llama.cpp provider and llama-server's scripts do. The
repository-level prompt and its cuts, a prompt of text, token ids or both, the rules that end a completion at the
cursor, the answer's shapes (whole, streamed, ``response_fields``), reading a prompt for no tokens, a client that
leaves, and every refusal. Greedy answers are Baseline's greedy decode of the same prompt, token for token, whatever
the tiny model says."""
from __future__ import annotations

import json

import httpx
import pytest

from core.backends.hf import HFBackend
from core.backends.infill import FILENAME, PROJECT, SNIPPET, Budget, FimTokens, infill_prompt, repo_prompt
from core.drafting import Baseline
from core.engine import SpeculativeEngine
from core.memory import Memory
from core.sampling import SamplingParams
from core.serve.job import ServedModels
from core.serve.native import budget, only, parse_completion, parse_infill
from core.serve.request import MIDDLE_MARK, RequestError
from core.serve.stops import LIMIT, WORD, StopText
from core.tiny import tiny_model, tiny_tokenizer
from tests.served import Recorder, serving

FIM = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>")
BEFORE = "def area(w, h):\n"
TYPED = "    return "
AFTER = "\n\nprint(area(2, 3))\n"
EXTRA = [{"filename": "shapes.py", "text": "def square(s):\n    return s * s\n"}]


def chars(text: str) -> list[int]:
    return [ord(c) for c in text]


# -- the prompt --------------------------------------------------------------------------------------------------
def test_the_repository_level_prompt_puts_the_other_files_first_and_the_typed_line_after_the_prefix():
    tokens = FimTokens(-1, -2, -3, repo=-4, file_sep=-5)
    got = repo_prompt(tokens, chars, "ab\n", "cd", "x", [("f.py", "F")], Budget(window=400, extra=1000))
    assert got == [-4, *chars(PROJECT + "\n"), -5, *chars("f.py\n"), *chars("F"), -5, *chars(FILENAME + "\n"),
                   -1, *chars("ab\nx"), -2, *chars("cd"), -3]


def test_without_repository_tokens_the_other_files_are_set_apart_as_text_and_no_file_name_is_added():
    tokens = FimTokens(-1, -2, -3)
    got = repo_prompt(tokens, chars, "p", "s", "", [("a", "A"), ("b", "B")], Budget(window=400, extra=1000))
    assert got == [*chars(SNIPPET + "A" + SNIPPET + "B"), -1, *chars("p"), -2, *chars("s"), -3]
    assert repo_prompt(tokens, chars, "p", "s", "", [], Budget(400, 0)) == infill_prompt(tokens, chars("p"),
                                                                                          chars("s"))


def test_each_part_is_cut_to_its_budget_keeping_what_is_nearest_the_cursor():
    tokens = FimTokens(-1, -2, -3, repo=None, file_sep=-5)
    window = Budget(window=16, extra=5)             # prefix 12 tokens; suffix 4 - (2 + typed) = 1 with typed 1
    got = repo_prompt(tokens, chars, "0123456789abcdefgh", "ABCDEF", "t", [("n", "XYZ")], window)
    files = [-5, *chars("n\nXYZ"), -5, *chars(FILENAME + "\n")]
    assert got == [*files[-5:], -1, *chars("6789abcdefgh"), *chars("t"), -2, *chars("A"), -3]
    assert Budget(16, 0).suffix(typed=10) == 0
    with pytest.raises(ValueError):
        Budget(window=2, extra=0)


def test_the_budget_leaves_room_for_the_answer_and_stays_within_a_small_context():
    big = budget(32768, 128)
    assert big.window == 2048 and big.extra == 32768 - 2048 - 256
    small = budget(1000, None)
    assert small.window == 500 and small.extra == 500


# -- where a completion ends -------------------------------------------------------------------------------------
def test_a_line_indented_less_than_asked_ends_the_answer_before_its_text_and_the_first_line_is_never_checked():
    s = StopText([], min_indent=4)
    sent = s.push("x = 1\n    y") + s.push(" = 2\n  ") + s.push("  z\n") + s.push("  ") + s.push("w = 3\n")
    assert s.stopped and s.reason == LIMIT and s.text == "x = 1\n    y = 2\n    z\n  " and sent == s.text
    blank = StopText([], min_indent=2)
    blank.push("a\n  b\n\nc")                        # an empty line is indented less than anything
    assert blank.text == "a\n  b\n"
    first = StopText([], min_indent=8)
    assert first.push("no indent here") == "no indent here" and not first.stopped


def test_once_the_time_is_up_the_answer_ends_after_its_next_newline():
    s = StopText([], newline_after_s=0.0)
    assert s.push("first line") == "first line" and not s.stopped
    assert s.push(" still\nsecond\n") == " still\n" and s.stopped and s.reason == LIMIT
    never = StopText([], newline_after_s=None)
    never.push("a\nb\n")
    assert not never.stopped


def test_the_earliest_rule_ends_the_answer_and_says_which():
    s = StopText(["END"], min_indent=2)
    s.push("a\n  bEND\nc")
    assert s.text == "a\n  b" and s.reason == WORD and s.stopping_word == "END"


# -- the request -------------------------------------------------------------------------------------------------
def test_sampling_follows_llama_servers_defaults_and_sampler_chain_and_names_what_it_cannot_apply():
    default, _, ignored = parse_infill({}, 4096)
    s = default.sampling
    assert (s.temperature, s.top_k, s.top_p, s.min_p) == (0.8, 40, 0.95, 0.05) and ignored == []
    assert parse_infill({"min_p": 0.2}, 4096)[0].sampling.min_p == 0.2
    assert parse_infill({"min_p": 1}, 4096)[0].sampling.min_p < 1               # only the likeliest, as there
    vim, _, ignored = parse_infill({"samplers": ["top_k", "top_p", "infill"], "top_k": 40, "top_p": 0.9}, 4096)
    s = vim.sampling                                                            # no temperature, no min-p
    assert (s.temperature, s.top_k, s.top_p, s.min_p) == (1.0, 40, 0.9, 0.0) and ignored == ["infill"]
    sampled, _, ignored = parse_infill({"temperature": 0.5, "min_p": 0.1, "samplers": "kmti", "typical_p": 0.9},
                                       4096)
    s = sampled.sampling
    assert (s.top_p, s.top_k, s.min_p) == (1.0, 40, 0.1) and ignored == ["infill", "typical_p"]
    greedy, _, ignored = parse_infill({"temperature": -1, "typical_p": 0.9, "samplers": "kti"}, 4096)
    assert greedy.sampling.greedy and ignored == ["infill"]      # typical-p never drops the likeliest token
    seeded, _, _ = parse_infill({"seed": 7, "temperature": 0.5}, 4096)
    assert seeded.sampling.seed == 7 and parse_infill({"seed": -1}, 4096)[0].sampling.seed is None


def test_the_request_keeps_the_cursor_the_limits_and_the_fields_asked_for():
    body = {"input_prefix": BEFORE, "input_suffix": AFTER, "prompt": TYPED, "input_extra": EXTRA, "n_predict": 0,
            "n_indent": 4, "t_max_predict_ms": 250, "stop": ["\n\n"], "response_fields": ["content"]}
    request, fields, _ = parse_infill(body, 4096)
    assert request.infill.extra == (("shapes.py", EXTRA[0]["text"]),) and request.max_tokens == 0
    assert request.min_indent == 4 and request.newline_after_s == 0.25 and request.stop == ("\n\n",)
    assert request.text == f"{BEFORE}{TYPED}{MIDDLE_MARK}{AFTER}" and fields == ("content",)
    assert parse_infill({"n_predict": -1}, 4096)[0].max_tokens is None
    assert parse_infill({"max_tokens": 9}, 4096)[0].max_tokens == 9
    # llama-server's n_predict is a ceiling: past the context it answers until the context is full, not refuses
    ceiling = parse_infill({"n_predict": 10**6}, 4096)[0]
    assert ceiling.max_tokens == 4096 and ceiling.within_context
    for bad, param in (({"input_extra": [{"filename": "a"}]}, "input_extra[0]"), ({"input_prefix": 3}, "input_prefix"),
                       ({"n_predict": -2}, "n_predict"), ({"n_probs": 3}, "n_probs"), ({"stream": "yes"}, "stream"),
                       ({"response_fields": "content"}, "response_fields"), ({"samplers": 5}, "samplers"),
                       ({"grammar": 'root ::= "a"'}, "grammar"), ({"json_schema": {"type": "object"}}, "json_schema"),
                       ({"logit_bias": [[5, -100]]}, "logit_bias")):
        with pytest.raises(RequestError) as refused:
            parse_infill(bad, 4096)
        assert refused.value.param == param, bad
    assert parse_infill({"grammar": "", "logit_bias": []}, 4096)[0].infill is not None    # empty: nothing asked


def test_a_completion_prompt_is_text_token_ids_or_both_and_one_prompt_per_request():
    text = parse_completion({"prompt": "def f"}, 4096)[0]
    assert text.prompt == "def f" and text.pieces is None and text.infill is None
    assert parse_completion({"prompt": ["def f"]}, 4096)[0].prompt == "def f"        # a list of one prompt
    assert parse_completion({"prompt": [[5, 6, 7]]}, 4096)[0].pieces == (5, 6, 7)
    mixed = parse_completion({"prompt": [5, "ab", 7]}, 4096)[0]
    assert mixed.pieces == (5, "ab", 7) and mixed.prompt is None and mixed.text == "\u27e85\u27e9ab\u27e87\u27e9"
    for bad in ({}, {"prompt": None}, {"prompt": []}, {"prompt": [True]}, {"prompt": [1.5]}, {"prompt": ["a", "b"]},
                {"prompt": [[1], [2]]}, {"prompt": {"text": "a"}}):
        with pytest.raises(RequestError) as refused:
            parse_completion(bad, 4096)
        assert refused.value.param == "prompt", bad
    with pytest.raises(RequestError, match="one per request"):
        parse_completion({"prompt": ["a", "b"]}, 4096)


def test_what_completion_shares_with_infill_it_reads_the_same_way():
    from dataclasses import replace

    shared = {"n_predict": 9, "stop": ["\n\n"], "n_indent": 2, "t_max_predict_ms": 250, "temperature": 0.3,
              "samplers": ["top_k", "temperature"], "typical_p": 0.5, "seed": 3, "response_fields": ["content"]}
    completion, infill = parse_completion({"prompt": "x", **shared}, 4096), parse_infill(shared, 4096)
    assert completion[1:] == infill[1:] == (("content",), ["typical_p"])
    assert replace(completion[0], prompt=None) == replace(infill[0], infill=None)
    with pytest.raises(RequestError) as refused:
        parse_completion({"prompt": "x", "grammar": "root ::= [a-z]+"}, 4096)
    assert refused.value.param == "grammar"


def test_only_the_fields_asked_for_are_answered_under_their_paths():
    whole = {"content": "x", "timings": {"prompt_n": 3, "predicted_n": 2}, "stop": True}
    assert only(whole, ("content", "timings/prompt_n", "timings/nothing", "")) == {"content": "x",
                                                                                    "timings/prompt_n": 3}
    assert only(whole, ()) == whole


# -- served --------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fim_models():
    tok = tiny_tokenizer(FIM)
    target = HFBackend(tiny_model(len(tok), 0, eos_id=tok.eos_token_id), tok, device="cpu", name="tiny-fim")
    return ServedModels(target, None, Memory(8, 8), "tiny-fim"), tok


@pytest.fixture(scope="module")
def fim_served(fim_models):
    recorder = Recorder()
    with serving(fim_models[0], observer=recorder) as (url, _):
        yield url, recorder


@pytest.fixture(scope="module")
def fim_server(fim_served):
    return fim_served[0]


def ask(url: str, **body) -> dict:
    options = {"input_prefix": BEFORE, "input_suffix": AFTER, "prompt": TYPED, "input_extra": EXTRA,
               "n_predict": 16, "temperature": 0, "ignore_eos": True}
    r = httpx.post(f"{url}/infill", json={**options, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def expected(models: ServedModels, tok, max_new: int = 16) -> tuple[list[int], list[int]]:
    """The prompt llama-server would build for ``ask``'s request, and Baseline's greedy answer to it."""
    target = models.target
    ids = tok.convert_tokens_to_ids(list(FIM))
    tokens = FimTokens(*ids)
    prompt = repo_prompt(tokens, target.tokenize, BEFORE, AFTER, TYPED, [("shapes.py", EXTRA[0]["text"])],
                         budget(target.context_length, max_new))
    engine = SpeculativeEngine(target, None, Baseline(), SamplingParams(min_tokens=target.context_length))
    return prompt, list(engine.generate(prompt, max_new).tokens)


def test_a_served_completion_is_baselines_greedy_answer_to_llama_servers_prompt(fim_server, fim_models):
    models, tok = fim_models
    prompt, answer = expected(models, tok)
    first, again = ask(fim_server), ask(fim_server)     # the second drafts from the first, remembered
    for got in (first, again):
        assert got["tokens_evaluated"] == len(prompt) and got["tokens"] == answer
        assert got["content"] == models.target.detokenize(answer) and got["stop"] is True
        assert got["stop_type"] == "limit" and got["tokens_cached"] == len(prompt) + len(answer)
        assert got["generation_settings"]["ignored"] == [] and got["timings"]["predicted_n"] == 16
    assert again["timings"]["cache_n"] == len(prompt) - 2     # all the prefill may keep (reusable_prefix)
    assert again["timings"]["draft_n_accepted"] > 0


INFILL = {"input_prefix": BEFORE, "input_suffix": AFTER, "prompt": TYPED, "input_extra": EXTRA}


@pytest.mark.parametrize("path, body", [("/infill", INFILL), ("/completion", {"prompt": BEFORE})])
def test_a_streamed_completion_sends_the_same_text_then_the_answer_without_it(fim_server, path, body):
    options = {**body, "n_predict": 16, "temperature": 0, "ignore_eos": True}
    whole = httpx.post(f"{fim_server}{path}", json=options, timeout=60).json()
    with httpx.stream("POST", f"{fim_server}{path}", timeout=60, json={**options, "stream": True}) as r:
        chunks = [json.loads(line[len("data: "):]) for line in r.iter_lines() if line.startswith("data: ")]
    assert "".join(c["content"] for c in chunks) == whole["content"]
    assert [c["stop"] for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1]["content"] == "" and chunks[-1]["tokens_predicted"] == 16
    assert [c["tokens_predicted"] for c in chunks[:-1]] == sorted(c["tokens_predicted"] for c in chunks[:-1])


def test_the_fields_asked_for_are_all_an_editor_gets(fim_server):
    fields = ["content", "timings/prompt_n", "timings/predicted_per_second", "tokens_cached", "truncated"]
    got = ask(fim_server, response_fields=fields)
    assert set(got) == set(fields)


def test_a_request_for_no_tokens_reads_the_other_files_so_the_next_completion_starts_from_them(fim_server, fim_models):
    models, tok = fim_models
    other = [{"filename": "other.py", "text": "import math\n" * 5}]
    read = ask(fim_server, input_prefix="", input_suffix="", prompt="", input_extra=other, n_predict=0,
               response_fields=[""])
    assert read == {}
    got = ask(fim_server, input_extra=other, response_fields=["timings/cache_n", "tokens_evaluated"])
    shared = len(repo_prompt(FimTokens(*tok.convert_tokens_to_ids(list(FIM))), models.target.tokenize, "", "", "",
                             [("other.py", other[0]["text"])], budget(models.target.context_length, 0))) - 2
    assert got["timings/cache_n"] == shared      # the files and the fill-in-the-middle prefix token


def test_an_indented_completion_ends_at_the_first_line_indented_less(fim_server):
    full = ask(fim_server, n_predict=40)["content"]
    cut = ask(fim_server, n_predict=40, n_indent=4)
    text = cut["content"]
    assert full.startswith(text)
    lines = text.split("\n")
    assert all(len(line) - len(line.lstrip(" \t")) >= 4 for line in lines[1:-1])
    if text != full:                             # it ended at a line indented less, before that line's text
        assert cut["stop_type"] == "limit" and text.rsplit("\n", 1)[-1].strip(" \t") == ""
        rest = full[len(text):]
        assert len(text.rsplit("\n", 1)[-1]) < 4 and rest[0] not in " \t"


def test_refusals_say_why_and_the_server_goes_on(fim_server, server_without_fim):
    r = httpx.post(f"{server_without_fim}/infill", json={"input_prefix": "a", "input_suffix": "b"}, timeout=60)
    assert r.status_code == 501 and "fill-in-the-middle" in r.json()["error"]["message"]
    r = httpx.post(f"{fim_server}/infill", json={"input_extra": "not a list"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_extra"
    r = httpx.post(f"{fim_server}/infill", content=b"{", timeout=60)
    assert r.status_code == 400
    assert ask(fim_server, n_predict=2)["tokens_predicted"] == 2


def test_a_completion_is_baselines_greedy_answer_whether_its_prompt_is_text_token_ids_or_both(fim_server,
                                                                                                fim_models):
    models, tok = fim_models
    target = models.target
    text = f"{FIM[3]}{BEFORE}"                   # special-token text is that token, as in llama-server
    ids = target.tokenize_special(text)
    assert ids[0] == tok.convert_tokens_to_ids(FIM[3]) and len(ids) == 1 + len(BEFORE)
    engine = SpeculativeEngine(target, None, Baseline(), SamplingParams(min_tokens=target.context_length))
    answer = list(engine.generate(ids, 16).tokens)
    for prompt in (text, ids, [ids[0], BEFORE[:4], *ids[5:9], BEFORE[8:]], [FIM[3], *ids[1:]]):
        for path in ("/completion", "/completions"):
            got = httpx.post(f"{fim_server}{path}", timeout=60, json={
                "prompt": prompt, "n_predict": 16, "temperature": 0, "ignore_eos": True}).json()
            assert got["tokens_evaluated"] == len(ids) and got["tokens"] == answer, (prompt, path)
            assert got["content"] == target.detokenize(answer) and got["stop_type"] == "limit"


def test_a_completion_client_that_leaves_stops_its_generation(fim_served):
    url, recorder = fim_served
    recorder.settled()
    before = len(recorder.records)
    body = {"prompt": BEFORE, "n_predict": 3000, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{url}/completion", json=body, timeout=60) as r:
        assert next(r.iter_lines()).startswith("data: ")
    recorder.wait_until(lambda: len(recorder.records) > before)
    finished = recorder.records[before].finished
    assert finished.finish_reason == "cancelled" and finished.usage["completion_tokens"] < 3000


def test_completion_refusals_say_why_and_the_server_goes_on(fim_server, fim_models):
    vocab = fim_models[0].target.vocab_size
    for body, words in (({"prompt": [1, vocab]}, "vocabulary"), ({"prompt": ""}, "empty"),
                        ({"prompt": ["a", "b"]}, "one per request"), ({"prompt": "a", "json_schema": {"type": "x"}},
                                                                      "json_schema")):
        r = httpx.post(f"{fim_server}/completion", json={**body, "n_predict": 2}, timeout=60)
        assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
    assert httpx.post(f"{fim_server}/completion", json={"prompt": "a", "n_predict": 2, "ignore_eos": True},
                      timeout=60).json()["tokens_predicted"] == 2


@pytest.fixture(scope="module")
def server_without_fim():
    from core.tiny import tiny_pair

    target, _ = tiny_pair()
    with serving(ServedModels(target, None, Memory(8, 8), "tiny")) as (url, _):
        yield url


def test_the_bench_client_streams_infill_into_the_recording_every_face_draws(fim_server, fim_models):
    from core.endpoints.client import Endpoint, EndpointRun
    from core.endpoints.spec_stats import SPECLENS

    models, _ = fim_models
    whole = ask(fim_server)
    run = EndpointRun(Endpoint(fim_server), SPECLENS, count_tokens=lambda t: len(models.target.tokenize(t)))
    body = {"input_prefix": BEFORE, "input_suffix": AFTER, "prompt": TYPED, "input_extra": EXTRA}
    steps = list(run.stream_infill(body, 16, SamplingParams(temperature=0.0, min_tokens=16)))   # ignore_eos
    result = run.result
    assert result.result.text == "".join(s.text for s in steps) == whole["content"]
    assert result.result.stats.new_tokens == 16 and result.finish_reason == "length"
    assert result.timings["predicted_n"] == 16 and result.stats.source.startswith("timings")
