#!/usr/bin/env bash
# Kore vs llama.cpp on the same weights and threads, alternating in one run.
#
#   scripts/bench/llamacpp.sh PACK [THREADS] [ROUNDS]
#
# 1. Fetches llama-cpp-python's sdist from PyPI (it bundles llama.cpp and its
#    HF-to-GGUF converter) and builds llama-bench + llama-quantize with CMake
#    (Release, native flags). Slow on 2 cores; run it early with `nice`.
# 2. Makes a Hugging Face view of the pack (config.json from pack.toml, the
#    weights dequantized from NVFP4 to bf16), converts it with
#    convert_hf_to_gguf.py (PyPI `gguf`), quantizes to Q4_0 (4.5 bits/weight,
#    the nearest llama.cpp type to NVFP4's 4.5).
# 3. Alternates `kore-launch bench --native --json` and
#    `llama-bench -p 512 -n 128` ROUNDS times and prints both figures and the ratio.
#
# Work files go to $KORE_BENCH_DIR (default /work/packs/llamacpp), not the repo.
set -euo pipefail

PACK=${1:?usage: llamacpp.sh PACK [THREADS] [ROUNDS]}
THREADS=${2:-2}
ROUNDS=${3:-2}
WORK=${KORE_BENCH_DIR:-/work/packs/llamacpp}
VERSION=0.3.36
REPO=$(cd "$(dirname "$0")/../.." && pwd)
SRC=$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp
NAME=$(basename "$PACK")
mkdir -p "$WORK"

# 1. llama.cpp from the PyPI sdist.
if [ ! -x "$SRC/build/bin/llama-bench" ]; then
    python3 -m pip install -q cmake scikit-build-core
    if [ ! -d "$WORK/llama_cpp_python-$VERSION" ]; then
        python3 -m pip download --no-deps --no-build-isolation --no-binary llama-cpp-python \
            "llama-cpp-python==$VERSION" -d "$WORK"
        tar -xzf "$WORK/llama_cpp_python-$VERSION.tar.gz" -C "$WORK"
    fi
    cmake -S "$SRC" -B "$SRC/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
    cmake --build "$SRC/build" -j"$(nproc)" --target llama-bench llama-quantize
fi
python3 -m pip install -q gguf safetensors numpy sentencepiece

# 2. HF view of the pack (bf16 weights) -> GGUF f16 -> Q4_0.
HF=$WORK/$NAME-hf-bf16
GGUF=$WORK/$NAME-q4_0.gguf
if [ ! -f "$GGUF" ]; then
    python3 "$REPO/scripts/bench/pack_to_hf.py" "$PACK" "$HF" "$WORK/$NAME-view"
    python3 "$SRC/convert_hf_to_gguf.py" "$HF" --outtype bf16 --outfile "$WORK/$NAME-bf16.gguf"
    "$SRC/build/bin/llama-quantize" "$WORK/$NAME-bf16.gguf" "$GGUF" Q4_0 "$THREADS"
    rm -f "$WORK/$NAME-bf16.gguf"
fi

# 3. Alternate both engines.
cargo build --release -p kore-launch --manifest-path "$REPO/Cargo.toml" >/dev/null
KORE=$REPO/target/release/kore-launch
for r in $(seq 1 "$ROUNDS"); do
    echo "== round $r: kore" >&2
    "$KORE" bench --native --model "$WORK/$NAME-view" --threads "$THREADS" --json | tail -1 | tee -a "$WORK/$NAME-kore.jsonl"
    echo "== round $r: llama.cpp" >&2
    "$SRC/build/bin/llama-bench" -m "$GGUF" -t "$THREADS" -p 512 -n 128 -r 1 -o json | tee -a "$WORK/$NAME-llama.json"
done
python3 - "$WORK/$NAME-kore.jsonl" "$WORK/$NAME-llama.json" <<'PY'
import json, re, sys
kore = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
text = open(sys.argv[2]).read()
llama = [x for blk in re.findall(r"\[.*?\]", text, re.S) for x in json.loads(blk)]
def best(xs): return max(xs) if xs else float("nan")
kp, kd = best([k["prefill_tok_per_s"] for k in kore]), best([k["decode_tok_per_s"] for k in kore])
lp = best([x["avg_ts"] for x in llama if x.get("n_prompt", 0) > 0 and x.get("n_gen", 0) == 0])
ld = best([x["avg_ts"] for x in llama if x.get("n_gen", 0) > 0 and x.get("n_prompt", 0) == 0])
print(f"prefill tok/s: kore {kp:.1f}  llama.cpp {lp:.1f}  ratio {kp/lp:.2f}")
print(f"decode  tok/s: kore {kd:.2f}  llama.cpp {ld:.2f}  ratio {kd/ld:.2f}")
PY
