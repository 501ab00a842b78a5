#!/usr/bin/env python3
"""The prefix cache's benchmark (issue #34; not a test, figures in docs/benchmarks.md).

    scripts/bench/prefix_cache.py PACK [--native] [--out RESULT.json] [--tokens 4096,8192]

On PACK (the issue's: `kore-launch pack synth --preset qwen3.5-2b -o /work/packs/2b`), 2 vCPUs
(or threads with --native), one `serve`, the official openai client, greedy, thinking off:

(a) a 10-turn conversation with a 4,096-token system prompt: time to first token (TTFT) of
    each turn; turns 2-10 against turn 2, and against a full re-prefill of turn 10's prompt
    (the same conversation behind a system prompt differing in its first token);
(c) 8 concurrent clients with one new 4,096-token system prompt and their own questions:
    each one's TTFT and cached tokens, and the tokens prefilled altogether;
(b) an 8,192-token system prompt cold (its prefill), then `serve` restarted (a new process and
    guest: the host hands the checkpoint files over at boot) and a new question behind it:
    time to ready and its TTFT.
Prints one JSON object (and writes it to --out).
"""
import argparse
import concurrent.futures
import json
import pathlib
import shutil
import time

from kore_serve import Serve, text_of_tokens, timed_chat


def conversation(srv, system, turns):
    msgs = [{"role": "system", "content": system}]
    rows = []
    for k in range(1, turns + 1):
        msgs.append({"role": "user", "content": f"Turn {k}: what news from the court?"})
        ttft, _, text, usage = timed_chat(srv.client, msgs)
        cached = usage.prompt_tokens_details.cached_tokens
        rows.append({"turn": k, "ttft_s": round(ttft, 3), "prompt_tokens": usage.prompt_tokens,
                     "cached_tokens": cached})
        print(f"(a) turn {k}: ttft {ttft:.3f} s, prompt {usage.prompt_tokens}, cached {cached}",
              flush=True)
        msgs.append({"role": "assistant", "content": text})
    # The same prompt as turn 10's behind another first token: nothing to reuse.
    cold = [{"role": "system", "content": "X" + system}] + msgs[1:-1]
    ttft, _, _, usage = timed_chat(srv.client, cold)
    print(f"(a) full re-prefill of turn 10: ttft {ttft:.3f} s, cached "
          f"{usage.prompt_tokens_details.cached_tokens}", flush=True)
    later = [r["ttft_s"] for r in rows[1:]]
    return {"turns": rows, "re_prefill_turn10_ttft_s": round(ttft, 3),
            "max_turn2_10_over_turn2": round(max(later) / later[0], 3),
            "turn10_speedup_vs_re_prefill": round(ttft / rows[-1]["ttft_s"], 1)}


def concurrent_clients(srv, system, clients=8):
    def one(i):
        msgs = [{"role": "system", "content": system},
                {"role": "user", "content": f"Client {i}: who goes there?"}]
        ttft, _, _, usage = timed_chat(srv.client, msgs)
        return {"client": i, "ttft_s": round(ttft, 3), "prompt_tokens": usage.prompt_tokens,
                "cached_tokens": usage.prompt_tokens_details.cached_tokens}

    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        rows = list(pool.map(one, range(clients)))
    wall = time.time() - t0
    prefilled = sum(r["prompt_tokens"] - r["cached_tokens"] for r in rows)
    print(f"(c) {clients} clients: wall {wall:.1f} s, prefilled {prefilled} tokens of "
          f"{sum(r['prompt_tokens'] for r in rows)}", flush=True)
    return {"clients": rows, "wall_s": round(wall, 3), "tokens_prefilled": prefilled}


def wait_for_file(cache_dir, tokens, timeout=900):
    deadline = time.time() + timeout
    while time.time() < deadline:
        for f in pathlib.Path(cache_dir).glob("kore/*/*/*.ckpt"):
            if int(f.name.split("-")[0]) >= tokens:
                return f
        time.sleep(0.5)
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pack")
    ap.add_argument("--native", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--tokens", default="4096,8192")
    ap.add_argument("--work", default="/tmp/kore-prefix-bench")
    ap.add_argument("--parts", default="acb", help="which of a, c, b to run (b last)")
    a = ap.parse_args()
    short, long_ = (int(x) for x in a.tokens.split(","))
    work = pathlib.Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    cache = work / "xdg"
    s1, s2, s3 = (text_of_tokens(a.pack, n, seed) if part in a.parts else "" for n, seed, part in
                  ((short, 1, "a"), (long_, 2, "b"), (short, 3, "c")))
    result = {"pack": a.pack, "placement": "native" if a.native else "guest",
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    srv = Serve(a.pack, cache, native=a.native, log=work / "serve1.log")
    result["ready_cold_s"] = round(srv.ready_s, 3)
    try:
        if "a" in a.parts:
            result["a"] = conversation(srv, s1, 10)
        if "c" in a.parts:
            result["c"] = concurrent_clients(srv, s3)
        if "b" not in a.parts:
            return print(json.dumps(result))
        msgs = [{"role": "system", "content": s2}, {"role": "user", "content": "Who is there?"}]
        ttft, _, _, usage = timed_chat(srv.client, msgs)
        result["b_cold"] = {"ttft_s": round(ttft, 3), "prompt_tokens": usage.prompt_tokens}
        print(f"(b) cold {usage.prompt_tokens} tokens: ttft {ttft:.3f} s", flush=True)
        f = wait_for_file(cache, long_)
        result["b_file_bytes"] = f.stat().st_size if f else None
        result["metrics_1"] = srv.metrics()
    finally:
        srv.stop()
    srv = Serve(a.pack, cache, native=a.native, log=work / "serve2.log")
    try:
        msgs = [{"role": "system", "content": s2}, {"role": "user", "content": "Who comes?"}]
        ttft, _, _, usage = timed_chat(srv.client, msgs)
        result["b_warm"] = {"ready_s": round(srv.ready_s, 3), "ttft_s": round(ttft, 3),
                            "prompt_tokens": usage.prompt_tokens,
                            "cached_tokens": usage.prompt_tokens_details.cached_tokens}
        print(f"(b) restarted: ready in {srv.ready_s:.2f} s, ttft {ttft:.3f} s, cached "
              f"{usage.prompt_tokens_details.cached_tokens}", flush=True)
        result["metrics_2"] = srv.metrics()
    finally:
        srv.stop()
    print(json.dumps(result))
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
