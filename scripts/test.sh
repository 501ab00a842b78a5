#!/usr/bin/env bash
# The project's test command (README): installs what the tests need when it is missing
# (scripts/test_deps.sh), builds everything and runs every test. Tests that need KVM or
# hugepages run here too; as root this script reserves the hugepages they need and lets
# group kvm open /dev/kvm (`kore-launch setup`), as a user of the product would.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase's start with the seconds since this script's (a log shows where the time went).
step() { echo "== [${SECONDS} s] $*"; }

step "test dependencies"
# Python packages, tmux, Chromium + chromedriver (idempotent; quiet when nothing is missing).
bash scripts/test_deps.sh

# Formatting of both workspaces (cheap; fails fast).
cargo fmt --all -- --check
(cd guest-kernel && cargo fmt --all -- --check)

# The confined VMM binary links no HTTP server, async runtime or engine (cargo tree),
# every KORE_* variable in the code is documented (user guide or developer page), and
# no module imports in a circle (scripts/check_imports.py).
bash scripts/check_vmm_deps.sh
bash scripts/check_env_docs.sh
# No import circles between the modules of the engine, the service and the launcher.
python3 scripts/check_imports.py

# Hugepages for the VMM tests (2 MiB pages); harmless when already reserved.
if [ "$(id -u)" = 0 ] && [ -w /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages ]; then
  want=${KORE_TEST_HUGEPAGES:-1024}
  have=$(cat /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages)
  if [ "$have" -lt "$want" ]; then
    echo "$want" > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages
  fi
fi

step "guest kernel: host tests and images"
# Guest kernel (its own workspace): host tests of its pure-logic crates, then the guest
# images (kernel, test image and appliance under target/guest/) that the VM suites boot.
(cd guest-kernel && export CARGO_TARGET_DIR="$PWD/../target/guest" && ./build.sh && cargo test --release --locked)

# The real Qwen3.5 tokenizer.json the tokenizer tests compare against (generated, not committed).
bash scripts/tokenizer/make_qwen_tokenizer.sh

# The prefix cache's disk tier keeps checkpoint files under $XDG_CACHE_HOME/kore: the tests
# below get a fresh one, so none of them reuses what an earlier run left (as on a fresh machine).
XDG_CACHE_HOME="$(mktemp -d -t kore-test-cache.XXXXXX)"
export XDG_CACHE_HOME
trap 'rm -rf "$XDG_CACHE_HOME"' EXIT

# Every Rust test in one build and one run: the unit and integration tests, the tokenizer
# against the real Qwen3.5 tokenizer.json (generated above; feature qwen35-reference), the
# VMM's unit tests that run real vCPUs (kvm-tests) and the end-to-end suites in tests/ (e2e:
# VMs, KVM, hugepages, the guest images, root, tmux). One invocation, one feature set: Cargo
# resolves features from the packages a command selects, and separate `-p` runs (as this
# script did until 2026-12-07) saw different sets (the workspace's dev-dependencies turn on
# serde_json's float_roundtrip, regex's unicode tables, ...), so each compiled the engine
# and the crates around it again.
#
# The kernel agreement tests must have run every SIMD path the kernel's own CPU flags
# (/proc/cpuinfo: a third opinion beside the engine's detection and std's) say this host
# has: AVX-512 VNNI on most of this project's machines, AVX2 only on some AMD EPYC hosts.
# A path the flags name that the tests skipped fails here rather than passing untested.
CPU_FLAGS=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
cpu_has() { [[ $CPU_FLAGS == *" $1 "* ]]; }
required_kernels() {
    local p=""
    cpu_has avx2 && cpu_has fma && cpu_has f16c || return 0
    p=avx2
    if cpu_has avx512f && cpu_has avx512bw && cpu_has avx512vl; then
        p=$p,avx512
        cpu_has avx512_vnni && cpu_has avx512vbmi && p=$p,avx512vnni
    fi
    echo "$p"
}
KORE_REQUIRE_KERNELS=${KORE_REQUIRE_KERNELS:-$(required_kernels)}
echo "== kernel paths the agreement tests must run: ${KORE_REQUIRE_KERNELS:-none}"
#
# The test build leaves out two settings of the release profile (Cargo.toml) that serve the
# binaries users run, not the tests: thin LTO across crates (each of the 102 test binaries
# re-optimized the engine and its dependencies again when it was linked) and debug line
# tables. Optimization level and codegen units stay as they are; the VMM process inherits
# the same overrides, the guest images do not (launcher/build.rs builds them with the guest
# workspace's own profile). `cargo build --release` afterwards builds users' binaries anew.
RUST_TESTS=(env CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_DEBUG=0
    cargo test --workspace --release --locked
    --features kore-e2e/e2e,kore-tokenizer/qwen35-reference,kore-vmm/kvm-tests)
step "building every Rust test (and target/release/kore-launch, which the suites run)"
"${RUST_TESTS[@]}" --no-run
# As root: group kvm may open /dev/kvm (tests/vm/non_root.rs runs as a member), as
# `sudo kore-launch setup` does on a user's host; it prints each change it makes.
if [ "$(id -u)" = 0 ]; then
  target/release/kore-launch setup
fi
step "running every Rust test"
KORE_REQUIRE_KERNELS=$KORE_REQUIRE_KERNELS "${RUST_TESTS[@]}"

step "the official OpenAI and Anthropic clients against kore-launch serve"
# `kore-launch serve` with the official OpenAI client (native and guest) and the web chat in
# headless Chromium, on the default pack; bounded in time (screenshot in target/test-output/openai).
timeout 900 python3 -m pytest -q -p no:cacheprovider tests/openai

step "fuzz targets"
# Every fuzz target for a short run, so regressions surface (installs nightly and cargo-fuzz when
# missing); the hour-long campaigns are recorded in docs/reliability.md.
bash scripts/fuzz.sh all "${KORE_FUZZ_SECONDS:-20}"
step "done"
