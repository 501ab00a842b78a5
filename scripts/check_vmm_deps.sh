#!/usr/bin/env bash
# Checks that the confined VMM process (package kore-vmm-process, binary kore-vmm) links only
# the VMM and its sandbox: no HTTP server, no async runtime, no engine, no launcher code.
# Run by scripts/test.sh; fails naming the offending packages.
set -euo pipefail
cd "$(dirname "$0")/.."

deps=$(cargo tree --locked -p kore-vmm-process -e normal --prefix none \
  | awk '{print $1}' | sort -u)
[ -n "$deps" ] || { echo "check_vmm_deps.sh: cargo tree printed nothing" >&2; exit 1; }

bad=$(echo "$deps" | grep -E -x 'axum|axum-core|tokio|tokio-.*|hyper|hyper-.*|tower|tower-.*|futures-.*|mio|kore-engine|kore-service|kore-appliance|kore-tokenizer|kore-pack|kore-pack-format|kore-launch|indicatif|clap' || true)
ours=$(echo "$deps" | grep -E '^kore-' | grep -v -x -E 'kore-vmm|kore-vmm-process|kore-boot-abi' || true)
if [ -n "$bad$ours" ]; then
  echo "check_vmm_deps.sh: kore-vmm-process must link only the VMM; it pulls in:" \
    $(printf '%s\n' $bad $ours | sort -u) >&2
  exit 1
fi
echo "kore-vmm-process links $(echo "$deps" | wc -l) packages, none of them a server, runtime or engine"
