#!/usr/bin/env python3
"""The tables of scripts/bench_llamacpp.sh's depth mode (bench_llamacpp_depth.sh).

    bench_llamacpp_depth.py OUT ROUNDS THREADS PACK KV "TESTS" ENGINE...

OUT holds kore-<test>-<round>.json (kore-launch bench --json) and <gguf>-<test>-<round>.json
(llama-bench -o json), load.txt and bytes.txt (weight bytes a decode step reads per GGUF);
TESTS are dD (prompt 512 and decode at depth D) and pN (prefill of an N-token prompt). Prints
per test every round's figures with the load around each run, the medians and the median
ratios ours / each GGUF, and per depth the bytes each side reads per decode step (weights + KV
cache: Kore's KV at D + 512 positions in precision KV, llama.cpp's f16 cache at D).
"""

import json
import statistics
import sys
import tomllib


def kv_bytes_per_position(pack, elem_bytes):
    """K and V of every full-attention layer for one position."""
    with open(f"{pack}/pack.toml", "rb") as f:
        cfg = tomllib.load(f)["config"]
    full = sum(1 for t in cfg["layer_types"] if t == "full_attention")
    return 2 * full * cfg["num_key_value_heads"] * cfg["head_dim"] * elem_bytes


def llama_figure(path):
    """(pp tok/s, tg tok/s) of one llama-bench run (None where it did not run that test)."""
    runs = json.load(open(path))
    pp = next((x["avg_ts"] for x in runs if x["n_prompt"] > 0 and x["n_gen"] == 0), None)
    tg = next((x["avg_ts"] for x in runs if x["n_gen"] > 0 and x["n_prompt"] == 0), None)
    return pp, tg, runs[0]


def main(argv):
    out, rounds, threads, pack, kv = argv[1], int(argv[2]), argv[3], argv[4], argv[5]
    tests, engines = argv[6].split(), argv[7:]
    llamas = engines[1:]
    loads = {}
    for line in open(f"{out}/load.txt"):
        eng, r, test, when, *avg = line.split()
        loads.setdefault((eng, r, test), {})[when] = avg[0]
    gguf_bytes = dict(line.split() for line in open(f"{out}/bytes.txt"))
    kore_kv = kv_bytes_per_position(pack, 2 if kv == "f16" else 4)
    llama_kv = kv_bytes_per_position(pack, 2)
    print(f"threads {threads}; run files in {out}; Kore KV {kv}, llama.cpp KV f16")
    info, gbps = {}, []
    for test in tests:
        depth = int(test[1:]) if test.startswith("d") else 0
        long_prompt = int(test[1:]) if test.startswith("p") else 0
        what = f"prompt {long_prompt} from empty" if long_prompt else f"depth {depth}"
        print(f"\n### {what}\n")
        print("| round | engine | prefill tok/s | decode tok/s | ours / it: prefill "
              "| ours / it: decode | load avg (1 min) |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        speeds = {e: ([], []) for e in engines}
        ratios = {e: ([], []) for e in llamas}
        kbytes, kkv = 0, 0
        for r in range(1, rounds + 1):
            k = json.loads(open(f"{out}/kore-{test}-{r}.json").read())
            kp, kd = k["prefill_tok_per_s"], k["decode_tok_per_s"]
            kbytes = int(k["weight_bytes_per_step"])
            # A kore-launch that ignores KORE_BENCH_DEPTH would report depth 0: refuse it.
            if k.get("depth") != depth:
                sys.exit(f"kore-{test}-{r}.json: depth {k.get('depth')}, asked for {depth} "
                         "(a kore-launch without KORE_BENCH_DEPTH support?)")
            kkv = int(k["kv_bytes_per_step"])
            gbps.append(k["measured_read_gbps"])
            speeds["kore"][0].append(kp)
            speeds["kore"][1].append(kd)
            ld = loads[("kore", str(r), test)]
            dec = "" if long_prompt else f"{kd:.3f}"
            print(f"| {r} | Kore ({k['kernels']}) | {kp:.2f} | {dec} | | | "
                  f"{ld['before']}-{ld['after']} |")
            for e in llamas:
                pp, tg, info = llama_figure(f"{out}/{e}-{test}-{r}.json")
                if pp is not None:  # None: tg only (KORE_BENCH_DEPTH_PREFILL=0)
                    speeds[e][0].append(pp)
                    ratios[e][0].append(kp / pp)
                if tg is not None and not long_prompt:
                    speeds[e][1].append(tg)
                    ratios[e][1].append(kd / tg)
                ld = loads[(e, str(r), test)]
                tgs = "" if tg is None or long_prompt else f"{tg:.3f}"
                rd = "" if tg is None or long_prompt else f"{kd / tg:.3f}"
                pps, rp = ("", "") if pp is None else (f"{pp:.2f}", f"{kp / pp:.3f}")
                print(f"| {r} | llama.cpp {e} | {pps} | {tgs} | {rp} | {rd} | "
                      f"{ld['before']}-{ld['after']} |")
        print()
        for e in engines:
            p, d = speeds[e]
            pre = f"prefill {statistics.median(p):.2f} tok/s" if p else "prefill not run"
            dec = f", decode {statistics.median(d):.3f} tok/s" if d else ""
            print(f"median {e}: {pre}{dec}")
        for e in llamas:
            p, d = ratios[e]
            pre = f"prefill {statistics.median(p):.3f}" if p else "prefill not run"
            dec = f", decode {statistics.median(d):.3f}" if d else ""
            print(f"median ratio ours / llama.cpp {e}: {pre}{dec}")
        if not long_prompt:
            # Kore's own count (its report's kv_bytes_per_step: depth + prompt positions in
            # its KV precision) where the shapes' product must agree with it.
            kk = kore_kv * (depth + 512)
            if kkv != kk:
                sys.exit(f"{test}: Kore reports {kkv} KV bytes a step, the shapes give {kk}")
            parts = [f"Kore {(kbytes + kk) / 1e9:.3f} GB ({kbytes / 1e9:.3f} weights + "
                     f"{kk / 1e9:.3f} KV)"]
            for e in llamas:
                lk = llama_kv * depth
                gb = int(gguf_bytes[e])
                parts.append(f"llama.cpp {e} {(gb + lk) / 1e9:.3f} GB ({gb / 1e9:.3f} + "
                             f"{lk / 1e9:.3f} KV)")
            print("bytes read per decode step: " + "; ".join(parts))
    print("\nhost read bandwidth (Kore's probe before each of its runs, GB/s): "
          + ", ".join(f"{g:.1f}" for g in gbps))
    print(f"llama.cpp build: {info.get('build_commit')} ({info.get('cpu_info')})")


if __name__ == "__main__":
    main(sys.argv)
