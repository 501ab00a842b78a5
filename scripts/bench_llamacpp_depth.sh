# Depth mode of scripts/bench_llamacpp.sh (sourced by it when KORE_BENCH_DEPTHS is set; it
# has set KORE, BENCH, PACK, THREADS, ROUNDS, ENGINES, GGUFS, OUT, HERE and load()).
#
# Per round, per test (each depth D of KORE_BENCH_DEPTHS, then the long prompt of
# KORE_BENCH_LONG_PROMPT if set), the engines in alternating order:
#   Kore:      KORE_BENCH_DEPTH=D KORE_BENCH_PROMPT_TOKENS=512 KORE_BENCH_DECODE_TOKENS=128
#              kore-launch bench --native --json      (prefill 512 @ D, decode @ D + 512)
#   llama.cpp: llama-bench -p 512 -n 128 -d D -r 1    (pp512 @ dD, tg128 @ dD)
#   long:      Kore prompt N, 4 decode steps; llama-bench -p N -n 0 -r 1 --no-warmup
# With KORE_BENCH_DEPTH_PREFILL=0 llama.cpp runs only tg128 @ dD for D > 0 (`-p 0`): it then
# prefills the D positions once, not twice (at D = 32768 on 2b and 2 cores: 14 minutes a GGUF on
# an AVX-512 EPYC host, 35-42 on an AVX2-only Zen 1 one; docs/benchmarks.md).
# then bench_llamacpp_depth.py prints the tables.

DEPTHS=${KORE_BENCH_DEPTHS//,/ }
LONG=${KORE_BENCH_LONG_PROMPT:-0}
run_depth() { # ENGINE ROUND TEST (dD or pN)
    local e=$1 r=$2 t=$3 d=0 p=512 n=128
    case $t in
        d*) d=${t#d} ;;
        p*) p=${t#p}; n=0 ;;
    esac
    echo "$e $r $t before $(load)" >>"$OUT/load.txt"
    if [ "$e" = kore ]; then
        local kn=$n extra=()
        [ "$kn" = 0 ] && kn=4
        [ "$d" != 0 ] && extra=(KORE_BENCH_DEPTH="$d")
        env "${extra[@]}" KORE_BENCH_PROMPT_TOKENS="$p" KORE_BENCH_DECODE_TOKENS="$kn" \
            "$KORE" bench --native --model "$PACK" --threads "$THREADS" --mtp 0 --json \
            2>"$OUT/kore-$t-$r.log" | tail -1 >"$OUT/kore-$t-$r.json"
    else
        local lp=$p
        [ "$d" != 0 ] && [ "${KORE_BENCH_DEPTH_PREFILL:-1}" = 0 ] && lp=0
        # The long prompt without llama-bench's warm-up pass: it would prefill all N
        # tokens once more (minutes), and a minutes-long run needs no warming.
        local warm=()
        [ "$n" = 0 ] && warm=(--no-warmup)
        "$BENCH" -m "${GGUFS[$e]}" -t "$THREADS" -p "$lp" -n "$n" -d "$d" -r 1 -o json \
            "${warm[@]}" >"$OUT/$e-$t-$r.json" 2>"$OUT/$e-$t-$r.log"
    fi
    echo "$e $r $t after $(load)" >>"$OUT/load.txt"
}
TESTS=()
for d in $DEPTHS; do TESTS+=("d$d"); done
[ "$LONG" != 0 ] && TESTS+=("p$LONG")
for r in $(seq 1 "$ROUNDS"); do
    for t in "${TESTS[@]}"; do
        order=("${ENGINES[@]}")
        if [ $((r % 2)) -eq 0 ]; then
            order=(); for ((i = ${#ENGINES[@]} - 1; i >= 0; i--)); do order+=("${ENGINES[$i]}"); done
        fi
        say "round $r/$ROUNDS, $t: ${order[*]}"
        for e in "${order[@]}"; do run_depth "$e" "$r" "$t"; done
    done
done
python3 "$HERE/bench_llamacpp_depth.py" "$OUT" "$ROUNDS" "$THREADS" "$PACK" "${KORE_KV:-f16}" \
    "${TESTS[*]}" "${ENGINES[@]}"
