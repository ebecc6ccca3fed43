"""A call's arguments go out while the model writes them, on every API `speclens serve` speaks (an agent shows a file
being written as it is, not after the last token): pushed in any pieces, a streamed answer's parts add up to exactly
what the whole answer says — its text before the calls, each call named once and then its arguments, its text after
— and nothing that goes out is taken back. Driven through the real `openai` and `anthropic` SDKs' stream helpers on
a scripted model, so nothing asserted depends on what a random model says."""
from __future__ import annotations

import json

import anthropic
import openai
import pytest

from core.memory import Memory
from core.serve.job import ServedModels
from core.serve.tools import Argued, Began, Called, Holdback, Said, split_calls
from tests.served import serving
from tests.test_serve_tools import BARE, FENCED, NOT_CALLS, RAW, TAGGED, TWO, WEATHER, Scripted

WRITE = {"type": "function", "function": {
    "name": "write_file", "description": "Writes a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}}}}
NAMES = frozenset({"get_weather", "write_file"})
# a file written into an argument with raw line breaks, a fence and a closing tag in it; text after the call
WRITES = ('I will write it.\n<tool_call>\n{"name": "write_file", "arguments": {"path": "README.md", "content": '
          '"# Demo\n```python\nprint(\\"</tool_call>\\")\n```\n"}}\n</tool_call>\nDone.')
NO_OUTER_BRACE = '<tool_call>{"name": "get_weather", "arguments": {"city": "Lima"}</tool_call>'
CUT = 'Checking.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Li'      # max_tokens met inside it
ANSWERS = [TAGGED, FENCED, BARE, RAW, TWO, WRITES, NO_OUTER_BRACE, CUT, *NOT_CALLS]


def streamed(text: str, step: int) -> list[tuple[int, object]]:
    """The parts of ``text`` pushed ``step`` characters at a time, then finished, each with how much was pushed."""
    held = Holdback((WEATHER, WRITE))
    parts = [(n, part) for n in range(step, len(text) + step, step) for part in held.push(text[n - step:n])]
    return parts + [(len(text), part) for part in held.finish(text)]


@pytest.mark.parametrize("step", [1, 4, 13])
@pytest.mark.parametrize("text", ANSWERS)
def test_streamed_parts_add_up_to_the_whole_answer_in_any_pieces(text, step):
    parts = [part for _, part in streamed(text, step)]
    content, calls = split_calls(text, NAMES)
    said = "".join(p.text for p in parts if isinstance(p, Said))
    assert content.startswith(said) and (said == content or calls and not content[len(said):].strip())
    begun = [i for i, p in enumerate(parts) if isinstance(p, Began)]
    done = [i for i, p in enumerate(parts) if isinstance(p, Called)]
    assert len(begun) == len(done) == len(calls)
    for k, (b, d) in enumerate(zip(begun, done)):
        assert parts[b].index == parts[d].index == k and (k == 0 or b > done[k - 1])     # one call at a time
        arguments = "".join(p.text for p in parts[b:d] if isinstance(p, Argued) and p.index == k)
        assert parts[d].call == calls[k].__class__(calls[k].name, arguments, parts[b].id)
        assert (parts[b].name, arguments) == (calls[k].name, calls[k].arguments)
    if calls:    # text goes out before the first call or after the last, never inside one
        assert all(i < begun[0] or i > done[-1] for i, p in enumerate(parts) if isinstance(p, Said))
    held = Holdback((WEATHER, WRITE))
    assert [p.call.arguments for p in held.whole(text) if isinstance(p, Called)] == [c.arguments for c in calls]
    assert "".join(p.text for p in held.whole(text) if isinstance(p, Said)).strip() == content.strip()


def test_a_calls_arguments_go_out_while_they_are_written_and_stay_strict_json():
    parts = streamed(WRITES, 1)
    first = next(n for n, p in parts if isinstance(p, Argued))
    assert WRITES[:first].endswith('"arguments": {')           # the moment its arguments begin
    arguments = "".join(p.text for _, p in parts if isinstance(p, Argued))
    assert json.loads(arguments) == {"path": "README.md", "content": '# Demo\n```python\nprint("</tool_call>")\n```\n'}
    began = next(i for i, (_, p) in enumerate(parts) if isinstance(p, Began))
    assert "".join(p.text for _, p in parts[:began] if isinstance(p, Said)) == "I will write it.\n"
    assert [p.text for _, p in parts[began:] if isinstance(p, Said)] == ["\nDone."]     # once it is all written
    cut = [p for _, p in streamed(CUT, 1) if isinstance(p, Called)]
    assert [c.call.arguments for c in cut] == ['{"city": "Li']   # as far as it was written when the answer was cut


ASK = {"messages": [{"role": "user", "content": "Write the README."}], "max_tokens": 300}


def _chat(url: str) -> tuple[list, str, list]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)
    with client.chat.completions.stream(model="scripted", tools=[WRITE], temperature=0, **ASK) as stream:
        deltas = [e.arguments_delta for e in stream if e.type == "tool_calls.function.arguments.delta"]
        final = stream.get_final_completion().choices[0].message
    return deltas, final.content, [(c.function.name, c.function.arguments) for c in final.tool_calls]


def _messages(url: str) -> tuple[list, str, list]:
    client = anthropic.Anthropic(base_url=url, api_key="none", max_retries=0, timeout=60)
    tool = {"name": "write_file", "input_schema": WRITE["function"]["parameters"]}
    with client.messages.stream(model="scripted", tools=[tool], extra_body={"temperature": 0}, **ASK) as stream:
        deltas = [e.delta.partial_json for e in stream if e.type == "content_block_delta"
                  and e.delta.type == "input_json_delta"]
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["text", "tool_use", "text"]    # as written: text, call, text
    return (deltas, "".join(b.text for b in final.content if b.type == "text"),
            [(b.name, json.dumps(b.input)) for b in final.content if b.type == "tool_use"])


def _responses(url: str) -> tuple[list, str, list]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)
    tool = {"type": "function", **WRITE["function"]}
    with client.responses.stream(model="scripted", input=ASK["messages"][0]["content"], tools=[tool], temperature=0,
                                 max_output_tokens=ASK["max_tokens"]) as stream:
        deltas = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    assert [item.type for item in final.output] == ["message", "function_call", "message"]
    return deltas, final.output_text, [(i.name, i.arguments) for i in final.output if i.type == "function_call"]


@pytest.mark.parametrize("api", [_chat, _messages, _responses], ids=["chat", "messages", "responses"])
def test_every_api_streams_a_calls_arguments_in_pieces_its_sdk_puts_back_together(api):
    with serving(ServedModels(Scripted(WRITES), None, Memory(8, 8), "scripted")) as (url, _):
        deltas, text, calls = api(url)
    content, expected = split_calls(WRITES, NAMES)
    assert len(deltas) > 1 and [(name, json.loads(args)) for name, args in calls] == [
        (expected[0].name, json.loads(expected[0].arguments))]
    if api is not _messages:        # Anthropic's SDK hands the arguments back as the object they make
        assert "".join(deltas) == calls[0][1] == expected[0].arguments
    assert text.replace("\n", "") == content.replace("\n", "")
