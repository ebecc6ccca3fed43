"""OpenAI's Responses API (/v1/responses) driven with the real `openai` SDK, as agents such as Codex call it: the
same conversation asked through it and through the chat endpoint is the same prompt and the same greedy answer;
streamed (the SDK's own stream helper) and whole agree; a cut answer is incomplete; function calls out, earlier calls
and their outputs back in; what SpecLens does not do is refused, not ignored."""
from __future__ import annotations

import httpx
import openai
import pytest

from core.memory import Memory
from core.serve.job import ServedModels
from core.serve.request import parse
from core.serve.responses import parse_responses
from core.serve.tools import split_calls
from tests.served import serving
from tests.test_serve_tools import BARE, NAMES, TAGGED, WEATHER, Scripted

TOOL = {"type": "function", **WEATHER["function"]}


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def tiny():
    from core.tiny import tiny_pair

    target, draft = tiny_pair()
    with serving(ServedModels(target, draft, Memory(8, 8), "tiny", remember_answers=False)) as (url, _):
        yield url


def test_the_same_chat_through_either_api_is_the_same_prompt_and_the_same_greedy_answer(tiny):
    ask = dict(model="gpt-any", instructions="Be brief.", input="Write a line.", temperature=0, max_output_tokens=24,
               extra_body={"min_tokens": 24})
    response = client(tiny).responses.create(**ask)
    chat = client(tiny).chat.completions.create(
        model="tiny", max_tokens=24, temperature=0, extra_body={"min_tokens": 24},
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Write a line."}])
    assert response.output_text == chat.choices[0].message.content and response.model == "tiny"
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.input_tokens == chat.usage.prompt_tokens and response.usage.output_tokens == 24
    with client(tiny).responses.stream(**ask) as stream:
        deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert deltas == final.output_text == response.output_text
    short = client(tiny).responses.create(model="m", input="Hi", temperature=0, max_output_tokens=200)
    assert (short.status == "completed") == (short.usage.output_tokens < 200)      # ended by the model, not cut


@pytest.mark.parametrize("script", [TAGGED, BARE])
def test_a_function_call_comes_back_as_a_function_call_item_whole_and_streamed(script):
    with serving(ServedModels(Scripted(script), None, Memory(8, 8), "scripted")) as (url, _):
        ask = dict(model="m", input="Weather?", tools=[TOOL], temperature=0, max_output_tokens=200)
        whole = client(url).responses.create(**ask)
        with client(url).responses.stream(**ask) as stream:
            final = stream.get_final_response()
        plain = client(url).responses.create(**{**ask, "tools": []})
    text, calls = split_calls(script, NAMES)
    kinds = ["message", "function_call"] if text.strip() else ["function_call"]
    for response in (whole, final):
        assert [item.type for item in response.output] == kinds and response.status == "completed"
        call = response.output[-1]
        assert (call.name, call.arguments) == ("get_weather", calls[0].arguments) and call.call_id.startswith("call_")
        assert response.output_text == (text if text.strip() else "")
    assert plain.output_text == script and [item.type for item in plain.output] == ["message"]


def test_earlier_calls_and_outputs_are_the_prompt_the_chat_endpoint_makes_of_them():
    models = ServedModels(Scripted(TAGGED), None, Memory(8, 8), "scripted")
    asked = parse_responses({"instructions": "Be useful.", "tools": [TOOL], "max_output_tokens": 9, "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "reasoning", "id": "r1", "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "9C"},
        {"role": "user", "content": "And tomorrow?"}]}, 4096)
    chat = parse({"max_tokens": 9, "tools": [WEATHER], "messages": [
        {"role": "system", "content": "Be useful."}, {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Looking.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "9C"}, {"role": "user", "content": "And tomorrow?"}]},
        chat=True, context_length=4096)
    assert asked.messages == chat.messages and models.prompt_ids(asked) == models.prompt_ids(chat)


def test_what_speclens_does_not_do_is_refused_and_the_server_goes_on(tiny):
    image = {"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}
    for body, param, words in (
            ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id", "keeps no responses"),
            ({"input": [image]}, "input[0].content", "not 'input_image'"),
            ({"input": "x", "tools": [{"type": "web_search"}]}, "tools", "only function tools"),
            ({"input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format", "json_schema"),
            ({"input": "x", "tools": [TOOL], "tool_choice": "required"}, "tool_choice", "cannot make it call"),
            ({"input": []}, "input", "non-empty"),
            ({"input": [{"type": "computer_call"}]}, "input[0]", "'computer_call' item")):
        r = httpx.post(f"{tiny}/v1/responses", json={"model": "m", **body}, timeout=60)
        assert r.status_code == 400, body
        error = r.json()["error"]
        assert error["param"] == param and words in error["message"], (body, error)
    assert client(tiny).responses.create(model="m", input="Hi", max_output_tokens=2).usage.output_tokens == 2
