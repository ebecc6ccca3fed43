"""llama-server's tokenizer and description endpoints (/tokenize, /detokenize, /apply-template, /props) on both
backends: what a client counts is what the server reads, text and ids round-trip, each token's piece is its own
bytes (the same on both backends for the same vocabulary), refusals are clear, and they answer while an answer
decodes. tests/test_llama_server.py asks the real llama-server the same and compares."""
from __future__ import annotations

import threading

import httpx
import pytest

from core.memory import Memory
from core.serve.job import ServedModels
from core.serve.vocab import piece, text_of, token_ids
from tests.served import serving
from tests.table_backend import TableBackend, random_table

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "the theory of it?"}]


def hf_target(template: str | None = None):
    from core.backends.hf import HFBackend
    from core.tiny import tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    if template:
        tok.chat_template = template
    return HFBackend(tiny_model(len(tok), 0), tok, device="cpu", name="tiny", context_length=512)


def gguf_target(tmp_path, add_bos: bool = False):
    pytest.importorskip("llama_cpp")
    from core.backends.llamacpp import LlamaCppBackend
    from tests.tiny_gguf import write_tiny_gguf

    return LlamaCppBackend(write_tiny_gguf(tmp_path / "t.gguf", context=512, add_bos=add_bos), n_ctx=512,
                           n_threads=1)


def post(url: str, path: str, body) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=60)


@pytest.mark.parametrize("backend", ["hf", "llama.cpp", "llama.cpp+bos"])
def test_text_and_token_ids_round_trip_as_the_server_reads_them(backend, tmp_path):
    target = hf_target() if backend == "hf" else gguf_target(tmp_path, add_bos=backend.endswith("bos"))
    text = "the theory <|im_end|> of\tit" + ("" if backend == "hf" else " é日本")   # the tiny HF vocabulary is ASCII
    start = target.tokenize_special("")
    assert start == ([] if backend != "llama.cpp+bos" else start[:1]) and len(start) == (backend == "llama.cpp+bos")
    with serving(ServedModels(target, None, Memory(8, 8), "tiny")) as (url, _):
        ids = post(url, "/tokenize", {"content": text}).json()["tokens"]
        assert ids == target.tokenize_special(text)[len(start):]        # what a text completion reads, less BOS
        assert post(url, "/tokenize", {"content": text, "add_special": True}).json()["tokens"] == start + ids
        plain = post(url, "/tokenize", {"content": text, "parse_special": False}).json()["tokens"]
        assert plain == target.tokenize(text) and len(plain) > len(ids)      # <|im_end|> spelled out in text
        assert post(url, "/detokenize", {"tokens": ids}).json() == {"content": text}
        assert post(url, "/detokenize", {"tokens": plain}).json() == {"content": text}
        pieces = post(url, "/tokenize", {"content": text, "with_pieces": True}).json()["tokens"]
        assert [p["id"] for p in pieces] == ids
        raw = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces)
        assert raw.decode() == text
        # a character split over byte tokens: each piece is its own bytes, as numbers
        assert any(isinstance(p["piece"], list) for p in pieces) == (backend != "hf")
        mixed = post(url, "/tokenize", {"content": [ids[0], "the", ids[1]], "add_special": True}).json()["tokens"]
        assert mixed == [ids[0], *target.tokenize("the"), ids[1]]          # no BOS after an id that opens it
        assert post(url, "/tokenize", {}).json() == {"tokens": []}


@pytest.mark.parametrize("backend", ["hf", "llama.cpp"])
def test_the_template_text_is_the_chat_prompt_served(backend, tmp_path):
    """/apply-template's text, read back as a raw prompt, is the very token ids a chat completion decodes from."""
    target = hf_target() if backend == "hf" else gguf_target(tmp_path)
    models = ServedModels(target, None, Memory(8, 8), "tiny")
    with serving(models) as (url, _):
        prompt = post(url, "/apply-template", {"messages": CHAT}).json()["prompt"]
        props = httpx.get(f"{url}/props", timeout=60).json()
        meta = httpx.get(f"{url}/v1/models", timeout=60).json()["data"][0]["meta"]
        refused = post(url, "/apply-template", {"messages": []})
    assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>") and prompt.endswith("assistant\n")
    assert token_ids(target, [prompt], add_special=False) == models.chat_prompt(CHAT)
    assert props["default_generation_settings"]["n_ctx"] == meta["n_ctx"] == target.context_length == 512
    assert props["chat_template"] == target.chat_template and props["total_slots"] == 1
    assert props["chat_template_caps"]["supports_tools"] is False      # the tiny template has no place for tools
    assert props["default_generation_settings"]["params"]["temperature"] == 0.8
    assert props["build_info"].startswith("speclens") and meta["n_vocab"] == target.vocab_size
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "messages"


def test_a_model_without_a_chat_template_refuses_chats_and_still_completes_text():
    target = hf_target()
    target.tokenizer.chat_template = None
    with serving(ServedModels(target, None, Memory(8, 8), "tiny")) as (url, _):
        chat = post(url, "/v1/chat/completions", {"model": "tiny", "messages": CHAT, "max_tokens": 2})
        template = post(url, "/apply-template", {"messages": CHAT})
        text = post(url, "/v1/completions", {"model": "tiny", "prompt": "the", "max_tokens": 2, "temperature": 0})
        props = httpx.get(f"{url}/props", timeout=60).json()
    for refused in (chat, template):
        assert refused.status_code == 501 and "no chat template" in refused.json()["error"]["message"]
    assert text.status_code == 200 and text.json()["usage"]["completion_tokens"] == 2
    assert props["chat_template"] == "" and props["chat_template_caps"]["supports_tools"] is False


def test_a_template_with_tools_is_reported_as_taking_them():
    from tests.test_serve_tools import TOOLS_TEMPLATE

    with serving(ServedModels(hf_target(TOOLS_TEMPLATE), None, Memory(8, 8), "tiny")) as (url, _):
        caps = httpx.get(f"{url}/props", timeout=60).json()["chat_template_caps"]
    assert caps == {"supports_tools": True, "supports_tool_calls": True}


def test_each_token_piece_is_the_same_bytes_on_both_backends(tmp_path):
    """A transformers byte-level tokenizer over the tiny GGUF's own vocabulary: every token's piece is the bytes
    llama.cpp gives it, parts of characters included."""
    from tokenizers import Tokenizer, decoders, models as bpe, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from core.backends.hf import HFBackend
    from core.tiny import tiny_model
    from tests.tiny_gguf import tiny_vocab

    llama = gguf_target(tmp_path)
    tokens, _, merges = tiny_vocab()
    words = [t for t in tokens if not t.startswith("<|")]
    core = Tokenizer(bpe.BPE(vocab={t: i for i, t in enumerate(words)}, merges=[tuple(m.split()) for m in merges]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    hf = HFBackend(tiny_model(len(words), 0), PreTrainedTokenizerFast(tokenizer_object=core), device="cpu")
    pieces = {t: piece(hf, t) for t in range(len(words))}
    assert pieces == {t: piece(llama, t) for t in range(len(words))}
    assert sum(isinstance(p, list) for p in pieces.values()) == 128     # the bytes that are not ASCII
    assert text_of(hf, hf.tokenize("the theory é")) == "the theory é"


def test_bad_requests_are_refused_with_what_is_wrong():
    target = TableBackend(random_table(50, seed=1), 50, "table")
    with serving(ServedModels(target, None, Memory(8, 8), "table")) as (url, _):
        for path, body, param in (("/tokenize", {"content": 5}, "content"),
                                  ("/tokenize", {"content": [1, 2.5]}, "content"),
                                  ("/tokenize", {"content": [1, 99]}, "content"),
                                  ("/tokenize", {"content": "1", "with_pieces": "yes"}, "with_pieces"),
                                  ("/tokenize", {"content": "1", "add_special": 1}, "add_special"),
                                  ("/detokenize", {"tokens": "1 2"}, "tokens"),
                                  ("/detokenize", {"tokens": [1, True]}, "tokens"),
                                  ("/detokenize", {"tokens": [50]}, "tokens"),
                                  ("/tokenize", [1], None)):
            r = post(url, path, body)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, (path, body, r.text)
        assert "out of the vocabulary" in post(url, "/detokenize", {"tokens": [50]}).json()["error"]["message"]
        assert post(url, "/detokenize", {"tokens": [1, 2]}).json() == {"content": "<1><2>"}     # still serving


class Gated(TableBackend):
    """A model whose prompt reading waits for the test: a request stays on the engine while others are asked."""

    def __init__(self) -> None:
        super().__init__(random_table(50, seed=2), 50, "gated")
        self.reading, self.go = threading.Event(), threading.Event()

    def prefill(self, ids, cancel=None, progress=None):
        self.reading.set()
        assert self.go.wait(60)
        return super().prefill(ids, cancel, progress)


def test_tokenizing_answers_while_an_answer_decodes():
    target = Gated()
    with serving(ServedModels(target, None, Memory(8, 8), "gated")) as (url, app):
        answer = {}
        asking = threading.Thread(target=lambda: answer.update(r=post(url, "/v1/completions", {
            "model": "gated", "prompt": "1 2 3", "max_tokens": 3, "temperature": 0})))
        asking.start()
        try:
            assert target.reading.wait(60)
            assert app.state.queue.running == 1
            assert post(url, "/tokenize", {"content": "4 5"}).json() == {"tokens": [4, 5]}
            assert post(url, "/detokenize", {"tokens": [4, 5]}).json() == {"content": "<4><5>"}
            assert httpx.get(f"{url}/props", timeout=60).json()["total_slots"] == 1
            assert app.state.queue.running == 1                    # the answer was still decoding meanwhile
        finally:
            target.go.set()
            asking.join(60)
    assert answer["r"].status_code == 200 and answer["r"].json()["usage"]["completion_tokens"] == 3
