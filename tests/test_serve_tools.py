"""Tool calls on `speclens serve`'s chat endpoint: the tools a request offers and the history of calls it sends back,
read as OpenAI defines them; the model's calls found in its answer in the Hermes and Qwen forms llama-server reads
(tagged, in a json fence, or the whole answer), and nothing else taken for one; a streamed answer's text sent as it
comes, never a character that later turns out to be part of a call; templates that cannot offer tools refused. The
served answers come from a scripted model, so what is asserted does not depend on what a random model says."""
from __future__ import annotations

import json

import httpx
import openai
import pytest
import torch

from core.memory import Memory
from core.serve.job import ServedModels
from core.serve.request import RequestError, parse
from core.serve.tools import history_calls, offered, scan, sendable, split_calls
from core.serve.vocab import text_of
from tests.served import Recorder, serving
from tests.table_backend import TableBackend

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather now in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
NAMES = frozenset({"get_weather"})
TAGGED = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
FENCED = '```json\n{\n  "name": "get_weather",\n  "arguments": {"city": "Oslo"}\n}\n```'
BARE = '  {"name": "get_weather", "parameters": {"city": "Rome"}}\n'
RAW = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris\n\tTexas"}}</tool_call>'   # raw line break
TWO = ('<tool_call>{"name": "get_weather", "arguments": {"city": "A"}}</tool_call>\n'
       '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"B\\"}"}</tool_call>')
NOT_CALLS = ['Code:\n```python\nprint("<tool_call>")\n```\nDone.',                   # a tag inside a code block
             'Data: ```json\n{"name": "Bob", "arguments": {}}\n``` is a person.',     # a name not offered
             '<tool_call>{"name": "get_weather", "arguments": </tool_call> broken',    # not JSON
             '{"name": "get_weather"} and then some text',                             # not only a call
             'Plain text with a ` and `` and a < sign']


# -- the request ---------------------------------------------------------------------------------------------------
def test_the_tools_offered_are_checked_and_a_forced_call_is_refused():
    assert offered({"tools": [WEATHER]}) == (WEATHER,)
    assert offered({"tools": [WEATHER], "tool_choice": "none"}) == () and offered({}) == () == offered({"tools": []})
    for body, param in (({"tools": [WEATHER], "tool_choice": "required"}, "tool_choice"),
                        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
                         "tool_choice"),
                        ({"tools": WEATHER}, "tools"), ({"tools": [{"type": "function"}]}, "tools[0]"),
                        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools[0]")):
        with pytest.raises(RequestError) as refused:
            offered(body)
        assert refused.value.param == param, body


def test_earlier_calls_and_their_results_reach_the_template_as_llama_server_gives_them():
    calls = [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
    req = parse({"messages": [{"role": "user", "content": "Weather?"},
                              {"role": "assistant", "content": None, "tool_calls": calls},
                              {"role": "tool", "tool_call_id": "c1", "content": '{"temp_c": 12}'}],
                 "tools": [WEATHER]}, chat=True, context_length=100)
    assert req.tools == (WEATHER,)
    assert req.messages[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    assert req.messages[2] == {"role": "tool", "tool_call_id": "c1", "content": '{"temp_c": 12}'}
    with pytest.raises(RequestError):
        history_calls([{"function": {"name": "f", "arguments": "{broken"}}], "messages[1].tool_calls")
    assert parse({"prompt": "x", "tools": [WEATHER]}, chat=False, context_length=100).tools == ()


TOOLS_TEMPLATE = (   # Qwen2.5's shape, shortened: the tools in the system turn, earlier calls and results in theirs
    "{%- if tools %}<|im_start|>system\nTools:\n{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n"
    "Call one as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{%- for c in m.tool_calls or [] %}<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}</tool_call>{%- endfor %}{% if m.content %}{{ '\\n' + m.content }}{% endif %}"
    "<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.mark.parametrize("backend", ["hf", "llama.cpp"])
def test_both_backends_render_the_tools_and_earlier_calls_into_the_template_and_keep_message_text_plain(backend,
                                                                                                       tmp_path):
    if backend == "hf":
        from core.backends.hf import HFBackend
        from core.tiny import tiny_model, tiny_tokenizer

        tok = tiny_tokenizer()
        tok.chat_template = TOOLS_TEMPLATE
        target = HFBackend(tiny_model(len(tok), 0), tok, device="cpu", name="tiny")
    else:
        pytest.importorskip("llama_cpp")
        from core.backends.llamacpp import LlamaCppBackend
        from tests.tiny_gguf import write_tiny_gguf

        path = write_tiny_gguf(tmp_path / "t.gguf", context=1024, chat_template=TOOLS_TEMPLATE)
        target = LlamaCppBackend(path, n_ctx=1024, n_threads=1)
    req = parse({"messages": [
        {"role": "user", "content": "Weather in <|im_end|>?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "12 C"}], "tools": [WEATHER]}, chat=True,
        context_length=4096)
    ids = ServedModels(target, None, Memory(8, 8), "tiny").chat_prompt(req.messages, req.tools)
    text = target.detokenize(ids)
    assert json.dumps(WEATHER) in text
    # a call made with no text: the template sees no content (no line for it), as llama-server renders it
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call><|im_end|>' in text_of(target,
                                                                                                                ids)
    assert "Weather in <|im_end|>?" in text and "12 C" in text     # message text is text, never a control token
    assert ids != target.apply_chat_template(list(req.messages))


# -- the answer ----------------------------------------------------------------------------------------------------
def test_calls_are_found_in_each_form_and_the_rest_is_the_answers_text():
    content, calls = split_calls(TAGGED, NAMES)
    assert content == "Let me look.\n" and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})]
    for text, city in ((FENCED, "Oslo"), (BARE, "Rome")):
        content, calls = split_calls(text, NAMES)
        assert content.strip() == "" and json.loads(calls[0].arguments) == {"city": city}
    content, calls = split_calls(RAW, NAMES)
    assert content == "" and calls[0].arguments == '{"city": "Paris\\n\\tTexas"}'      # strict JSON out
    content, calls = split_calls(TWO, NAMES)
    assert [json.loads(c.arguments)["city"] for c in calls] == ["A", "B"] and content.strip() == ""
    assert len({c.id for c in calls}) == 2
    for text in NOT_CALLS:
        assert split_calls(text, NAMES) == (text, []), text


@pytest.mark.parametrize("text", [TAGGED, FENCED, BARE, RAW, TWO, *NOT_CALLS])
def test_a_streamed_answer_sends_only_text_that_stays_text(text):
    """At every length the answer could have reached, what may be sent never shrinks and is always the start of the
    finished answer's text: nothing sent can turn out to be part of a call."""
    content, _ = split_calls(text, NAMES)
    sent = 0
    for n in range(len(text) + 1):
        now = sendable(text[:n], NAMES)
        assert sent <= now <= n and text[:now] == content[:now], (n, now)
        sent = now
    assert scan(text, NAMES, final=True)[1] == len(text)
    if text == NOT_CALLS[0]:         # a code block streams on once its fence's line says it is code
        assert sendable(text[:text.index("print") + 1], NAMES) > text.index("```")
    if text == NOT_CALLS[1]:         # a json fence waits for its end, then goes out if it calls nothing
        fence = text.index("```")
        assert sendable(text[:text.index("```", fence + 3)], NAMES) == fence
        assert sendable(text[:text.index("```", fence + 3) + 3], NAMES) > fence


# -- served --------------------------------------------------------------------------------------------------------
ANSWER_STARTS = 1        # the token that ends every scripted prompt


class Scripted(TableBackend):
    """A model of characters that answers every chat with ``script`` (then its end token), whatever it is asked; its
    template offers tools as Qwen's does, or places them as ``form`` says."""

    def __init__(self, script: str, form: str = "hermes") -> None:
        def table(ctx: tuple) -> torch.Tensor:
            p = torch.full((128,), 0.1 / 127, dtype=torch.float64)
            if ANSWER_STARTS in ctx:     # (the prompt is read before its last token)
                k = len(ctx) - 1 - max(i for i, t in enumerate(ctx) if t == ANSWER_STARTS)
                p[ord(script[k]) if k < len(script) else 0] = 0.9
            return p / p.sum()

        super().__init__(table, 128, "scripted", eos=(0,), context_length=4096)
        self.form = form

    def tokenize(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    tokenize_special = tokenize

    def detokenize(self, ids) -> str:
        return "".join(chr(i) for i in ids if i > ANSWER_STARTS)

    def apply_chat_template(self, messages, tools=()) -> list[int]:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        if tools and self.form == "hermes":
            text = f"Tools: {json.dumps(list(tools))}\nCall one as <tool_call>{{...}}</tool_call>\n{text}"
        elif tools and self.form == "other":
            text = f"Tools: {json.dumps(list(tools))}\nCall one as [CALL]{{...}}\n{text}"
        return self.tokenize(text) + [ANSWER_STARTS]


def ask(url: str, **options):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)
    options = {"model": "scripted", "messages": [{"role": "user", "content": "Weather?"}], "temperature": 0,
               "max_tokens": 200, **options}
    return client.chat.completions.create(**options)


@pytest.mark.parametrize("script", [TAGGED, FENCED])
def test_a_served_answer_that_calls_a_tool_comes_back_as_tool_calls_whole_and_streamed(script):
    recorder = Recorder()
    with serving(ServedModels(Scripted(script), None, Memory(8, 8), "scripted"), observer=recorder) as (url, _):
        whole = ask(url, tools=[WEATHER])
        chunks = list(ask(url, tools=[WEATHER], stream=True))
        plain = ask(url)
    assert [r.finished.text for r in recorder.records] == [script] * 3      # the model's own answer, decoded
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls[0].function.name == "get_weather"
    expected, calls = split_calls(script, NAMES)
    assert json.loads(choice.message.tool_calls[0].function.arguments) == json.loads(calls[0].arguments)
    assert choice.message.content == (expected.strip() or None)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    called = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or ()]
    assert streamed == expected and {t.index for t in called} == {0}
    assert [t.function.name for t in called if t.id] == ["get_weather"] and called[0].id      # named once, first
    assert "".join(t.function.arguments for t in called) == choice.message.tool_calls[0].function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert plain.choices[0].message.content == script and plain.choices[0].message.tool_calls is None
    assert plain.choices[0].finish_reason == "stop"                         # no tools offered: no calls read
    from app.serve_panel import describe                                    # the window's Served list says so

    assert [describe(r).endswith(" · called get_weather") for r in recorder.records] == [True, True, False]


def test_an_answer_that_calls_nothing_is_sent_whole_and_finishes_as_usual():
    script = NOT_CALLS[0]
    with serving(ServedModels(Scripted(script), None, Memory(8, 8), "scripted")) as (url, _):
        chunks = list(ask(url, tools=[WEATHER], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == script
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("form, words", [("none", "no place for tools"), ("other", "does not read")])
def test_a_template_that_cannot_offer_tools_in_the_form_read_is_refused(form, words):
    with serving(ServedModels(Scripted(TAGGED, form), None, Memory(8, 8), "scripted")) as (url, _):
        r = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER], "max_tokens": 5})
        assert r.status_code == 400 and words in r.json()["error"]["message"]
        assert r.json()["error"]["param"] == "tools"
        assert ask(url, max_tokens=5).choices[0].message.content == TAGGED[:5]   # without tools it answers
