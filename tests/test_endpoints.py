"""Other engines behind an OpenAI-compatible URL: found and named, streamed through the real ``openai`` client into
the recordings every face draws, their speculative statistics read, raced and benched; a dead endpoint, a wrong key,
a stream that breaks off and a URL that is not an OpenAI API each give a clear message. Against two real servers on
loopback: SpecLens's own (tiny pair) and llama.cpp's llama-server (marked; a tiny GGUF written here)."""
from __future__ import annotations

import http.server
import json
import socket
import threading
from contextlib import contextmanager

import pytest

import core.bench as bench
from core.endpoints.client import Endpoint, EndpointError, EndpointRun, probe
from core.endpoints.llama_server import LlamaServer, LlamaServerError, find_binary, free_port
from core.endpoints.spec_stats import LLAMA_CPP, SPECLENS
from core.memory import Memory
from core.sampling import SamplingParams
from core.serve.job import ServedModels
from tests.served import serving

ASK = [{"role": "user", "content": "Write a line."}]
GREEDY = SamplingParams(temperature=0.0, min_tokens=24)


@pytest.fixture(scope="module")
def pair():
    from core.tiny import tiny_pair

    return tiny_pair()


@pytest.fixture(scope="module")
def speclens(pair):
    with serving(ServedModels(*pair, Memory(8, 8), "tiny", remember_answers=False)) as (url, _):
        yield url


def record(endpoint: Endpoint, engine: str, **kwargs) -> EndpointRun:
    run = EndpointRun(endpoint, engine, **kwargs)
    steps = list(run.stream(ASK, 24, GREEDY))
    assert [s.step for s in steps] == list(range(len(steps)))
    return run


def test_speclens_is_found_streamed_and_its_statistics_read(speclens, pair):
    found = probe(Endpoint(speclens))
    assert found.models == ["tiny"] and found.engine == SPECLENS
    target = pair[0]
    run = record(Endpoint(speclens, model="tiny"), found.engine, count_tokens=lambda t: len(target.tokenize(t)),
                 tokenize=target.tokenize)
    result = run.result
    assert result.result.stats.new_tokens == 24 and result.usage["completion_tokens"] == 24
    assert result.stats.source.startswith("timings") and result.stats.verify_steps is not None
    assert result.result.text == "".join(s.text for s in result.result.steps)
    assert result.result.stats.time_to_first_token <= result.result.stats.seconds
    # the same weights decoded here: the endpoint's greedy answer is the local one
    from core.drafting import Baseline
    from core.engine import SpeculativeEngine

    local = SpeculativeEngine(target, None, Baseline(), GREEDY).generate(target.apply_chat_template(ASK), 24)
    assert result.result.text == local.text


def test_a_dead_endpoint_a_wrong_key_and_a_wrong_url_say_so(pair):
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EndpointError, match="cannot reach"):
        probe(Endpoint(dead))
    with pytest.raises(EndpointError, match="cannot reach"):
        list(EndpointRun(Endpoint(dead, model="m"), "unknown").stream(ASK, 4, GREEDY))
    with serving(ServedModels(*pair, Memory(8, 8), "tiny"), api_key="right") as (url, _):
        with pytest.raises(EndpointError, match="refused the API key"):
            probe(Endpoint(url, "wrong"))
        with pytest.raises(EndpointError, match="refused the API key"):
            list(EndpointRun(Endpoint(url, "wrong", "tiny"), SPECLENS).stream(ASK, 4, GREEDY))
    with plain_http("<html>a web page</html>") as url:
        with pytest.raises(EndpointError, match="does not answer like an OpenAI-compatible API"):
            probe(Endpoint(url))


def test_a_stream_that_breaks_off_keeps_its_text_and_says_so():
    with broken_stream() as url:
        run = EndpointRun(Endpoint(url, model="m"), "unknown")
        got = []
        with pytest.raises(EndpointError, match="ended without saying why|broke off"):
            for step in run.stream(ASK, 10, GREEDY):
                got.append(step.text)
        assert "".join(got) == "half an an"        # what came before the break is kept


def test_the_bench_runs_an_endpoint_beside_speclens(speclens, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "Say something."}) + "\n")
    out = tmp_path / "r.json"
    assert bench.main(["--pair", "tiny", "--modes", f"baseline,endpoint:{speclens}/v1#tiny", "--prompts",
                       str(prompts), "--max-new-tokens", "8", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    row = next(r for r in report["runs"] if r["mode"].startswith("endpoint:"))
    assert row["new_tokens"] == 8 and row["decode_tokens_per_s"] > 0
    assert row["greedy_vs_baseline"].startswith("identical")          # the same tiny weights on both sides
    assert bench.main(["--pair", "tiny", "--modes", f"endpoint:{speclens}#nope", "--prompts", str(prompts)]) == 2


@pytest.mark.llama_server
def test_llama_server_is_found_streamed_and_its_drafts_read(tmp_path):
    from tiny_gguf import write_tiny_gguf

    try:
        find_binary()
    except LlamaServerError as exc:
        pytest.skip(str(exc))
    target = write_tiny_gguf(tmp_path / "t.gguf", seed=0, context=512)
    draft = write_tiny_gguf(tmp_path / "d.gguf", seed=0, noise=0.02, context=512)
    with LlamaServer(target, config="draft", draft=draft, threads=1, context=512) as server:
        found = probe(Endpoint(server.url))
        assert found.engine == LLAMA_CPP
        run = record(Endpoint(server.url, model=found.models[0]), found.engine)
        assert run.result.stats.drafted > 0 and run.result.stats.source.startswith("timings")
        assert run.result.usage["completion_tokens"] == 24


@contextmanager
def plain_http(body: str):
    """A web server that is not an OpenAI API: every GET answers an HTML page."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


@contextmanager
def broken_stream():
    """A server that starts an SSE answer, sends two chunks and hangs up without finishing."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def chunk(text: str) -> bytes:
        payload = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
                   "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
        data = f"data: {json.dumps(payload)}\n\n".encode()
        return f"{len(data):x}\r\n".encode() + data + b"\r\n"

    def serve():
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            conn.sendall(chunk("half an") + chunk(" an"))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


def test_greedy_runs_are_compared_by_text_when_one_came_from_an_endpoint(pair):
    from dataclasses import replace

    from core.divergence import compare_greedy
    from core.drafting import Baseline
    from core.engine import SpeculativeEngine

    target = pair[0]
    local = SpeculativeEngine(target, None, Baseline(), GREEDY).generate(target.apply_chat_template(ASK), 24)
    as_text = replace(local, tokens=(), steps=tuple(replace(s, tokens=(), margins=()) for s in local.steps))
    same = compare_greedy(as_text, local)
    assert same.identical and same.compared == len(local.text)
    cut = 10
    changed = replace(as_text, text=local.text[:cut] + "\u00a7" + local.text[cut + 1:])
    parted = compare_greedy(changed, local)
    token = next(k for k, (start, end) in enumerate(s for step in local.steps for s in step.spans) if end > cut)
    margins = [m for step in local.steps for m in step.margins]
    assert not parted.identical and parted.index == token and parted.margin == margins[token]
    assert parted.texts[0].startswith("\u00a7") and "diverged at token" in parted.describe()


def test_an_endpoint_is_labelled_by_its_model_file_not_its_folders():
    assert Endpoint("http://127.0.0.1:8080", model="/home/u/models/q.gguf").label == "q.gguf @ 127.0.0.1:8080"
    assert Endpoint("http://127.0.0.1:8080/v1", model="Qwen/Qwen2.5-Coder-1.5B").label == \
        "Qwen/Qwen2.5-Coder-1.5B @ 127.0.0.1:8080"
