"""The automatic prefix cache through the official OpenAI client, natively and in the guest
(issue #34): a conversation's earlier turns are reported as cached, and a restarted `serve`
finds the checkpoints on disk again and answers exactly as the uncached first run did."""

import shutil
import threading
import time

import openai
import pytest

from conftest import OUT, start_server, stop_server

NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
SYSTEM = "You are a player in a Shakespeare play and you answer in verse. " * 12
# The generation prompt's tokens after the checkpoint at its `<think>` (thinking off:
# `<think>\n\n</think>\n\n`): a turn's prompt less these is what the next turn reuses.
GENERATION_PROMPT_SLACK = 8


def client_of(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def ask(client, messages, max_tokens=8):
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=max_tokens,
                                       temperature=0, extra_body=NO_THINK)
    return r.choices[0].message.content, r.usage


def test_ten_turns_report_the_previous_turns_as_cached(server):
    client = client_of(server)
    messages = [{"role": "system", "content": SYSTEM + f"({server.placement} ten turns)"}]
    previous_prompt = None
    for turn in range(1, 11):
        messages.append({"role": "user", "content": f"Turn {turn}: what news from the court?"})
        text, usage = ask(client, messages)
        cached = usage.prompt_tokens_details.cached_tokens
        if previous_prompt is None:
            assert cached == 0, f"turn 1 starts cold: {usage}"
        else:
            assert previous_prompt - GENERATION_PROMPT_SLACK <= cached <= previous_prompt, \
                f"turn {turn}: cached {cached}, previous prompt {previous_prompt}"
            assert cached < usage.prompt_tokens
        previous_prompt = usage.prompt_tokens
        messages.append({"role": "assistant", "content": text})


@pytest.mark.parametrize("placement", ["native", "guest"])
def test_a_restarted_serve_answers_from_disk_as_the_uncached_first(placement):
    cache = OUT / f"xdg-restart-{placement}"
    shutil.rmtree(cache, ignore_errors=True)
    messages = [{"role": "system", "content": SYSTEM + f"({placement} restart)"},
                {"role": "user", "content": "Who comes there?"}]
    answers = []
    for run in range(2):
        server = start_server(placement, cache_dir=cache)
        try:
            text, usage = ask(client_of(server), messages, max_tokens=24)
            answers.append((text, usage.prompt_tokens_details.cached_tokens))
            if run == 0:
                # Files are written off the request's path: wait for them before stopping.
                deadline = time.time() + 120
                while not list(cache.glob("kore/*/*/*.ckpt")) and time.time() < deadline:
                    time.sleep(0.2)
                time.sleep(1)
        finally:
            stop_server(server)
        if run == 0:
            files = list(cache.glob("kore/*/*/*.ckpt"))
            assert files, f"the first run kept no checkpoint file under {cache}"
            assert all(f.stat().st_mode & 0o777 == 0o600 for f in files)
    (first, cold), (second, warm) = answers
    assert cold == 0
    assert warm > 100, f"the restarted serve reused {warm} tokens"
    assert second == first, "a cached answer must equal the uncached one"


@pytest.mark.parametrize("placement", ["native", "guest"])
def test_checkpoints_reach_the_disk_while_a_request_runs(placement):
    """A serve that is never idle still keeps its checkpoints: the guest sends them a piece at
    a time between engine steps (it used to wait for an idle moment, so a long answer, or a
    steady stream of requests, kept every checkpoint from the disk until it ended)."""
    cache = OUT / f"xdg-busy-{placement}"
    shutil.rmtree(cache, ignore_errors=True)
    server = start_server(placement, cache_dir=cache)
    messages = [{"role": "system", "content": SYSTEM + f"({placement} long answer)"},
                {"role": "user", "content": "Speak on."}]
    chunks, finished = [], threading.Event()

    def long_answer():  # about 2,000 tokens: several seconds even natively
        stream = client_of(server).chat.completions.create(
            model="tiny", messages=messages, max_tokens=2000, temperature=0, stream=True,
            extra_body=NO_THINK)
        for chunk in stream:
            chunks.append(chunk)
        finished.set()

    thread = threading.Thread(target=long_answer, daemon=True)
    try:
        thread.start()
        deadline = time.time() + 120
        while not list(cache.glob("kore/*/*/*.ckpt")) and not finished.is_set() \
                and time.time() < deadline:
            time.sleep(0.05)
        assert list(cache.glob("kore/*/*/*.ckpt")), "no checkpoint file while the answer ran"
        assert not finished.is_set(), "the file came only once the answer had ended"
        thread.join(timeout=300)
    finally:
        stop_server(server)
    assert finished.is_set() and chunks[-1].choices[0].finish_reason == "length"
