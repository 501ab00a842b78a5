#!/usr/bin/env bash
# Kore vs llama.cpp as its users run it (Q4_0 and Q4_K_M GGUFs of the same shapes, made
# with llama.cpp's own llama-quantize), same threads, alternating in one run.
#
#   scripts/bench_llamacpp.sh PACK [THREADS=2] [ROUNDS=3]
#
# ROUNDS=0 only builds llama.cpp and makes the GGUFs (the long part, which needs no quiet
# machine), so that a later run on an idle machine times the engines only.
#
# NOT run by CI: it downloads llama.cpp from PyPI, builds it and converts a pack
# (20+ minutes on 2 cores, several GB under $KORE_BENCH_WORK). Run it by hand on
# a machine that is otherwise idle: both engines spin-wait between operations, so
# any other load distorts the figures (llama.cpp's OpenMP barriers most).
#
# 1. llama.cpp: $LLAMA_CPP_DIR if set (a llama.cpp source tree; its build/bin/llama-bench
#    and llama-quantize are built if missing), else PyPI's llama-cpp-python
#    $LLAMA_CPP_PYTHON_VERSION sdist, whose vendor/llama.cpp carries convert_hf_to_gguf.py
#    and gguf-py. CMake Release, GGML_NATIVE (-march=native), CPU only. For the AVX2
#    comparison point LLAMA_CPP_DIR at a tree and set LLAMA_CMAKE_FLAGS (e.g.
#    "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON") and a separate
#    LLAMA_BUILD_DIR, and run Kore with KORE_KERNELS=avx2. On a CPU with AMX the native
#    build of 0c1e570 turns on llama.cpp's AMX path, which segfaulted on these GGUFs on an
#    Intel Xeon (ggml_backend_amx_mul_mat); build it yourself with
#    -DCMAKE_C_FLAGS/-DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" into a
#    directory of its own and point LLAMA_BUILD_DIR at it (docs/benchmarks.md).
# 2. The pack -> a BF16 Hugging Face directory (bench_llamacpp_hf.py --bf16: NVFP4
#    dequantized with its scales folded in; a tied model's q8/NVFP4 head dropped, so the
#    output is the BF16 embedding) -> BF16 GGUF with the bundled converter
#    (bench_llamacpp_convert.py `--outtype bf16 --no-mtp`) -> `llama-quantize` to Q4_0 and
#    Q4_K_M (llama.cpp picks its own head type, Q6_K for a tied embedding). With
#    KORE_BENCH_NVFP4=1 also the pack's NVFP4 weights unchanged (ModelOpt view -> GGML
#    NVFP4, the earlier comparison). bench_llamacpp_types.py checks each GGUF's types.
# 3. ROUNDS rounds over the engines (Kore, llama.cpp Q4_0, Q4_K_M or those of KORE_BENCH_QUANTS
#    [, NVFP4]), the order
#    reversed every round, nothing else run in between:
#    `kore-launch bench --native --model PACK --threads T --mtp 0 --json`
#    (prefill_tok_per_s: 512-token prompt; decode_tok_per_s: 128 tokens after it) and
#    `llama-bench -m GGUF -t T -p 512 -n 128 -r 1 -o json` (pp512, tg128 from an empty
#    context). Prints every figure per round with the load average around each run, each
#    engine's median prefill and decode, the ratios ours / each llama.cpp GGUF and their
#    medians, the host's read bandwidth (Kore's probe, measured_read_gbps, before each of
#    its rounds) and the weight bytes a decode step reads on both sides (Kore:
#    weight_bytes_per_step; GGUF: every tensor but an untied embedding,
#    bench_llamacpp_types.py --bytes-per-token). Another process on the cores distorts
#    llama.cpp most: its OpenMP threads spin at a barrier after every op, and one
#    descheduled thread stalls the other (2b decode fell from 20 to 0.7-2.2 tok/s here).
#
# Depth mode (long context, issue #36): with KORE_BENCH_DEPTHS="0 8192 32768" each round runs,
# per depth D and engine, Kore `KORE_BENCH_DEPTH=D` (prompt 512 after D synthetic positions of
# context, then 128 decode steps: decode at depth D + 512) against `llama-bench -p 512 -n 128
# -d D` (pp512 @ dD and tg128 @ dD, llama.cpp prefilling the D tokens of depth first, untimed),
# and with KORE_BENCH_LONG_PROMPT=N also a prefill of an N-token prompt from an empty context
# (`-p N -n 0 --no-warmup`: a warm-up would prefill the N tokens once more). It prints a table
# per depth: tok/s, ratios ours / each GGUF with their medians, and the bytes each side reads
# per decode step at that depth (weights + KV cache:
# Kore's at D + 512 positions in its KV precision, KORE_KV or f16; llama.cpp's f16 cache at D).
#
# Environment: KORE_BENCH_WORK (work dir, default /work/packs/llamacpp), LLAMA_CPP_DIR,
# LLAMA_BUILD_DIR (default $LLAMA/build), LLAMA_CMAKE_FLAGS (default -DGGML_NATIVE=ON),
# LLAMA_CPP_PYTHON_VERSION (default 0.3.36), KORE_LAUNCH (a kore-launch binary; default:
# `cargo build --release -p kore-launch` in this repo), KORE_BENCH_NVFP4=1, KORE_BENCH_QUANTS
# (the GGUF types to run, default "Q4_0 Q4_K_M"; e.g. "Q4_0" alone where a long 9b depth
# run has time for one). Needs python3
# with torch, numpy and transformers (the converter's imports), cmake and a C++ compiler.
# torch: the converter imports it at the top and loads every tensor through it, so it is
# needed; PyPI has only the CUDA build (`pip install torch`: about 4 GB with its nvidia-*
# wheels; `--no-deps` does not import), which runs on the CPU as well.
set -euo pipefail

PACK=$(cd "${1:?usage: bench_llamacpp.sh PACK [THREADS] [ROUNDS]}" && pwd)
THREADS=${2:-2}
ROUNDS=${3:-3}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
WORK=${KORE_BENCH_WORK:-/work/packs/llamacpp}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
NAME=$(basename "$PACK")
read -r -a QUANTS <<<"${KORE_BENCH_QUANTS:-Q4_0 Q4_K_M}"
[ "${#QUANTS[@]}" -gt 0 ] || { echo "KORE_BENCH_QUANTS names no GGUF type (Q4_0, Q4_K_M)" >&2; exit 2; }
declare -A SEEN
for q in "${QUANTS[@]}"; do
    case $q in Q4_0 | Q4_K_M) ;; *)
        echo "KORE_BENCH_QUANTS: $q is not one of Q4_0 Q4_K_M" >&2; exit 2 ;;
    esac
    [ -z "${SEEN[$q]:-}" ] || { echo "KORE_BENCH_QUANTS names $q twice" >&2; exit 2; }
    SEEN[$q]=1
done
mkdir -p "$WORK"
say() { echo "== $*" >&2; }

# 1. llama.cpp sources and llama-bench.
LLAMA=${LLAMA_CPP_DIR:-$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp}
# CMake first: pip reads the sdist's metadata through scikit-build-core, which looks for it.
command -v cmake >/dev/null || apt-get install -y -qq cmake || python3 -m pip install cmake
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
BUILD=${LLAMA_BUILD_DIR:-$LLAMA/build}
BENCH=$BUILD/bin/llama-bench
QUANTIZE=$BUILD/bin/llama-quantize
if [ ! -x "$BENCH" ] || [ ! -x "$QUANTIZE" ]; then
    say "building llama-bench and llama-quantize in $BUILD (Release, CPU only)"
    # shellcheck disable=SC2086 # LLAMA_CMAKE_FLAGS is a list of flags
    cmake -S "$LLAMA" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release ${LLAMA_CMAKE_FLAGS:--DGGML_NATIVE=ON} \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
    cmake --build "$BUILD" -j"$(nproc)" --target llama-bench llama-quantize
fi
LLAMA_VERSION=$("$BENCH" --version 2>&1 | grep -m1 version || true)
say "llama.cpp: $LLAMA ($LLAMA_VERSION)"

# 2. GGUFs: BF16 (scales folded in) -> Q4_0, Q4_K_M; NVFP4 unchanged when asked.
export PYTHONPATH=$LLAMA/gguf-py${PYTHONPATH:+:$PYTHONPATH}
convert() { # HF_DIR OUT.gguf
    python3 "$HERE/bench_llamacpp_convert.py" "$LLAMA" "$1" \
        --outtype bf16 --no-mtp --outfile "$2.part" >"$2.log" 2>&1 \
        || { tail -20 "$2.log" >&2; exit 1; }
    mv "$2.part" "$2"
}
BF16=$WORK/$NAME-bf16.gguf
bf16() { # the BF16 GGUF, made once (only needed to quantize; it may be deleted after)
    [ -f "$BF16" ] && return
    python3 -c "import torch, numpy, transformers" 2>/dev/null \
        || { echo "the converter needs torch, numpy and transformers: pip install torch numpy transformers" >&2; exit 1; }
    say "BF16 view of $PACK -> $WORK/$NAME-bf16-hf"
    python3 "$HERE/bench_llamacpp_hf.py" --bf16 "$PACK" "$WORK/$NAME-bf16-hf"
    say "converting to $BF16"
    convert "$WORK/$NAME-bf16-hf" "$BF16"
    rm -rf "$WORK/$NAME-bf16-hf" # an intermediate as large as the GGUF (18 GB for 9b)
    python3 "$HERE/bench_llamacpp_types.py" "$BF16" --expect bf16
}
ENGINES=(kore)
declare -A GGUFS
for q in "${QUANTS[@]}"; do
    out=$WORK/$NAME-$(echo "$q" | tr 'A-Z' 'a-z').gguf
    if [ ! -f "$out" ]; then
        bf16
        say "llama-quantize $BF16 -> $out ($q)"
        "$QUANTIZE" "$BF16" "$out.part" "$q" >"$out.log" 2>&1 || { tail -20 "$out.log" >&2; exit 1; }
        mv "$out.part" "$out"
    fi
    say "GGUF tensor types ($out)"
    python3 "$HERE/bench_llamacpp_types.py" "$out" --expect any
    ENGINES+=("$q"); GGUFS[$q]=$out
done
if [ "${KORE_BENCH_NVFP4:-0}" = 1 ]; then
    GGUF=$WORK/$NAME-nvfp4.gguf
    if [ ! -f "$GGUF" ]; then
        say "ModelOpt view of $PACK -> $WORK/$NAME-modelopt"
        python3 "$HERE/bench_llamacpp_hf.py" "$PACK" "$WORK/$NAME-modelopt"
        say "converting to $GGUF"
        convert "$WORK/$NAME-modelopt" "$GGUF"
    fi
    say "GGUF tensor types ($GGUF)"
    python3 "$HERE/bench_llamacpp_types.py" "$GGUF"
    ENGINES+=(NVFP4); GGUFS[NVFP4]=$GGUF
fi

if [ "$ROUNDS" -eq 0 ]; then
    say "no rounds (ROUNDS=0): llama.cpp is built and the GGUFs are made; nothing was timed"
    exit 0
fi

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
for e in "${ENGINES[@]:1}"; do
    echo "$e $(python3 "$HERE/bench_llamacpp_types.py" "${GGUFS[$e]}" --bytes-per-token)" >>"$OUT/bytes.txt"
done
load() { cut -d' ' -f1-3 /proc/loadavg; }
if [ -n "${KORE_BENCH_DEPTHS:-}" ]; then
    # shellcheck source=scripts/bench_llamacpp_depth.sh
    . "$HERE/bench_llamacpp_depth.sh"
    exit 0
fi
run() { # ENGINE ROUND
    echo "$1 $2 before $(load)" >>"$OUT/load.txt"
    if [ "$1" = kore ]; then
        "$KORE" bench --native --model "$PACK" --threads "$THREADS" --mtp 0 --json \
            2>"$OUT/kore-$2.log" | tail -1 >"$OUT/kore-$2.json"
    else
        "$BENCH" -m "${GGUFS[$1]}" -t "$THREADS" -p 512 -n 128 -r 1 -o json \
            >"$OUT/$1-$2.json" 2>"$OUT/$1-$2.log"
    fi
    echo "$1 $2 after $(load)" >>"$OUT/load.txt"
}
for r in $(seq 1 "$ROUNDS"); do
    order=("${ENGINES[@]}")
    if [ $((r % 2)) -eq 0 ]; then
        order=(); for ((i = ${#ENGINES[@]} - 1; i >= 0; i--)); do order+=("${ENGINES[$i]}"); done
    fi
    say "round $r/$ROUNDS: ${order[*]}"
    for e in "${order[@]}"; do run "$e" "$r"; done
done

python3 - "$OUT" "$ROUNDS" "$THREADS" "${ENGINES[@]}" <<'PY'
import json, statistics, sys
out, rounds, threads, engines = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
llamas = engines[1:]
loads = {}
for line in open(f"{out}/load.txt"):
    eng, r, when, *avg = line.split()
    loads.setdefault((eng, r), {})[when] = avg[0]
nbytes = dict(line.split() for line in open(f"{out}/bytes.txt"))
def load(e, r):
    l = loads[(e, str(r))]
    return f"{l['before']}-{l['after']}"
print(f"threads {threads}; run files in {out}")
print("| round | engine | prefill tok/s | decode tok/s | ours / it: prefill | ours / it: decode | load avg (1 min) |")
print("| --- | --- | --- | --- | --- | --- | --- |")
ratios = {e: ([], []) for e in llamas}
speeds = {e: ([], []) for e in engines}
kbytes, info, gbps = 0, {}, []
for r in range(1, rounds + 1):
    k = json.loads(open(f"{out}/kore-{r}.json").read())
    kp, kd, kbytes = k["prefill_tok_per_s"], k["decode_tok_per_s"], k["weight_bytes_per_step"]
    speeds["kore"][0].append(kp); speeds["kore"][1].append(kd); gbps.append(k["measured_read_gbps"])
    print(f"| {r} | Kore ({k['kernels']}) | {kp:.2f} | {kd:.3f} | | | {load('kore', r)} |")
    for e in llamas:
        ll = json.load(open(f"{out}/{e}-{r}.json"))
        pp = next(x["avg_ts"] for x in ll if x["n_prompt"] > 0 and x["n_gen"] == 0)
        tg = next(x["avg_ts"] for x in ll if x["n_gen"] > 0 and x["n_prompt"] == 0)
        speeds[e][0].append(pp); speeds[e][1].append(tg)
        ratios[e][0].append(kp / pp); ratios[e][1].append(kd / tg)
        info = ll[0]
        print(f"| {r} | llama.cpp {e} | {pp:.2f} | {tg:.3f} | {kp/pp:.3f} | {kd/tg:.3f} | {load(e, r)} |")
print(f"weight bytes per decode step: Kore {int(kbytes) / 1e9:.3f} GB; "
      + "; ".join(f"llama.cpp {e} {int(nbytes[e]) / 1e9:.3f} GB" for e in llamas))
print("host read bandwidth (Kore's probe before each of its rounds, GB/s): "
      + ", ".join(f"{g:.1f}" for g in gbps))
for e in engines:
    p, d = speeds[e]
    print(f"median {e}: prefill {statistics.median(p):.2f} tok/s, decode {statistics.median(d):.3f} tok/s")
for e in llamas:
    p, d = ratios[e]
    print(f"median ratio ours / llama.cpp {e}: prefill {statistics.median(p):.3f}, decode {statistics.median(d):.3f}")
print(f"llama.cpp build: {info.get('build_commit')} ({info.get('cpu_info')})")
PY
