"""Shared by scripts/bench/prefix_cache.py and soak_cache.py: start and stop `kore-launch
serve`, make prompts of a given token count, time a streamed chat request."""

import json
import os
import pathlib
import re
import subprocess
import threading
import time

import openai

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("KORE_LAUNCH", str(ROOT / "target" / "release" / "kore-launch"))
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
WORDS = ("the king of denmark walks upon the battlements at night and speaks of crowns "
         "swords poison ghosts and the sea while players rehearse their lines by torchlight "
         "in a hall of stone where ravens nest").split()


class Serve:
    """A running `serve` with its URL; `env` carries the placement's settings."""

    def __init__(self, pack, cache_dir, native=False, vcpus=2, context=40000, log=None,
                 extra=()):
        cmd = [BIN, "-v", "serve", "--model", str(pack), "--port", "0", *extra]
        if native:
            cmd.insert(3, "--native")
        # Guest RAM on hugepages as the product runs it (serve warns and uses ordinary pages
        # when the pool is short: reserve them first, `kore-launch setup`): on ordinary pages
        # every first touch of guest memory faults in the host, which made the boot's
        # checkpoint hand-over 2-3x slower (docs/benchmarks.md, prefix cache).
        env = dict(os.environ, XDG_CACHE_HOME=str(cache_dir), KORE_VCPUS=str(vcpus),
                   KORE_CONTEXT=str(context),
                   KORE_RUNTIME_DIR=str(pathlib.Path(cache_dir) / "rt"))
        if native:
            env["RAYON_NUM_THREADS"] = str(vcpus)
        self.started = time.time()
        self.log = open(log or os.devnull, "a")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env=env)
        found = {}

        def read():
            for line in self.proc.stdout:
                m = re.search(r"(http://[0-9.:\[\]]+)/ ", line)
                if m and "url" not in found:
                    found["url"] = m.group(1)

        threading.Thread(target=read, daemon=True).start()
        while "url" not in found:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited {self.proc.returncode}")
            time.sleep(0.05)
        self.ready_s = time.time() - self.started
        self.url = found["url"]
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="x", max_retries=0,
                                    timeout=3600)
        self.client.model_name = self.client.models.list().data[0].id

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def metrics(self):
        import urllib.request
        text = urllib.request.urlopen(self.url + "/metrics", timeout=30).read().decode()
        out = {}
        for line in text.splitlines():
            if line.startswith("kore_cache") or line.startswith("kore_queue"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out


def count_tokens(pack, text):
    out = subprocess.run([BIN, "tokenize", "--model", str(pack), "--text", text, "--json"],
                         capture_output=True, text=True, check=True)
    return len(json.loads(out.stdout.strip().splitlines()[-1])["ids"])


def text_of_tokens(pack, n, seed):
    """Words (a seeded walk over WORDS) making about `n` tokens."""
    def words(k):
        return " ".join(WORDS[(seed * 7 + i * (seed % 5 + 1)) % len(WORDS)] for i in range(k))
    lo, hi = 1, 2 * n
    while lo < hi:
        mid = (lo + hi) // 2
        if count_tokens(pack, words(mid)) < n:
            lo = mid + 1
        else:
            hi = mid
    return f"[{seed}] " + words(lo)


def timed_chat(client, messages, max_tokens=8, seed=None):
    """Streams one chat request: (ttft_s, total_s, text, usage)."""
    t0 = time.time()
    ttft, parts, usage = None, [], None
    extra = dict(NO_THINK)
    kw = {} if seed is None else {"seed": seed, "temperature": 0.8}
    if seed is None:
        kw["temperature"] = 0
    stream = client.chat.completions.create(model=client.model_name, messages=messages, max_tokens=max_tokens,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body=extra, **kw)
    for chunk in stream:
        if chunk.choices and ttft is None:
            ttft = time.time() - t0
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    return ttft, time.time() - t0, "".join(parts), usage
