#!/usr/bin/env bash
# Runs the cargo-fuzz targets of fuzz/ (every parser of untrusted input; docs/reliability.md).
#
#   scripts/fuzz.sh TARGET SECONDS   fuzz one target for SECONDS
#   scripts/fuzz.sh all SECONDS      every target for SECONDS, one per core at a time (CI's)
#   scripts/fuzz.sh list             the targets
#
# The committed seeds are fuzz/corpus/TARGET (read only); what a run finds is kept in
# target/fuzz-corpus/TARGET, so a campaign resumes where the last stopped. A crash leaves its
# input in target/fuzz-artifacts/TARGET and makes the script exit non-zero; reproduce it with
#   cd fuzz && cargo +nightly fuzz run TARGET ../target/fuzz-artifacts/TARGET/crash-...
# Each run prints one summary line: target, seconds, executions, coverage (cov: edges,
# ft: features), corpus entries, crashes, slow units, and its log
# (target/fuzz-logs/TARGET-TIME-PID.log). A slow unit (an input that ran over 10 s of wall
# time, kept as slow-unit-*) is reported but does not fail the run: a campaign paused with
# SIGSTOP leaves one behind; rerun it (command above) to see whether it is slow on its own.
#
# Needs a nightly toolchain (libFuzzer's instrumentation flags) and cargo-fuzz: installed when
# missing (KORE_FUZZ_TOOLCHAIN, default `nightly`). Run several targets at once by starting
# the script once per target. KORE_FUZZ_RSS_MB is the memory limit of
# one input (default 2048: more counts as a crash, e.g. an allocation sized by the input).
# KORE_FUZZ_TIMEOUT_S is libFuzzer's per-input timeout (default 20 s, wall clock: raise it
# when the campaign may be paused with SIGSTOP, or a paused input is reported as a timeout).
# KORE_FUZZ_CLOCK=cpu makes SECONDS the fuzzer's CPU time (user + system, with the children it
# has reaped: LeakSanitizer's leak checks run in a forked tracer) instead of wall
# time, for campaigns that share the cores: the run ends with SIGINT (libFuzzer's final
# stats) once the fuzzer process has used that much. Every summary line gives the CPU time.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
TOOLCHAIN=${KORE_FUZZ_TOOLCHAIN:-nightly}
TARGETS=$(sed -n 's/^name = "\([a-z_]*\)"$/\1/p' "$REPO/fuzz/Cargo.toml" | grep -v '^kore-fuzz$' || true)

usage() { echo "usage: scripts/fuzz.sh (TARGET|all) SECONDS | list" >&2; exit 2; }
[ $# -ge 1 ] || usage
if [ "$1" = list ]; then echo "$TARGETS"; exit 0; fi
[ $# -eq 2 ] || usage
WHAT=$1 SECONDS_EACH=$2
[[ "$SECONDS_EACH" =~ ^[0-9]+$ ]] || usage
if [ "$WHAT" != all ] && ! grep -qx "$WHAT" <<<"$TARGETS"; then
    echo "unknown fuzz target '$WHAT'; targets: $(echo $TARGETS)" >&2
    exit 2
fi

if ! rustup run "$TOOLCHAIN" rustc -V >/dev/null 2>&1; then
    echo "== installing the $TOOLCHAIN toolchain (libFuzzer needs it)" >&2
    rustup toolchain install "$TOOLCHAIN" --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

cd "$REPO/fuzz"
export CARGO_TARGET_DIR="$REPO/target/fuzz-build"
echo "== building the fuzz targets ($TOOLCHAIN, AddressSanitizer)" >&2
cargo "+$TOOLCHAIN" fuzz build -O 2>&1 | { grep -Ev '^\s+(Compiling|Checking)' || true; } >&2

# descendant PID NAME: the first process below PID whose command is NAME (comm keeps 15 bytes).
descendant() {
    local c
    for c in $(pgrep -P "$1"); do
        if [ "$(cat "/proc/$c/comm" 2>/dev/null)" = "${2:0:15}" ]; then echo "$c"; return 0; fi
        descendant "$c" "$2" && return 0
    done
    return 1
}

run_one() {
    local t=$1 secs=$2
    local corpus="$REPO/target/fuzz-corpus/$t" seeds="$REPO/fuzz/corpus/$t"
    # One log per run: two runs of a target at once (a long campaign beside a short check)
    # must not write into each other's log.
    local artifacts="$REPO/target/fuzz-artifacts/$t"
    local log="$REPO/target/fuzz-logs/$t-$(date -u +%Y%m%dT%H%M%SZ)-$$.log"
    mkdir -p "$corpus" "$seeds" "$artifacts" "$(dirname "$log")"
    # count [!] : the artifacts that are (or with ! are not) slow units.
    count() { find "$artifacts" -type f "$@" -name 'slow-unit-*' | wc -l; }
    local before slow_before
    before=$(count !) slow_before=$(count)
    local status=0 wall=$secs cpu_budget=0
    # A CPU budget: libFuzzer's own (wall) limit is set far away and the watcher below ends it.
    if [ "${KORE_FUZZ_CLOCK:-wall}" = cpu ]; then cpu_budget=$secs wall=$((secs * 1000)); fi
    cargo "+$TOOLCHAIN" fuzz run -O "$t" "$corpus" "$seeds" -- \
        -max_total_time="$wall" -timeout="${KORE_FUZZ_TIMEOUT_S:-20}" -rss_limit_mb="${KORE_FUZZ_RSS_MB:-2048}" -print_final_stats=1 \
        -artifact_prefix="$artifacts/" >"$log" 2>&1 &
    local cargo_pid=$! fuzzer="" cpu=0 interrupted=0
    # The fuzzer runs below this run's cargo (another run of the same target may be going
    # on beside it); its CPU time is read from /proc while it runs, with its reaped children's
    # (`http_api` spent most of its first minutes in LeakSanitizer's tracer processes).
    while kill -0 "$cargo_pid" 2>/dev/null; do
        sleep 2
        [ -n "$fuzzer" ] || fuzzer=$(descendant "$cargo_pid" "$t" || true)
        [ -n "$fuzzer" ] && [ -r "/proc/$fuzzer/stat" ] || continue
        cpu=$(awk -v hz="$(getconf CLK_TCK)" '{ print int(($14 + $15 + $16 + $17) / hz) }' "/proc/$fuzzer/stat" 2>/dev/null || echo "$cpu")
        if [ "$cpu_budget" -gt 0 ] && [ "$cpu" -ge "$cpu_budget" ] && [ "$interrupted" = 0 ]; then
            kill -INT "$fuzzer" 2>/dev/null || true
            interrupted=1
        fi
    done
    wait "$cargo_pid" || status=$?
    # libFuzzer exits 72 after the SIGINT that ended a CPU-time budget.
    if [ "$interrupted" = 1 ] && grep -q 'libFuzzer: run interrupted' "$log"; then status=0; fi
    local crashes=$(( $(count !) - before )) slow=$(( $(count) - slow_before ))
    local last execs
    last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
    execs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{s += $2} END {print s + 0}')
    echo "fuzz $t: ${secs}s (${KORE_FUZZ_CLOCK:-wall}), CPU ${cpu}s, executions $execs, $(sed -E 's/^#[0-9]+[[:space:]]+[A-Za-z]+[[:space:]]+//; s/[[:space:]]+(lim|exec\/s|rss|L|MS):.*//' <<<"$last"), crashes $crashes, slow units $slow (log $log)"
    if [ "$status" -ne 0 ] || [ "$crashes" -gt 0 ]; then
        grep -E 'ERROR|panicked|Test unit written' "$log" | head -5 >&2 || true
        return 1
    fi
}

# `all` runs KORE_FUZZ_JOBS targets at a time (default: one per core; each fuzzer is one
# process on one core), so CI's short run takes SECONDS x targets / jobs. One at a time (one
# target, or KORE_FUZZ_JOBS=1) runs in the foreground, as a long campaign wants.
failed=0
jobs=${KORE_FUZZ_JOBS:-$(nproc)}
[ "$WHAT" = all ] || jobs=1
if [ "$jobs" -le 1 ]; then
    for t in $( [ "$WHAT" = all ] && echo $TARGETS || echo "$WHAT" ); do
        run_one "$t" "$SECONDS_EACH" || failed=1
    done
    exit $failed
fi

# A script's background jobs ignore SIGINT, so on INT or TERM it ends their process trees
# itself (no fuzzer outlives a Ctrl-C).
kill_tree() {
    local c
    for c in $(pgrep -P "$1"); do kill_tree "$c"; done
    kill -TERM "$1" 2>/dev/null || true
}
trap 'for p in $(jobs -p); do kill_tree "$p"; done; exit 130' INT TERM
running=0
for t in $TARGETS; do
    if [ "$running" -ge "$jobs" ]; then
        wait -n || failed=1
        running=$((running - 1))
    fi
    # `|| exit 1`: run_one runs as it does in the foreground, without errexit (its checks
    # decide the status), in a subshell of its own.
    ( run_one "$t" "$SECONDS_EACH" || exit 1 ) &
    running=$((running + 1))
done
while [ "$running" -gt 0 ]; do
    wait -n || failed=1
    running=$((running - 1))
done
exit $failed
