"""OpenAI's Responses API (/v1/responses) driven with the real `openai` SDK, as agents such as Codex call it: the
same conversation asked through it and through the chat endpoint is the same prompt and the same greedy answer;
streamed (the SDK's own stream helper) and whole agree; a cut answer is incomplete; function calls out, earlier calls
and their outputs back in; a kept response goes on as the conversation it was, and is found and forgotten by its id;
what SpecLens does not do is refused, not ignored."""
from __future__ import annotations

import httpx
import openai
import pytest

from core.memory import Memory
from core.serve.errors import RequestError
from core.serve.job import ServedModels
from core.serve.kept import ResponseStore
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
        {"role": "user", "content": "And tomorrow?"}]}, 4096, ResponseStore()).request
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
            ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id", "'resp_1' not found"),
            ({"input": "x", "previous_response_id": 7}, "previous_response_id", "the id of a response"),
            ({"input": "x", "store": "yes"}, "store", "true or false"),
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


def test_a_follow_up_to_a_kept_response_is_the_prompt_of_the_whole_conversation_sent_again():
    """Its input comes after the conversation the kept response answered and that response's output (a call and
    its text included); the earlier instructions are not carried over, as OpenAI's are not."""
    kept = ResponseStore()
    first = {"instructions": "Be useful.", "tools": [TOOL], "max_output_tokens": 9,
             "input": [{"role": "user", "content": "Weather in Paris?"}]}
    asked = parse_responses(first, 4096, kept)
    call = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "get_weather",
            "arguments": '{"city": "Paris"}', "status": "completed"}
    said = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]}
    kept.keep({"id": "resp_a", "output": [said, call]}, asked.earlier, asked.own)
    follow = parse_responses({"previous_response_id": "resp_a", "instructions": "Be brief.", "tools": [TOOL],
                              "max_output_tokens": 9, "input": [
                                  {"type": "function_call_output", "call_id": "c1", "output": "9C"}]}, 4096, kept)
    kept.keep({"id": "resp_b", "output": [{**said, "content": [{"type": "output_text", "text": "9C."}]}]},
              follow.earlier, follow.own)
    last = parse_responses({"previous_response_id": "resp_b", "input": "And tomorrow?"}, 4096, kept)
    whole = parse({"tools": [WEATHER], "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Looking.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "9C"}]}, chat=True, context_length=4096)
    assert follow.request.messages == whole.messages and follow.previous == "resp_a"
    assert last.request.messages == whole.messages[1:] + (
        {"role": "assistant", "content": "9C."}, {"role": "user", "content": "And tomorrow?"})
    assert last.earlier[:len(follow.earlier)] == follow.earlier      # a chain holds each earlier item once


def test_the_store_lets_the_least_recently_used_go_first_within_its_count_and_size():
    kept = ResponseStore(max_kept=2, max_chars=10**6)
    for name in "abc":
        kept.keep({"id": name, "output": []}, (), ({"content": name},))
        if name == "b":
            kept.find("a")                   # used: it stays, b goes
    assert len(kept) == 2 and kept.find("a") and kept.find("c")
    with pytest.raises(RequestError) as gone:
        kept.find("b", "previous_response_id")
    assert gone.value.status == 400 and gone.value.code == "previous_response_not_found"
    kept.forget("a")
    with pytest.raises(RequestError) as gone:
        kept.forget("a")
    assert gone.value.status == 404
    small = ResponseStore(max_kept=100, max_chars=300)
    for i in range(10):
        small.keep({"id": str(i), "output": []}, (), ({"content": "x" * 90},))
    assert len(small) == 2 and small.find("9")        # each adds about 110 characters


def test_kept_responses_go_on_are_found_and_forgotten_through_the_sdk(tiny):
    ask = dict(model="m", instructions="Be brief.", temperature=0, max_output_tokens=6, extra_body={"min_tokens": 6})
    first = client(tiny).responses.create(input="Write a line.", **ask)
    assert first.store and client(tiny).responses.retrieve(first.id).output_text == first.output_text
    with client(tiny).responses.stream(input="Another.", previous_response_id=first.id, **ask) as stream:
        follow = stream.get_final_response()
    again = client(tiny).responses.create(store=False, **ask, input=[
        {"role": "user", "content": "Write a line."}, {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Another."}])
    assert follow.previous_response_id == first.id and not again.store
    assert follow.usage.input_tokens == again.usage.input_tokens and follow.output_text == again.output_text
    assert client(tiny).responses.retrieve(follow.id).output_text == follow.output_text
    with pytest.raises(openai.NotFoundError):
        client(tiny).responses.retrieve(again.id)               # store: false
    client(tiny).responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client(tiny).responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError, match="not found"):
        client(tiny).responses.create(input="More.", previous_response_id=first.id, **ask)
    third = client(tiny).responses.create(input="More.", previous_response_id=follow.id, **ask)
    assert third.usage.input_tokens > follow.usage.input_tokens     # a follow-up's own chain is still kept
