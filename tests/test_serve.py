"""`speclens serve` driven with the real `openai` client on loopback, on the tiny pair: streamed and whole answers
agree, a prediction never changes greedy output (and is drafted from), bad requests get OpenAI's error shapes and
the server goes on, a disconnect cancels, clients are served in order, the prompt cache gives a cold start's tokens,
/metrics parses. Also what llama.cpp's own server tests assert for speculation (tools/server/tests/unit/
test_speculative.py): identical output with and without drafting across draft sizes, a small context filled by the
prompt, several clients at once."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from core.backends.hf import HFBackend
from core.drafting import Baseline, Chain
from core.engine import SpeculativeEngine
from core.memory import Memory
from core.auto import Auto
from core.sampling import SamplingParams, logits_to_probs
from core.serve.cli import check_address, is_loopback
from core.serve.job import ServedModels, accepted_prediction_tokens, run_request
from core.serve.request import RequestError, parse
from core.serve.stops import StopText
from core.tiny import tiny_model, tiny_tokenizer
from tests.exact import enumerate_outcomes
from tests.served import Recorder, serving
from tests.table_backend import TableBackend, random_table

ASK = [{"role": "user", "content": "Write a line of text."}]


def client(url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from core.tiny import tiny_pair

    target, draft = tiny_pair()
    # memory drafts: a request's prediction is drafted from whenever the answer copies it
    return ServedModels(target, draft, Memory(8, 8), "tiny", remember_answers=False)


@pytest.fixture(scope="module")
def server(models):
    recorder = Recorder()
    with serving(models, observer=recorder) as (url, app):
        yield url, app, recorder


def chat(url: str, **kwargs):
    options = dict(model="tiny", messages=ASK, max_tokens=24, temperature=0)
    options.update(kwargs)
    return client(url).chat.completions.create(**options)


def streamed(url: str, **kwargs) -> tuple[str, list]:
    chunks = list(chat(url, stream=True, stream_options={"include_usage": True}, **kwargs))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


def test_streamed_and_whole_answers_are_the_same_greedy_text(server):
    url, _, _ = server
    whole = chat(url)
    text, chunks = streamed(url)
    assert text == whole.choices[0].message.content and text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    timings = chunks[-1].model_extra["timings"]       # llama-server's names, on the last chunk
    assert timings["predicted_n"] == whole.usage.completion_tokens and timings["draft_n"] >= timings["draft_n_accepted"]
    assert set(timings) >= {"prompt_n", "prompt_ms", "cache_n", "predicted_ms", "predicted_per_second",
                            "draft_n_verif_steps"}


def test_text_completions_and_the_model_list(server, models):
    url, _, _ = server
    c = client(url)
    assert [m.id for m in c.models.list().data] == ["tiny"]
    out = c.completions.create(model="tiny", prompt="Once upon", max_tokens=8, temperature=0)
    assert out.object == "text_completion" and out.usage.completion_tokens == len(out.choices) * 8
    assert isinstance(out.choices[0].text, str)
    ids = models.target.tokenize_special("Once upon")                 # the same prompt as token ids
    same = c.completions.create(model="tiny", prompt=ids, max_tokens=8, temperature=0)
    assert same.choices[0].text == out.choices[0].text and same.usage.prompt_tokens == out.usage.prompt_tokens


def test_a_suffix_is_filled_in_the_middle_with_the_models_own_tokens():
    """OpenAI's ``suffix``: the model writes what goes between the prompt and the suffix, from its own
    fill-in-the-middle prompt, exactly as Baseline decodes that prompt; the same prompt spelt out with the tokens'
    text as a raw prompt (as editors send it) is read as those tokens and answered the same."""
    fim = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
    tok = tiny_tokenizer(fim)
    target = HFBackend(tiny_model(len(tok), 0, eos_id=tok.eos_token_id), tok, device="cpu", name="tiny-fim")
    models = ServedModels(target, None, Memory(8, 8), "tiny-fim", remember_answers=False)
    before, after = "def area(w, h):\n    return ", "\n\nprint(area(2, 3))\n"
    pre, suf, mid = tok.convert_tokens_to_ids(list(fim))
    prompt = [pre, *target.tokenize(before), suf, *target.tokenize(after), mid]
    baseline = SpeculativeEngine(target, None, Baseline(), SamplingParams(min_tokens=20)).generate(prompt, 20)
    with serving(models) as (url, _):
        options = dict(model="tiny-fim", max_tokens=20, temperature=0, extra_body={"min_tokens": 20})
        filled = client(url).completions.create(prompt=before, suffix=after, **options)
        raw = client(url).completions.create(prompt="".join([fim[0], before, fim[1], after, fim[2]]), **options)
        at_start = client(url).completions.create(prompt="", suffix=after, **options)
    assert filled.usage.prompt_tokens == raw.usage.prompt_tokens == len(prompt)
    assert filled.choices[0].text == raw.choices[0].text == target.detokenize(baseline.tokens)
    assert at_start.usage.prompt_tokens == len(prompt) - len(before)
    assert parse({"messages": ASK, "suffix": "y"}, chat=True, context_length=100).suffix is None    # chat has none


def test_a_suffix_for_a_model_without_fill_in_the_middle_tokens_is_refused(server):
    url, _, _ = server
    for body, param in (({"prompt": "a", "suffix": "b"}, "suffix"), ({"prompt": "a", "suffix": 3}, "suffix"),
                        ({"prompt": "", "suffix": ""}, "prompt")):
        r = httpx.post(f"{url}/v1/completions", json={"model": "tiny", **body}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, body
    assert chat(url, max_tokens=2).usage.completion_tokens == 2


def test_a_prediction_never_changes_greedy_output_and_is_drafted_from(server):
    url, _, _ = server
    # an answer of known length, whatever the random model says: end-of-text is barred for all 60 tokens
    plain = chat(url, max_tokens=60, extra_body={"min_tokens": 60})
    answer = plain.choices[0].message.content
    partly_wrong = answer[:20] + "XYZ" + answer[23:45] + answer[50:]
    for prediction in (answer, partly_wrong, "def unrelated(): return 42\n" * 3):
        out = chat(url, max_tokens=60, extra_body={"min_tokens": 60},
                   prediction={"type": "content", "content": prediction})
        assert out.choices[0].message.content == answer, prediction[:30]
        details = out.usage.completion_tokens_details
        assert details.accepted_prediction_tokens + details.rejected_prediction_tokens > 0
    right = chat(url, max_tokens=60, extra_body={"min_tokens": 60}, prediction={"type": "content", "content": answer})
    assert right.usage.completion_tokens_details.accepted_prediction_tokens > 0
    assert right.model_extra["timings"]["draft_n_accepted"] > 0
    # drafting from the answer it will give: far fewer target calls than tokens
    assert right.model_extra["timings"]["draft_n_verif_steps"] < 60 / 2


def test_accepted_prediction_tokens_are_those_of_the_prediction_found_in_the_completion():
    assert accepted_prediction_tokens([1, 2, 3, 4], [1, 2, 3, 4]) == 4
    assert accepted_prediction_tokens([1, 2, 9, 4], [1, 2, 3, 4]) == 3
    assert accepted_prediction_tokens([7, 8], [1, 2, 3]) == 0
    assert accepted_prediction_tokens([], [1]) == 0


def test_a_prediction_keeps_the_targets_distribution_exactly():
    # the first two tokens' joint through the server's own job, with a prediction drafted from: every random path
    vocab = 3
    target = TableBackend(random_table(vocab, seed=1), vocab, "target")
    prompt = "0 1"
    req = parse({"prompt": prompt, "max_tokens": 3, "temperature": 1.0, "prediction": {"type": "content",
                 "content": "0 1 2 1 0 2"}}, chat=False, context_length=64)

    drafted = []

    def run(rng):
        served = ServedModels(target, None, Memory(4, 4, min_match=1), "t", remember_answers=False,
                              rng_factory=lambda seed: rng)
        out = []
        run_request(served, req, lambda item: out.append(item), threading.Event())
        drafted.append(len(out[-1].result.steps[0].nodes))   # the text so far has no earlier match to copy
        return tuple(out[-1].result.tokens[:2])

    got = torch.zeros((vocab, vocab), dtype=torch.float64)
    for (a, b), w in enumerate_outcomes(run).items():
        got[a, b] += w
    params = SamplingParams(temperature=1.0)
    first = logits_to_probs(target.logits_for([0, 1]), params)
    expected = torch.stack([first[a] * logits_to_probs(target.logits_for([0, 1, a]), params) for a in range(vocab)])
    assert float((got - expected).abs().max()) < 1e-9
    assert min(drafted) > 0          # the first step drafts from the prediction on every path


@pytest.mark.parametrize("body, status, code, param", [
    ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, None, "n"),
    ({"messages": "hi"}, 400, None, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, None, "messages[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, None,
     "messages[0].content"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}, 400, None, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**9}, 400, None, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, 400, None, "temperature"),
    ({"messages": [{"role": "user", "content": "hi"}], "model": "gpt-9"}, 404, "model_not_found", "model"),
    ({"messages": [{"role": "user", "content": "x " * 5000}]}, 400, "context_length_exceeded", "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4095}, 400, "context_length_exceeded",
     "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "prediction": {"type": "file"}}, 400, None, "prediction"),
    ({"messages": [{"role": "user", "content": "hi"}], "stop": [1, 2]}, 400, None, "stop"),
    ({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}}, 400, None,
     "response_format"),
    ({"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"5": -100}}, 400, None, "logit_bias"),
])
def test_bad_requests_get_openai_errors_and_the_server_goes_on(server, body, status, code, param):
    url, _, _ = server
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": "tiny", **body}, timeout=60)
    error = r.json()["error"]
    assert r.status_code == status and set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["param"] == param and "Traceback" not in error["message"]
    if code == "context_length_exceeded" and param == "messages":        # a prompt over the context: say what to do
        assert "speclens serve -c N" in error["message"]
    assert chat(url, max_tokens=4).usage.completion_tokens == 4          # the next request is served


def test_bad_bodies_and_unknown_routes(server):
    url, _, _ = server
    for data, status in ((b"{not json", 400), (b"[1, 2]", 400), (b"x" * (17 * 2**20), 413)):
        r = httpx.post(f"{url}/v1/chat/completions", content=data, headers={"content-type": "application/json"},
                       timeout=60)
        assert r.status_code == status and "error" in r.json()
    r = httpx.get(f"{url}/v1/nothing-here", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    assert chat(url, max_tokens=2).usage.completion_tokens == 2


def test_an_api_key_is_required_when_set(models):
    with serving(models, api_key="sesame") as (url, _):
        with pytest.raises(openai.AuthenticationError) as info:
            client(url, "wrong").models.list()
        assert info.value.status_code == 401 and info.value.body["code"] == "invalid_api_key"
        assert client(url, "sesame").models.list().data[0].id == "tiny"
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200     # health needs no key


@pytest.mark.parametrize("path, body", [("/v1/chat/completions", {"messages": ASK, "max_tokens": 3000}),
                                        ("/v1/messages", {"messages": ASK, "max_tokens": 3000}),
                                        ("/v1/responses", {"input": ASK, "max_output_tokens": 3000})])
def test_a_disconnected_client_cancels_its_generation(server, path, body):
    url, _, recorder = server
    recorder.settled()
    before = len(recorder.records)
    body = {"model": "tiny", **body, "min_tokens": 3000, "temperature": 0, "stream": True}
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{url}{path}", json=body) as response:
            assert response.status_code == 200 and next(response.iter_lines())
    # the server notices, cancels, and finishes the request well short of its 3000 tokens
    recorder.wait_until(lambda: len(recorder.records) > before)
    record = recorder.records[before]
    assert record.finished.finish_reason == "cancelled" and record.finished.usage["completion_tokens"] < 3000
    assert chat(url, max_tokens=3).usage.completion_tokens == 3


def test_a_chat_for_no_tokens_only_reads_its_prompt_as_llama_vim_warms_up(server):
    """llama.vim's instruction mode sends its chat with ``n_predict: 0`` while the user types the instruction: the
    prompt is read into the cache and nothing is decoded, so the real request that follows starts from it."""
    url, _, recorder = server
    recorder.settled()
    before = recorder.steps
    messages = [{"role": "system", "content": "Edit the selection. " * 8}, *ASK]
    warm = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
        "messages": messages, "samplers": [], "n_predict": 0, "stream": False, "cache_prompt": True,
        "response_fields": [""]})
    assert warm.status_code == 200, warm.text
    body = warm.json()
    assert body["choices"][0]["message"]["content"] == "" and body["usage"]["completion_tokens"] == 0
    recorder.settled()
    assert recorder.steps == before                                  # nothing decoded
    answer = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
        "messages": messages, "max_tokens": 4, "temperature": 0}).json()
    assert answer["timings"]["cache_n"] == body["usage"]["prompt_tokens"] - 2     # all a prefill may keep


def test_concurrent_clients_are_served_one_after_another_in_order(server):
    url, _, recorder = server
    recorder.settled()      # the test before may still be hearing of its last end
    start = len(recorder.log)
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda i: chat(url, max_tokens=10 + i), range(4)))
    assert [o.usage.completion_tokens for o in outs] == [10, 11, 12, 13]
    recorder.wait_until(lambda: len(recorder.log) >= start + 8)   # each end is heard just after its client got it
    kinds = [kind for kind, _ in recorder.log[start:]]
    assert kinds == ["started", "finished"] * 4          # never two decoding at once


def test_a_full_queue_answers_503_with_retry_after(models):
    hold = threading.Event()

    class Holding(Recorder):
        def started(self, *args):
            hold.wait(30)

    with serving(models, max_queue=0, observer=Holding()) as (url, app):
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(chat, url, max_tokens=2)
            for _ in range(300):
                if app.state.queue.running:
                    break
                hold.wait(0.05)
            r = httpx.post(f"{url}/v1/chat/completions", json={"model": "tiny", "messages": ASK}, timeout=30)
            hold.set()
            assert first.result().usage.completion_tokens == 2
        assert r.status_code == 503 and r.headers["retry-after"] and r.json()["error"]["code"] == "server_busy"


def test_the_prompt_cache_reuses_a_shared_prefix_and_gives_a_cold_starts_tokens(server, models):
    url, _, _ = server
    history = ASK + [{"role": "assistant", "content": "A line."}, {"role": "user", "content": "Another, please."}]
    models.target.reset()
    cold = chat(url, messages=history, max_tokens=20)
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    chat(url, messages=history[:1], max_tokens=5)           # leaves the shared beginning in the cache
    warm = chat(url, messages=history, max_tokens=20)
    assert warm.usage.prompt_tokens_details.cached_tokens > 0 and warm.model_extra["timings"]["cache_n"] > 0
    assert warm.choices[0].message.content == cold.choices[0].message.content


def test_stop_sequences_end_the_answer_before_them(server):
    url, _, _ = server
    full = chat(url, max_tokens=40, extra_body={"min_tokens": 40}).choices[0].message.content
    stop = full[10:13]
    cut = chat(url, max_tokens=40, extra_body={"min_tokens": 40}, stop=[stop])
    assert cut.choices[0].message.content == full[:full.index(stop)] and cut.choices[0].finish_reason == "stop"
    text, _ = streamed(url, max_tokens=40, extra_body={"min_tokens": 40}, stop=[stop])
    assert text == full[:full.index(stop)]


def test_stop_text_holds_back_what_may_become_a_stop_sequence():
    s = StopText(["END"])
    assert s.push("abcE") == "abc" and s.push("N") == "" and s.push("x") == "ENx"
    assert s.push("yyEND tail") == "yy" and s.stopped and s.text == "abcENxyy" and s.push("more") == ""
    t = StopText(["\n\n", "###"])
    assert t.push("a\n") == "a" and t.push("b#") == "\nb" and t.flush() == "#"


def test_metrics_parse_and_count_speculation(server):
    url, _, _ = server
    answer = chat(url, max_tokens=30, extra_body={"min_tokens": 30}).choices[0].message.content
    chat(url, max_tokens=30, extra_body={"min_tokens": 30}, prediction={"type": "content", "content": answer})
    text = httpx.get(f"{url}/metrics", timeout=10).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("speclens:spec_decode_num_drafts", "speclens:spec_decode_num_draft_tokens",
                 "speclens:spec_decode_num_accepted_tokens", "speclens:spec_decode_num_accepted_tokens_per_pos",
                 "speclens:request_success", "speclens:time_to_first_token_seconds"):
        assert name in families, name
    drafts = sum(s.value for s in families["speclens:spec_decode_num_draft_tokens"].samples
                 if s.name.endswith("_total"))
    per_pos = [s for s in families["speclens:spec_decode_num_accepted_tokens_per_pos"].samples
               if s.name.endswith("_total")]
    assert drafts > 0 and per_pos and {s.labels["position"] for s in per_pos} >= {"0"}


@pytest.mark.parametrize("strategy", [Chain(1), Chain(2), Chain(4), Chain(8), Auto(use_memory=False)],
                         ids=lambda s: s.label)
def test_output_is_the_same_with_and_without_drafting_across_draft_sizes(strategy):
    # llama.cpp: test_different_draft_min_draft_max
    from core.tiny import tiny_pair

    target, draft = tiny_pair()
    answers = []
    for s in (Baseline(), strategy):
        with serving(ServedModels(target, draft, s, "tiny", remember_answers=False)) as (url, _):
            answers.append(chat(url, max_tokens=32, extra_body={"min_tokens": 32}).choices[0].message.content)
    assert answers[0] == answers[1]


def test_a_small_context_filled_by_the_prompt():
    # llama.cpp: test_slot_ctx_not_exceeded / test_with_ctx_shift
    tok = tiny_tokenizer()
    model = tiny_model(len(tok), 0, eos_id=tok.eos_token_id, context=96)
    small = ServedModels(HFBackend(model, tok, name="small"), HFBackend(model, tok, name="small-d"), Chain(4), "small",
                         remember_answers=False)
    with serving(small) as (url, _):
        prompt_tokens = len(small.target.apply_chat_template([{"role": "user", "content": "x" * 60}]))
        out = client(url).chat.completions.create(model="small", messages=[{"role": "user", "content": "x" * 60}],
                                                  temperature=0, extra_body={"min_tokens": 96})
        # no max_tokens: it decodes until the context is full, and says so
        assert out.usage.completion_tokens == 96 - prompt_tokens and out.choices[0].finish_reason == "length"
        with pytest.raises(openai.BadRequestError) as info:
            client(url).chat.completions.create(model="small", messages=[{"role": "user", "content": "x" * 200}])
        assert info.value.body["code"] == "context_length_exceeded"


def test_several_clients_at_once_each_get_their_own_answer(server):
    # llama.cpp: test_multi_requests_parallel
    url, _, _ = server
    questions = [[{"role": "user", "content": f"Question number {i}"}] for i in range(5)]
    alone = [chat(url, messages=q, max_tokens=12).choices[0].message.content for q in questions]
    with ThreadPoolExecutor(5) as pool:
        together = list(pool.map(lambda q: chat(url, messages=q, max_tokens=12).choices[0].message.content,
                                  questions))
    assert together == alone


def test_requests_are_read_as_openai_defines_them():
    req = parse({"model": "m", "messages": [{"role": "developer", "content": [{"type": "text", "text": "a"},
                                                                                 {"type": "text", "text": "b"}]}],
                 "max_completion_tokens": 7, "top_p": 0.5, "seed": 3, "stop": "\n",
                 "prediction": {"type": "content", "content": [{"type": "text", "text": "pred"}]}},
                chat=True, context_length=100)
    assert req.messages == ({"role": "system", "content": "ab"},) and req.max_tokens == 7
    assert req.sampling.top_p == 0.5 and req.sampling.seed == 3 and req.sampling.temperature == 1.0
    assert (req.sampling.top_k, req.sampling.min_p) == (0, 0.0)
    extra = parse({"prompt": "x", "top_k": 20, "min_p": 0.1}, False, 100).sampling       # vLLM's extra fields
    assert (extra.top_k, extra.min_p) == (20, 0.1) and parse({"prompt": "x", "top_k": -1}, False, 100).sampling.top_k == 0
    assert req.stop == ("\n",) and req.prediction == "pred"
    assert parse({"prompt": "x", "ignore_eos": True, "max_tokens": 9}, False, 100).sampling.min_tokens == 9
    infill = parse({"prompt": "def f(", "suffix": "):"}, False, 100)
    assert infill.suffix == "):" and infill.text == "def f(\u2038):"          # as the window shows it
    assert parse({"prompt": "x"}, False, 100).text == "x"
    assert parse({"prompt": "x", "response_format": {"type": "text"}, "logit_bias": {}}, False, 100).prompt == "x"
    chat_of = {"messages": [{"role": "user", "content": "hi"}]}
    assert parse({**chat_of, "n_predict": 5}, True, 100).max_tokens == 5                  # llama-server's name
    assert parse({**chat_of, "n_predict": 5, "max_tokens": 7}, True, 100).max_tokens == 7
    assert parse({**chat_of, "n_predict": -1}, True, 100).max_tokens is None
    assert parse({**chat_of, "n_predict": 0}, True, 100).max_tokens == 0                  # only read the prompt
    ids = parse({"prompt": [[5, 6]]}, False, 100)                   # token ids, OpenAI's other form of a prompt
    assert ids.pieces == (5, 6) and ids.prompt is None
    for bad in ({"prompt": [5, 6], "suffix": "x"}, {"prompt": ["a", "b"]}, {"prompt": None}):
        with pytest.raises(RequestError) as info:
            parse(bad, False, 100)
        assert info.value.param in ("prompt", "suffix")
    with pytest.raises(RequestError) as info:
        parse({"prompt": ""}, False, 100)
    assert info.value.param == "prompt"


def test_listening_beyond_loopback_needs_an_api_key():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0")
    with pytest.raises(ValueError, match="--api-key"):
        check_address("0.0.0.0", 8000, None)


def test_the_serve_command_refuses_what_it_cannot_do(capsys):
    from core.serve.cli import main

    assert main(["--host", "0.0.0.0", "--pair", "tiny"]) == 2
    assert "--api-key" in capsys.readouterr().err
    assert main(["--pair", "tiny", "--strategy", "warp"]) == 2
    assert "unknown mode" in capsys.readouterr().err
    assert main(["--pair", "tiny", "--port", "70000"]) == 2
    assert "1..65535" in capsys.readouterr().err
