#!/usr/bin/env bash
# Builds the Kore guest images: the ring-0 kernel (soft-float, x86_64-unknown-none) and the
# ring-3 images (kore-test-image, the image the VM tests boot; kore-appliance, the product).
# The ring-3 images are built for x86-64-v2, so one image runs on every x86-64 CPU from
# x86-64-v2 up; kore-engine picks its SIMD kernels (AVX2+FMA, AVX-512, AVX-512 VNNI) at run
# time from CPUID and XCR0, exactly as on the host, and the VMM decides what the guest sees
# (`--guest-cpu`).
# Adds the x86_64-unknown-none target through rustup when it is missing.
# Prints the kernel, test image and appliance ELF paths (one per line).
set -euo pipefail
cd "$(dirname "$0")"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$(pwd)/../target/guest}"

KERNEL_TARGET=x86_64-unknown-none
if ! rustc --print sysroot >/dev/null 2>&1; then
  echo "build.sh: rustc not found: install Rust with rustup (https://rustup.rs)" >&2
  exit 1
fi
sysroot=$(rustc --print sysroot)
if [ ! -d "$sysroot/lib/rustlib/$KERNEL_TARGET/lib" ]; then
  if command -v rustup >/dev/null 2>&1; then
    echo "build.sh: adding the Rust target $KERNEL_TARGET (rustup target add $KERNEL_TARGET)" >&2
    rustup target add "$KERNEL_TARGET" >&2
  else
    echo "build.sh: the Rust target $KERNEL_TARGET is missing and rustup is not on PATH: run \`rustup target add $KERNEL_TARGET\`" >&2
    exit 1
  fi
fi

cargo build --release --quiet -p kore-kernel --target "$KERNEL_TARGET"
cargo build --release --quiet -p kore-test-image -p kore-appliance-image --target x86_64-unknown-linux-gnu \
    --config "target.x86_64-unknown-linux-gnu.rustflags=['-C','target-cpu=x86-64-v2']"
echo "$CARGO_TARGET_DIR/$KERNEL_TARGET/release/kore-kernel"
echo "$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release/kore-test-image"
echo "$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release/kore-appliance"
