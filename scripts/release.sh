#!/usr/bin/env bash
# Builds the release tarball: kore-launch alone (it carries the VMM binary, the guest images and
# the default pack, embedded by launcher/build.rs), with the README and the user guide.
#
#   bash scripts/release.sh [OUT_DIR]     # default OUT_DIR: target/dist
#
# Prints the tarball's path. Install it anywhere on PATH:
#   tar -xzf kore-launch-VERSION-x86_64-linux.tar.gz && cp kore-launch-*/bin/kore-launch ~/.local/bin/
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/dist}

version=$(cargo metadata --format-version 1 --no-deps --locked \
  | python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "kore-launch"))')
cargo build --release --locked --quiet -p kore-launch
name="kore-launch-$version-$(uname -m)-linux"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/$name/bin" "$stage/$name/docs" "$out"
install -m 0755 target/release/kore-launch "$stage/$name/bin/kore-launch"
install -m 0644 README.md "$stage/$name/README.md"
install -m 0644 docs/user-guide.md "$stage/$name/docs/user-guide.md"
tarball="$out/$name.tar.gz"
tar -C "$stage" --owner=0 --group=0 --sort=name -czf "$tarball" "$name"
echo "$tarball"
