#!/usr/bin/env bash
# Kore vs llama.cpp on the same NVFP4 weights and the same threads, alternating in one run.
#
#   scripts/bench_llamacpp.sh PACK [THREADS=2] [ROUNDS=3]
#
# NOT run by CI: it downloads llama.cpp from PyPI, builds it and converts a pack
# (20+ minutes on 2 cores, several GB under $KORE_BENCH_WORK). Run it by hand on
# a machine that is otherwise idle: both engines spin-wait between operations, so
# any other load distorts the figures (llama.cpp's OpenMP barriers most).
#
# 1. llama.cpp: $LLAMA_CPP_DIR if set (a llama.cpp source tree; its build/bin/llama-bench
#    is built if missing), else PyPI's llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist,
#    whose vendor/llama.cpp carries convert_hf_to_gguf.py and gguf-py. CMake Release,
#    GGML_NATIVE (-march=native), CPU only, target llama-bench.
# 2. The pack -> a ModelOpt-NVFP4 Hugging Face directory (bench_llamacpp_hf.py: the pack's
#    tensor bytes unchanged) -> GGUF with the bundled converter (bench_llamacpp_convert.py:
#    upstream's ModelOpt path repacks NVFP4 as GGML NVFP4, no requantization; `--outtype
#    bf16` keeps the bf16 embedding/lm_head; `--no-mtp` drops the pack's mtp.* tensors:
#    this llama.cpp's loader does not take NVFP4 scales on the NextN layer, and neither
#    engine drafts here). bench_llamacpp_types.py then checks the GGUF's tensor types.
# 3. ROUNDS rounds, the engine order swapped every round, nothing else run in between:
#    `kore-launch bench --native --model PACK --threads T --mtp 0 --json`
#    (prefill_tok_per_s: 512-token prompt; decode_tok_per_s: 128 tokens after it) and
#    `llama-bench -m GGUF -t T -p 512 -n 128 -r 1 -o json` (pp512, tg128 from an empty
#    context). Prints both figures per round, the load average around each run, the
#    ratios ours / llama.cpp per round and their medians.
#
# Environment: KORE_BENCH_WORK (work dir, default /work/packs/llamacpp), LLAMA_CPP_DIR,
# LLAMA_CPP_PYTHON_VERSION (default 0.3.36), KORE_LAUNCH (a kore-launch binary; default:
# `cargo build --release -p kore-launch` in this repo). Needs python3 with torch, numpy
# and transformers (the converter's imports), cmake and a C++ compiler.
set -euo pipefail

PACK=$(cd "${1:?usage: bench_llamacpp.sh PACK [THREADS] [ROUNDS]}" && pwd)
THREADS=${2:-2}
ROUNDS=${3:-3}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
WORK=${KORE_BENCH_WORK:-/work/packs/llamacpp}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
NAME=$(basename "$PACK")
mkdir -p "$WORK"
say() { echo "== $*" >&2; }

# 1. llama.cpp sources and llama-bench.
LLAMA=${LLAMA_CPP_DIR:-$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp}
if [ ! -f "$LLAMA/convert_hf_to_gguf.py" ]; then
    [ -n "${LLAMA_CPP_DIR:-}" ] && { echo "LLAMA_CPP_DIR=$LLAMA has no convert_hf_to_gguf.py" >&2; exit 1; }
    say "downloading llama-cpp-python $VERSION (sdist) from PyPI"
    # Without --no-build-isolation pip builds the sdist's build requirements (CMake among
    # them) from source just to read its metadata: 20+ minutes on 2 cores.
    python3 -m pip install --quiet scikit-build-core
    python3 -m pip download --no-deps --no-binary :all: --no-build-isolation \
        "llama-cpp-python==$VERSION" -d "$WORK"
    tar -xzf "$WORK/llama_cpp_python-$VERSION.tar.gz" -C "$WORK"
fi
BENCH=$LLAMA/build/bin/llama-bench
if [ ! -x "$BENCH" ]; then
    command -v cmake >/dev/null || apt-get install -y -qq cmake || python3 -m pip install cmake
    say "building llama-bench in $LLAMA/build (Release, native, CPU only)"
    cmake -S "$LLAMA" -B "$LLAMA/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
    cmake --build "$LLAMA/build" -j"$(nproc)" --target llama-bench
fi
LLAMA_VERSION=$("$BENCH" --version 2>&1 | grep -m1 version || true)
say "llama.cpp: $LLAMA ($LLAMA_VERSION)"

# 2. Pack -> ModelOpt HF directory -> GGUF (NVFP4 kept), then check its types.
python3 -c "import torch, numpy, transformers" 2>/dev/null \
    || { echo "the converter needs torch, numpy and transformers: pip install torch numpy transformers" >&2; exit 1; }
export PYTHONPATH=$LLAMA/gguf-py${PYTHONPATH:+:$PYTHONPATH}
GGUF=$WORK/$NAME-nvfp4.gguf
if [ ! -f "$GGUF" ]; then
    say "ModelOpt view of $PACK -> $WORK/$NAME-modelopt"
    python3 "$HERE/bench_llamacpp_hf.py" "$PACK" "$WORK/$NAME-modelopt"
    say "converting to $GGUF"
    python3 "$HERE/bench_llamacpp_convert.py" "$LLAMA" "$WORK/$NAME-modelopt" \
        --outtype bf16 --no-mtp --outfile "$GGUF.part" >"$WORK/$NAME-convert.log" 2>&1 \
        || { tail -20 "$WORK/$NAME-convert.log" >&2; exit 1; }
    mv "$GGUF.part" "$GGUF"
fi
say "GGUF tensor types ($GGUF)"
python3 "$HERE/bench_llamacpp_types.py" "$GGUF"

# 3. Kore.
if [ -n "${KORE_LAUNCH:-}" ]; then
    KORE=$KORE_LAUNCH
else
    cargo build --release -p kore-launch --manifest-path "$REPO/Cargo.toml"
    KORE=$REPO/target/release/kore-launch
fi
say "kore-launch: $KORE (repo $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?'))"

OUT=$WORK/$NAME-run-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
load() { cut -d' ' -f1-3 /proc/loadavg; }
run_kore() {
    local r=$1
    echo "kore $r before $(load)" >>"$OUT/load.txt"
    "$KORE" bench --native --model "$PACK" --threads "$THREADS" --mtp 0 --json \
        2>"$OUT/kore-$r.log" | tail -1 >"$OUT/kore-$r.json"
    echo "kore $r after $(load)" >>"$OUT/load.txt"
}
run_llama() {
    local r=$1
    echo "llama $r before $(load)" >>"$OUT/load.txt"
    "$BENCH" -m "$GGUF" -t "$THREADS" -p 512 -n 128 -r 1 -o json \
        >"$OUT/llama-$r.json" 2>"$OUT/llama-$r.log"
    echo "llama $r after $(load)" >>"$OUT/load.txt"
}
for r in $(seq 1 "$ROUNDS"); do
    if [ $((r % 2)) -eq 1 ]; then
        say "round $r/$ROUNDS: kore, then llama.cpp"; run_kore "$r"; run_llama "$r"
    else
        say "round $r/$ROUNDS: llama.cpp, then kore"; run_llama "$r"; run_kore "$r"
    fi
done

python3 - "$OUT" "$ROUNDS" "$THREADS" <<'PY'
import json, statistics, sys
out, rounds, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3]
loads = {}
for line in open(f"{out}/load.txt"):
    eng, r, when, *avg = line.split()
    loads.setdefault((eng, r), {})[when] = avg[0]
rows, rp, rd = [], [], []
print(f"threads {threads}; run files in {out}")
print("| round | kore prefill | llama pp512 | prefill ratio | kore decode | llama tg128 | decode ratio | kore bw fraction | load avg (1 min) kore / llama |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for r in range(1, rounds + 1):
    k = json.loads(open(f"{out}/kore-{r}.json").read())
    ll = json.load(open(f"{out}/llama-{r}.json"))
    pp = next(x["avg_ts"] for x in ll if x["n_prompt"] > 0 and x["n_gen"] == 0)
    tg = next(x["avg_ts"] for x in ll if x["n_gen"] > 0 and x["n_prompt"] == 0)
    kp, kd = k["prefill_tok_per_s"], k["decode_tok_per_s"]
    rp.append(kp / pp); rd.append(kd / tg)
    lk, lj = loads[("kore", str(r))], loads[("llama", str(r))]
    print(f"| {r} | {kp:.2f} | {pp:.2f} | {kp/pp:.3f} | {kd:.3f} | {tg:.3f} | {kd/tg:.3f} | "
          f"{k['bandwidth_fraction']:.2f} | {lk['before']}-{lk['after']} / {lj['before']}-{lj['after']} |")
print(f"median ratio ours / llama.cpp: prefill {statistics.median(rp):.3f}, decode {statistics.median(rd):.3f}")
print(f"llama.cpp build: {ll[0].get('build_commit')} ({ll[0].get('model_type')}, {ll[0].get('cpu_info')})")
PY
