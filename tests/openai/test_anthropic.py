"""Anthropic's Messages API (`POST /v1/messages`) with the official `anthropic` client against
`kore-launch serve`, natively and in the guest: a message whole and streamed, a tool round trip
whose call validates with the `jsonschema` package, structured output, refusals and the key
check. The client no longer offers `temperature`; the server still reads it (older clients send
it), so the greedy tests pass it in `extra_body`."""

import json
import urllib.request

import anthropic
import jsonschema
import pytest

from conftest import start_server, stop_server

WEATHER = {"name": "get_weather", "description": "Weather of a city", "input_schema": {
    "type": "object", "properties": {
        "city": {"enum": ["Paris", "Oslo", "Lima"]}, "days": {"type": "integer"},
        "metric": {"type": "boolean"}}, "required": ["city", "days"],
    "additionalProperties": False}}
TIME = {"name": "get_time", "input_schema": {"type": "object", "properties": {
    "zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"], "additionalProperties": False}}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def model(server):
    return json.loads(urllib.request.urlopen(server.url + "/v1/models").read())["data"][0]["id"]


def test_a_message_whole_and_streamed_agree(client, model):
    args = dict(model=model, max_tokens=24, extra_body=GREEDY, system="Be brief.",
                messages=[{"role": "user", "content": "Tell me a story."}])
    whole = client.messages.create(**args)
    assert whole.type == "message" and whole.role == "assistant" and whole.id.startswith("msg_")
    assert [b.type for b in whole.content] == ["text"]
    assert whole.stop_reason in ("end_turn", "max_tokens")
    assert whole.usage.input_tokens > 0 and whole.usage.output_tokens > 0
    with client.messages.stream(**args) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text
    assert [(b.type, b.text) for b in final.content] == [(b.type, b.text) for b in whole.content]
    assert (final.stop_reason, final.usage.output_tokens) == (whole.stop_reason,
                                                             whole.usage.output_tokens)


def test_stop_sequences_report_the_one_that_matched(client, model):
    free = client.messages.create(model=model, max_tokens=24, extra_body=GREEDY, messages=USER)
    text = free.content[0].text
    # Two characters amid others (white space at an answer's edge is trimmed, not cut).
    at = next(i for i in range(2, len(text) - 2) if not text[i - 1:i + 3].isspace()
              and not any(c.isspace() for c in text[i - 1:i + 3]))
    stop = text[at:at + 2]
    cut = client.messages.create(model=model, max_tokens=24, extra_body=GREEDY, messages=USER,
                                 stop_sequences=["never-said", stop])
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", stop)
    assert cut.content[0].text == text[:text.index(stop)]


def test_tool_round_trip(client, model):
    first = client.messages.create(
        model=model, max_tokens=512, messages=USER, tools=[WEATHER, TIME],
        tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert first.stop_reason == "tool_use", first
    calls = [b for b in first.content if b.type == "tool_use"]
    assert len(calls) == 1, first.content
    schemas = {t["name"]: t["input_schema"] for t in (WEATHER, TIME)}
    for call in calls:
        assert call.id.startswith("toolu_")
        jsonschema.validate(call.input, schemas[call.name])
    results = [{"type": "tool_result", "tool_use_id": c.id, "content": "sunny, 21 C"}
               for c in calls]
    turns = USER + [{"role": "assistant", "content": first.content},
                    {"role": "user", "content": results}]
    second = client.messages.create(model=model, max_tokens=32, messages=turns,
                                    tools=[WEATHER, TIME], tool_choice={"type": "none"})
    assert second.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in second.content] == ["text"]
    prompt = lambda u: u.input_tokens + u.cache_read_input_tokens  # the prefix cache may serve some
    assert prompt(second.usage) > prompt(first.usage)


def test_a_streamed_call_equals_the_whole_one(client, model):
    args = dict(model=model, max_tokens=512, messages=USER, tools=[WEATHER, TIME],
                extra_body={"temperature": 0.8, "seed": 5},
                tool_choice={"type": "tool", "name": "get_weather",
                             "disable_parallel_tool_use": True})
    whole = client.messages.create(**args)
    with client.messages.stream(**args) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert final.stop_reason == whole.stop_reason == "tool_use"
    strip = lambda m: [(b.type, getattr(b, "name", None), getattr(b, "input", None),
                        getattr(b, "text", None)) for b in m.content]
    assert strip(final) == strip(whole)
    assert [b.name for b in whole.content if b.type == "tool_use"] == ["get_weather"]
    jsonschema.validate(whole.content[-1].input, WEATHER["input_schema"])


def test_thinking_comes_back_as_a_thinking_block(client, model):
    r = client.messages.create(model=model, max_tokens=64, extra_body=GREEDY, messages=USER,
                               thinking={"type": "enabled", "budget_tokens": 1024})
    # The prompt ends in an open <think>: the answer starts with the model's thinking.
    assert r.content[0].type == "thinking" and r.content[0].thinking, r.content
    assert all(b.type in ("thinking", "text") for b in r.content)


@pytest.mark.parametrize("extra", [
    {"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]},
    {"messages": USER, "output_config": {"effort": "max"}},
    {"messages": USER, "output_config": {"format": {"type": "json_schema", "schema": {
        "type": "string", "pattern": "^a+$"}}}},
    {"messages": USER, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
])
def test_unserved_fields_are_400s_in_anthropics_shape(client, model, extra):
    extra = dict(extra)  # the parameter is shared by the native and guest runs
    body = dict(model=model, max_tokens=4, messages=extra.pop("messages"))
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(**body, extra_body=extra)
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error"


def test_structured_output_validates(client, model):
    schema = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]},
                                               "days": {"type": "integer"}},
              "required": ["city", "days"], "additionalProperties": False}
    for seed in range(3):
        r = client.messages.create(
            model=model, max_tokens=256, messages=USER, extra_body={"seed": seed},
            output_config={"format": {"type": "json_schema", "schema": schema}})
        assert r.stop_reason == "end_turn", r
        jsonschema.validate(json.loads(r.content[0].text), schema)


def test_an_unknown_model_is_a_404(client):
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-none", max_tokens=4, messages=USER)


def test_the_key_is_checked_by_x_api_key():
    keyed = start_server("native", extra=("--api-key", "s3cret"))
    try:
        ask = urllib.request.Request(keyed.url + "/v1/models",
                                     headers={"Authorization": "Bearer s3cret"})
        model = json.loads(urllib.request.urlopen(ask).read())["data"][0]["id"]
        args = dict(model=model, max_tokens=2, messages=USER)
        wrong = anthropic.Anthropic(base_url=keyed.url, api_key="nope", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as e:
            wrong.messages.create(**args)
        assert e.value.body["error"]["type"] == "authentication_error"
        right = anthropic.Anthropic(base_url=keyed.url, api_key="s3cret", max_retries=0)
        assert right.messages.create(**args).usage.output_tokens == 2
    finally:
        stop_server(keyed)
