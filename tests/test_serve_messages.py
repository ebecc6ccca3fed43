"""Anthropic's Messages API (/v1/messages) driven with the real `anthropic` SDK, as agents such as Claude Code call
it: the same conversation asked through it and through OpenAI's chat endpoint is the same prompt and the same greedy
answer; streamed and whole agree; stop reasons, stop sequences, tool use (calls out, earlier calls and results back
in), token counting, and refusals in Anthropic's error shape."""
from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from core.memory import Memory
from core.serve.job import ServedModels
from core.serve.messages import parse_messages
from core.serve.request import parse
from tests.served import serving
from tests.test_serve_tools import BARE, NAMES, TAGGED, WEATHER, Scripted
from core.serve.tools import split_calls

GREEDY = {"temperature": 0}
TOOL = {"name": "get_weather", "description": WEATHER["function"]["description"],
        "input_schema": WEATHER["function"]["parameters"]}


def client(url: str, key: str = "none") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def tiny():
    from core.tiny import tiny_pair

    target, draft = tiny_pair()
    models = ServedModels(target, draft, Memory(8, 8), "tiny", remember_answers=False)
    with serving(models) as (url, _):
        yield url, models


def test_the_same_chat_through_either_api_is_the_same_prompt_and_the_same_greedy_answer(tiny):
    url, models = tiny
    ask = dict(max_tokens=24, system="Be brief.", messages=[{"role": "user", "content": "Write a line."}])
    message = client(url).messages.create(model="claude-any", extra_body={**GREEDY, "min_tokens": 24}, **ask)
    chat = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0).chat.completions.create(
        model="tiny", max_tokens=24, temperature=0, extra_body={"min_tokens": 24},
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Write a line."}])
    assert message.content[0].text == chat.choices[0].message.content and message.model == "tiny"
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 24
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == chat.usage.prompt_tokens
    with client(url).messages.stream(model="claude-any", extra_body={**GREEDY, "min_tokens": 24}, **ask) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == final.content[0].text == message.content[0].text and final.stop_reason == "max_tokens"
    counted = client(url).messages.count_tokens(model="claude-any", system="Be brief.", messages=ask["messages"])
    assert counted.input_tokens == chat.usage.prompt_tokens


def test_a_stop_sequence_ends_the_answer_before_it_and_is_named(tiny):
    url, _ = tiny
    ask = dict(model="m", max_tokens=40, messages=[{"role": "user", "content": "Go on."}])
    text = client(url).messages.create(extra_body={**GREEDY, "min_tokens": 40}, **ask).content[0].text
    word = text[10:13]
    cut = client(url).messages.create(stop_sequences=[word], extra_body={**GREEDY, "min_tokens": 40}, **ask)
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == word
    assert cut.content[0].text == text[:text.index(word)]


@pytest.mark.parametrize("script", [TAGGED, BARE])
def test_a_tool_call_comes_back_as_a_tool_use_block_whole_and_streamed(script):
    with serving(ServedModels(Scripted(script), None, Memory(8, 8), "scripted")) as (url, _):
        ask = dict(model="m", max_tokens=200, tools=[TOOL], messages=[{"role": "user", "content": "Weather?"}],
                   extra_body=GREEDY)
        whole = client(url).messages.create(**ask)
        with client(url).messages.stream(**ask) as stream:
            streamed = "".join(stream.text_stream)
            final = stream.get_final_message()
        plain = client(url).messages.create(**{**ask, "tools": []})
    text, calls = split_calls(script, NAMES)
    blocks = ["text", "tool_use"] if text.strip() else ["tool_use"]      # an answer that is only a call has no text
    for message in (whole, final):
        assert message.stop_reason == "tool_use" and [b.type for b in message.content] == blocks
        assert message.content[-1].name == "get_weather" and message.content[-1].input == json.loads(calls[0].arguments)
    assert streamed == (text if text.strip() else "")
    assert [b.model_dump(exclude={"id"}) for b in whole.content] == [
        b.model_dump(exclude={"id"}) for b in final.content]
    assert plain.stop_reason == "end_turn" and plain.content[0].text == script     # no tools offered: no calls read


def test_earlier_calls_and_results_are_the_prompt_the_chat_endpoint_makes_of_them():
    """An assistant's tool_use and the user's tool_result render as OpenAI's tool_calls and tool message do."""
    models = ServedModels(Scripted(TAGGED), None, Memory(8, 8), "scripted")
    anthropic_body = {"max_tokens": 9, "tools": [TOOL], "system": [{"type": "text", "text": "Be useful."}],
                      "messages": [
                          {"role": "user", "content": "Weather in Paris?"},
                          {"role": "assistant", "content": [
                              {"type": "thinking", "thinking": "a tool", "signature": "x"},
                              {"type": "text", "text": "Looking."},
                              {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}]},
                          {"role": "user", "content": [
                              {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "9C"}]},
                              {"type": "text", "text": "And tomorrow?"}]}]}
    openai_body = {"max_tokens": 9, "tools": [WEATHER], "messages": [
        {"role": "system", "content": "Be useful."}, {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Looking.", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "9C"}, {"role": "user", "content": "And tomorrow?"}]}
    asked = parse_messages(anthropic_body, 4096)
    assert asked.messages == parse(openai_body, chat=True, context_length=4096).messages
    assert models.prompt_ids(asked) == models.prompt_ids(parse(openai_body, chat=True, context_length=4096))


def test_an_agents_max_tokens_is_a_ceiling_the_context_lowers(tiny):
    """Agents ask for far more tokens than a local context holds (Claude Code: 32000): answered up to what fits, as
    llama-server answers them, not refused as OpenAI's chat endpoint refuses."""
    url, models = tiny
    room = models.target.context_length
    message = client(url).messages.create(model="m", max_tokens=10 * room, messages=[{"role": "user", "content": "Hi"}],
                                          extra_body={"min_tokens": 16})
    assert 16 <= message.usage.output_tokens and message.usage.input_tokens + message.usage.output_tokens <= room
    response = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0).responses.create(
        model="m", input="Hi", max_output_tokens=10 * room, extra_body={"min_tokens": 16})
    assert 16 <= response.usage.output_tokens and response.usage.total_tokens <= room
    refused = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 10 * room})
    assert refused.status_code == 400


def test_refusals_come_in_anthropics_shape_and_the_server_goes_on(tiny):
    url, _ = tiny
    user = [{"role": "user", "content": "Hi"}]
    for body, words in (({"messages": user}, "'max_tokens' is required"),
                        ({"max_tokens": 5, "messages": []}, "'messages' must be"),
                        ({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "role"),
                        ({"max_tokens": 5, "messages": [{"role": "user", "content": [
                            {"type": "image", "source": {"type": "base64", "data": ""}}]}]}, "'image' block"),
                        ({"max_tokens": 5, "messages": user, "tools": [TOOL], "tool_choice": {"type": "any"}},
                         "tool_choice 'any'"),
                        ({"max_tokens": 5, "messages": user, "stop_sequences": [""]}, "'stop'")):
        r = httpx.post(f"{url}/v1/messages", json=body, timeout=60)
        assert r.status_code == 400, body
        error = r.json()
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", error
        assert words in error["error"]["message"], (words, error)
    with pytest.raises(anthropic.BadRequestError):
        client(url).messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": [
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}]}])
    assert client(url).messages.create(model="m", max_tokens=2, messages=user).usage.output_tokens == 2


def test_anthropics_key_header_is_accepted_and_a_wrong_key_refused_in_its_shape():
    from core.tiny import tiny_pair

    target, _ = tiny_pair()
    with serving(ServedModels(target, None, Memory(8, 8), "tiny"), api_key="sesame") as (url, _):
        hello = dict(model="m", max_tokens=2, messages=[{"role": "user", "content": "Hi"}])
        ok = client(url, "sesame").messages.create(**hello)
        with pytest.raises(anthropic.AuthenticationError) as refused:
            client(url, "wrong").messages.create(**hello)
        bearer = openai.OpenAI(base_url=f"{url}/v1", api_key="sesame", max_retries=0).models.list()
        listed = client(url, "sesame").models.list()
    assert ok.usage.output_tokens == 2 and bearer.data[0].id == "tiny"
    assert [m.id for m in listed.data] == ["tiny"] and listed.data[0].display_name == "tiny"
    assert refused.value.body["error"]["type"] == "authentication_error"
