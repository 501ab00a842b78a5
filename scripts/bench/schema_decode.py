#!/usr/bin/env python3
"""Decode speed with a JSON schema against without (issue #35; not a test, figures in
docs/benchmarks.md).

    scripts/bench/schema_decode.py PACK [--native] [--rounds 5] [--tokens 64]

One `kore-launch serve` on PACK (in the guest with 2 vCPUs unless --native), the official openai
client, greedy, thinking off: the same prompt alternately plain and with a `json_schema`
`response_format` (strict), `--tokens` tokens each; the engine's own decode rate
(`kore_stats.decode_tok_per_s`) of every answer. Prints each answer's rate and the ratio of the
medians (schema / plain). The per-token mask cost itself is measured by
appliance/app/examples/mask_bench.rs.
"""
import argparse
import json
import pathlib
import shutil
import statistics

from kore_serve import NO_THINK, Serve

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "notes": {"type": "string"},
    },
    "required": ["name", "age", "tags", "notes"],
    "additionalProperties": False,
}


def rate(client, max_tokens, schema):
    extra = dict(NO_THINK)
    kw = {}
    if schema:
        kw["response_format"] = {"type": "json_schema",
                                 "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    r = client.chat.completions.create(
        model=client.model_name, max_tokens=max_tokens, temperature=0, extra_body=extra,
        messages=[{"role": "user", "content": "Describe a player of the court as JSON."}], **kw)
    stats = r.model_extra["kore_stats"]
    return stats["decode_tok_per_s"], r.usage.completion_tokens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pack")
    ap.add_argument("--native", action="store_true")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--work", default="/tmp/kore-schema-bench")
    a = ap.parse_args()
    work = pathlib.Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    srv = Serve(a.pack, work / "xdg", native=a.native, log=work / "serve.log",
                extra=("--cache", "0"))
    rows = {"plain": [], "schema": []}
    try:
        rate(srv.client, 8, False)  # warm-up
        for k in range(a.rounds):
            for kind in (("plain", "schema") if k % 2 == 0 else ("schema", "plain")):
                tps, n = rate(srv.client, a.tokens, kind == "schema")
                rows[kind].append(tps)
                print(f"round {k} {kind}: {tps:.2f} tok/s over {n} tokens", flush=True)
    finally:
        srv.stop()
    plain, schema = statistics.median(rows["plain"]), statistics.median(rows["schema"])
    print(json.dumps({"pack": a.pack, "placement": "native" if a.native else "guest",
                      "plain_tok_s": rows["plain"], "schema_tok_s": rows["schema"],
                      "median_plain": round(plain, 3), "median_schema": round(schema, 3),
                      "ratio": round(schema / plain, 3)}))


if __name__ == "__main__":
    main()
