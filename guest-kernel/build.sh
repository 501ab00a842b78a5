#!/usr/bin/env bash
# Builds the Kore guest images: the ring-0 kernel and the ring-3 boot-test image.
# Prints the kernel and user ELF paths (one per line).
set -euo pipefail
cd "$(dirname "$0")"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$(pwd)/../target/guest}"
cargo build --release --quiet -p kore-kernel --target x86_64-unknown-none
cargo build --release --quiet -p kore-demo --target x86_64-unknown-linux-gnu
echo "$CARGO_TARGET_DIR/x86_64-unknown-none/release/kore-kernel"
echo "$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release/kore-demo"
