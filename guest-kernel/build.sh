#!/usr/bin/env bash
# Builds the Kore guest images: the ring-0 kernel (soft-float) and the ring-3 images
# (kore-demo, the boot-test image; kore-appliance, the product), both with AVX-512 code
# generation (ring 3 runs it natively; the VMM exposes the host's AVX-512 CPUID bits).
# Prints the kernel, demo and appliance ELF paths (one per line).
set -euo pipefail
cd "$(dirname "$0")"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$(pwd)/../target/guest}"
# x86-64-v4 = AVX-512 F/BW/CD/DQ/VL; plus the extensions this machine class has.
USER_FEATURES="+avx512vnni,+avx512bf16,+avx512vbmi,+f16c,+fma"
cargo build --release --quiet -p kore-kernel --target x86_64-unknown-none
cargo build --release --quiet -p kore-demo -p kore-appliance-image --target x86_64-unknown-linux-gnu \
    --config "target.x86_64-unknown-linux-gnu.rustflags=['-C','target-cpu=x86-64-v4','-C','target-feature=$USER_FEATURES']"
echo "$CARGO_TARGET_DIR/x86_64-unknown-none/release/kore-kernel"
echo "$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release/kore-demo"
echo "$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release/kore-appliance"
