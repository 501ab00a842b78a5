"""The OpenAI Python client against `kore-launch serve`, natively and in the guest."""

import json
import os
import subprocess
import threading
import time

import openai
import pytest

from conftest import BIN, PACK, start_server, stop_server

USER = [{"role": "user", "content": "Tell me about the king."}]
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="session")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def model(client):
    return client.models.list().data[0].id


def kore(server, *args):
    out = subprocess.run([BIN, *args, *server.native_flag, "--model", PACK, "--json"],
                         capture_output=True, text=True, timeout=300, check=True, env=server.cli_env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_models_list_names_the_served_pack(client):
    models = client.models.list().data
    assert [m.id for m in models] == ["tiny"]


def test_chat_not_streamed(client, model):
    r = client.chat.completions.create(model=model, messages=USER, max_tokens=16, temperature=0,
                                       extra_body=NO_THINK)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens >= 1 and r.usage.prompt_tokens > 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_streamed_equals_not_streamed(client, model):
    args = dict(model=model, messages=USER, max_tokens=16, temperature=0, extra_body=NO_THINK)
    whole = client.chat.completions.create(**args).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)


def test_completions_streamed_and_not(client, model):
    r = client.completions.create(model=model, prompt="ROMEO:", max_tokens=12, temperature=0)
    assert r.object == "text_completion" and r.usage.completion_tokens == 12
    streamed = "".join(c.choices[0].text for c in
                       client.completions.create(model=model, prompt="ROMEO:", max_tokens=12,
                                                 temperature=0, stream=True) if c.choices)
    assert streamed == r.choices[0].text


def test_seed_reproduces_sampling(client, model):
    def sample(seed):
        return client.completions.create(model=model, prompt="KING:", max_tokens=24, temperature=1.0,
                                         seed=seed).choices[0].text
    assert sample(42) == sample(42)
    assert len({sample(42), sample(7), sample(1234)}) >= 2


def test_greedy_completion_equals_kore_launch_generate(server, client, model):
    cli = kore(server, "generate", "--prompt", "First Citizen:", "--max-tokens", "16")
    r = client.completions.create(model=model, prompt="First Citizen:", max_tokens=16, temperature=0)
    assert r.choices[0].finish_reason == "length" and cli["stop_reason"] == "max_tokens"
    assert r.choices[0].text == cli["text"]


def test_greedy_chat_equals_kore_launch_chat(server, client, model):
    cli = kore(server, "chat", "-p", USER[0]["content"], "--thinking", "off", "--max-tokens", "16")
    r = client.chat.completions.create(model=model, messages=USER, max_tokens=16, temperature=0,
                                       extra_body=NO_THINK)
    assert r.choices[0].message.content == cli["text"]


def test_thinking_on_and_off(client, model):
    on = client.chat.completions.create(model=model, messages=USER, max_tokens=16, temperature=0,
                                        extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    off = client.chat.completions.create(model=model, messages=USER, max_tokens=16, temperature=0,
                                         extra_body=NO_THINK)
    assert getattr(on.choices[0].message, "reasoning_content", None), on
    assert getattr(off.choices[0].message, "reasoning_content", None) is None, off
    streamed = client.chat.completions.create(model=model, messages=USER, max_tokens=16, temperature=0,
                                              stream=True)
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or ""
                        for c in streamed if c.choices)
    assert reasoning == on.choices[0].message.reasoning_content


def test_bad_requests_are_refused_and_the_server_keeps_serving(client, model):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model, messages=USER, top_p=7.0)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model, messages=[])
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model=model, prompt="to be or not " * 3000, max_tokens=4)
    assert too_long.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model, messages=USER, temperature=-1, stream=True)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=USER)
    r = client.completions.create(model=model, prompt="ROMEO:", max_tokens=3, temperature=0)
    assert r.usage.completion_tokens == 3


def test_concurrent_requests_all_finish(client, model):
    results = {}

    def one(i):
        r = client.completions.create(model=model, prompt=f"Line {i}:", max_tokens=8, temperature=0)
        results[i] = r.usage.completion_tokens

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert results == {i: 8 for i in range(4)}


def test_disconnect_mid_stream_cancels(server, client, model):
    before = server.metric('kore_generations_total{finish="cancelled"}')
    stream = client.completions.create(model=model, prompt="JULIET:", max_tokens=3000, temperature=0,
                                       stream=True)
    got = 0
    for chunk in stream:
        got += 1
        if got == 3:
            break
    stream.response.close()
    deadline = time.time() + 30
    while server.metric('kore_generations_total{finish="cancelled"}') <= before:
        assert time.time() < deadline, "the generation was not cancelled"
        time.sleep(0.1)
    assert server.metric("kore_requests_in_flight") == 0


def test_disconnect_while_waiting_for_a_whole_answer_cancels(server, client, model):
    before = server.metric('kore_generations_total{finish="cancelled"}')
    with pytest.raises(openai.APITimeoutError):
        client.with_options(timeout=1.0).completions.create(model=model, prompt="JULIET:",
                                                            max_tokens=3000, temperature=0)
    deadline = time.time() + 30
    while server.metric('kore_generations_total{finish="cancelled"}') <= before:
        assert time.time() < deadline, "the generation was not cancelled"
        time.sleep(0.1)


def test_non_loopback_host_requires_an_api_key():
    env = dict(os.environ)
    env.pop("KORE_API_KEY", None)
    r = subprocess.run([BIN, "serve", "--native", "--model", PACK, "--host", "0.0.0.0", "--port", "0"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode != 0 and "--api-key" in r.stderr, r.stderr
    helptext = subprocess.run([BIN, "serve", "--help"], capture_output=True, text=True, check=True).stdout
    assert "requires --api-key" in helptext


def test_api_key_is_checked_by_bearer():
    keyed = start_server("native", extra=("--api-key", "s3cret"))
    try:
        wrong = openai.OpenAI(base_url=keyed.url + "/v1", api_key="nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
        right = openai.OpenAI(base_url=keyed.url + "/v1", api_key="s3cret", max_retries=0)
        assert [m.id for m in right.models.list().data] == ["tiny"]
    finally:
        stop_server(keyed)
