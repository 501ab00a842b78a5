#!/usr/bin/env python3
"""Soak of the prefix cache (issue #34; not CI, figures in docs/reliability.md).

    scripts/bench/soak_cache.py PACK [--minutes 60] [--clients 16] [--native]
                                [--system-tokens 600] [--cache 64M] [--cache-disk 256M]

First an uncached `serve` (`--cache 0 --cache-disk 0`) answers every request of a fixed pool
(3 system prompts x 4 questions x 1-2 turns x greedy or 2 seeds): the references. Then a
cached `serve` (fresh cache directory, small budgets so that both tiers evict) takes
`--clients` concurrent official-openai clients for `--minutes`, each looping: a random pool
request (streamed or not) whose answer must equal its reference, a cancel (the stream closed
after its first chunk), or a bad request (must be a 400). Midway `serve` is restarted (the
same cache directory: the second one starts from the files). Every 5 s /metrics is read:
the cache's bytes must stay within their budgets. Exits non-zero on any mismatch, any HTTP
status other than 200, 400 (bad requests) and 503 (queue full), or a budget overrun; prints
one JSON summary.
"""
import argparse
import json
import pathlib
import random
import shutil
import threading
import time
import urllib.request

import openai

from kore_serve import NO_THINK, Serve, text_of_tokens


def pool(pack, system_tokens):
    systems = [text_of_tokens(pack, system_tokens, seed) for seed in (11, 12, 13)]
    questions = ["Who goes there?", "What news from Rome?", "Speak of the sea.", "Why so sad?"]
    items = []
    for si, s in enumerate(systems):
        for qi, q in enumerate(questions):
            for turns in (1, 2):
                msgs = [{"role": "system", "content": s}, {"role": "user", "content": q}]
                if turns == 2:
                    msgs += [{"role": "assistant", "content": "I know not, my lord."},
                             {"role": "user", "content": questions[(qi + 1) % 4]}]
                for seed in (None, 1, 2):
                    items.append({"key": f"s{si}q{qi}t{turns}seed{seed}", "messages": msgs,
                                  "seed": seed})
    return items


def ask(client, item, stream=False, cancel=False):
    kw = {"temperature": 0} if item["seed"] is None else {"temperature": 0.8, "seed": item["seed"]}
    args = dict(model=client.model_name, messages=item["messages"], max_tokens=12,
                extra_body=NO_THINK, **kw)
    if not stream and not cancel:
        return client.chat.completions.create(**args).choices[0].message.content
    s = client.chat.completions.create(stream=True, **args)
    parts = []
    for chunk in s:
        if cancel:
            s.close()
            return None
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    return "".join(parts)


def size_bytes(text):
    """`256M`, `1G`, `65536K` or a plain number of bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    return int(t[:-1]) * units[t[-1]] if t and t[-1] in units else int(t)


def bad_request(url, model):
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}],
                       "temperature": -3}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=60)
        return 200
    except urllib.error.HTTPError as e:
        return e.code


class Soak:
    def __init__(self, a, items, refs):
        self.a, self.items, self.refs = a, items, refs
        self.lock = threading.Lock()
        self.counts = {"ok": 0, "cancelled": 0, "bad_400": 0, "status_503": 0,
                       "restart_window_errors": 0}
        self.failures = []
        self.srv = None
        self.restarting = threading.Event()
        self.max_bytes = {"memory": 0, "disk": 0}

    def count(self, k):
        with self.lock:
            self.counts[k] = self.counts.get(k, 0) + 1

    def client_loop(self, i, deadline):
        rng = random.Random(i)
        while time.time() < deadline:
            srv = self.srv
            item = rng.choice(self.items)
            r = rng.random()
            try:
                if r < 0.08:
                    code = bad_request(srv.url, srv.client.model_name)
                    self.count("bad_400" if code == 400 else f"bad_{code}")
                    if code != 400:
                        self.failures.append(f"bad request answered {code}")
                elif r < 0.18:
                    ask(srv.client, item, cancel=True)
                    self.count("cancelled")
                else:
                    text = ask(srv.client, item, stream=r < 0.5)
                    if text != self.refs[item["key"]]:
                        self.failures.append(f"{item['key']}: {text!r} != {self.refs[item['key']]!r}")
                    self.count("ok")
            except openai.APIStatusError as e:
                if e.status_code == 503:
                    self.count("status_503")
                else:
                    self.failures.append(f"{item['key']}: HTTP {e.status_code}")
            except (openai.APIConnectionError, ConnectionError, OSError):
                if self.restarting.is_set() or self.srv is not srv:
                    self.count("restart_window_errors")
                    time.sleep(0.2)
                else:
                    self.failures.append(f"{item['key']}: connection error outside a restart")

    def watch(self, deadline):
        while time.time() < deadline:
            time.sleep(5)
            try:
                m = self.srv.metrics()
            except Exception:
                continue
            for tier in ("memory", "disk"):
                b = m.get(f'kore_cache_bytes{{tier="{tier}"}}', 0)
                budget = m.get(f'kore_cache_budget_bytes{{tier="{tier}"}}', 0)
                if tier == "disk" and not budget:
                    # A guest's /metrics has the memory tier only: the disk tier is the
                    # host's directory, read here.
                    b, budget = self.disk_bytes(), size_bytes(self.a.cache_disk)
                self.max_bytes[tier] = max(self.max_bytes[tier], b)
                if budget and b > budget:
                    self.failures.append(f"{tier} cache {b} bytes over its budget {budget}")

    def disk_bytes(self):
        total = 0
        for f in pathlib.Path(self.a.work, "xdg", "kore").rglob("*.ckpt"):
            try:
                total += f.stat().st_size
            except FileNotFoundError:  # evicted while listed
                pass
        return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pack")
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--native", action="store_true")
    ap.add_argument("--system-tokens", type=int, default=600)
    ap.add_argument("--cache", default="64M")
    ap.add_argument("--cache-disk", default="256M")
    ap.add_argument("--work", default="/tmp/kore-soak")
    ap.add_argument("--out")
    a = ap.parse_args()
    work = pathlib.Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    items = pool(a.pack, a.system_tokens)
    t0 = time.time()
    ref = Serve(a.pack, work / "ref-xdg", native=a.native, log=work / "ref.log",
                extra=["--cache", "0", "--cache-disk", "0"])
    refs = {it["key"]: ask(ref.client, it) for it in items}
    ref.stop()
    print(f"references: {len(refs)} requests in {time.time() - t0:.0f} s", flush=True)
    cache_flags = ["--cache", a.cache, "--cache-disk", a.cache_disk]
    soak = Soak(a, items, refs)
    soak.srv = Serve(a.pack, work / "xdg", native=a.native, log=work / "serve1.log",
                     extra=cache_flags)
    start = time.time()
    deadline = start + a.minutes * 60
    threads = [threading.Thread(target=soak.client_loop, args=(i, deadline)) for i in range(a.clients)]
    threads.append(threading.Thread(target=soak.watch, args=(deadline,)))
    for t in threads:
        t.start()
    time.sleep(a.minutes * 30)
    soak.restarting.set()
    old = soak.srv
    old.stop()
    soak.srv = Serve(a.pack, work / "xdg", native=a.native, log=work / "serve2.log",
                     extra=cache_flags)
    restart_ready_s = soak.srv.ready_s
    soak.restarting.clear()
    for t in threads:
        t.join()
    final = soak.srv.metrics()
    soak.srv.stop()
    summary = {"pack": a.pack, "placement": "native" if a.native else "guest",
               "minutes": a.minutes, "clients": a.clients, "pool": len(items),
               "counts": soak.counts, "failures": soak.failures[:20],
               "failure_count": len(soak.failures), "max_cache_bytes": soak.max_bytes,
               "restart_ready_s": round(restart_ready_s, 2), "final_metrics": final,
               "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start))}
    print(json.dumps(summary))
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps(summary, indent=1) + "\n")
    raise SystemExit(1 if soak.failures else 0)


if __name__ == "__main__":
    main()
