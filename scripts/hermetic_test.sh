#!/usr/bin/env bash
# Shows that `cargo test --workspace` is hermetic: runs it on a copy of the
# committed tree (the checkout must be clean) as an unprivileged user (not in group kvm), in private mount and network
# namespaces where /dev holds no kvm, there is no network, and python3 and tmux
# are replaced by `false`. Run as root (it creates the user `kore-hermetic`).
#
#   bash scripts/hermetic_test.sh [--reuse-target]
#
# --reuse-target copies this checkout's target/release first, so only what
# differs from it is rebuilt (the copy keeps file times and is mounted at this
# checkout's path, so Cargo's fingerprints match). Without it the build starts cold.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
[ "$(id -u)" = 0 ] || { echo "hermetic_test.sh: run as root (it switches to an unprivileged user)" >&2; exit 2; }
user=kore-hermetic
id "$user" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$user"
if id -nG "$user" | tr ' ' '\n' | grep -qx kvm; then
  echo "hermetic_test.sh: $user must not be in group kvm" >&2; exit 2
fi
cargo_home=${CARGO_HOME:-$HOME/.cargo}
rustup_home=${RUSTUP_HOME:-$HOME/.rustup}

work=$(mktemp -d /tmp/kore-hermetic.XXXXXX)
trap 'rm -rf "$work"' EXIT
if [ -n "$(git -C "$repo" status --porcelain)" ]; then
  echo "hermetic_test.sh: commit or stash first (it tests the committed tree)" >&2; exit 2
fi
mkdir -p "$work/repo"
(cd "$repo" && git ls-files -z | xargs -0 cp -a --parents -t "$work/repo")
if [ "${1:-}" = --reuse-target ] && [ -d "$repo/target/release" ]; then
  mkdir -p "$work/repo/target" && cp -a "$repo/target/release" "$work/repo/target/"
fi
mkdir -p "$work/cargo" "$work/home" "$work/dev" "$work/rustup"
cp -a "$cargo_home/bin" "$cargo_home/registry" "$work/cargo/"
chown -R "$user:" "$work/repo" "$work/cargo" "$work/home"
chmod 755 "$work"

# Inside: the clone at this checkout's path, CARGO_HOME and RUSTUP_HOME at their usual paths,
# a minimal /dev without kvm, no python3 or tmux, no network; then drop to the user.
unshare --mount --net --propagation private bash -euo pipefail -c '
  work=$1 repo=$2 cargo_home=$3 rustup_home=$4 user=$5
  mount --bind /dev "$work/dev"
  mount -t tmpfs -o mode=755 devtmp /dev
  for d in null zero full random urandom tty; do
    touch "/dev/$d" && mount --bind "$work/dev/$d" "/dev/$d"
  done
  mkdir -p /dev/shm /dev/pts && mount -t tmpfs -o mode=1777 shm /dev/shm
  ln -s /proc/self/fd /dev/fd
  mount --bind "$rustup_home" "$work/rustup"
  mount --bind "$work/repo" "$repo"
  if [ "$cargo_home" = /root/.cargo ] || [ "$rustup_home" = /root/.rustup ]; then
    mount -t tmpfs -o mode=755 roothome /root
    mkdir -p /root/.cargo /root/.rustup
  fi
  mkdir -p "$cargo_home" "$rustup_home"
  mount --bind "$work/cargo" "$cargo_home"
  mount --bind -o ro "$work/rustup" "$rustup_home"
  for tool in python3 python3.11 tmux; do
    [ -e "/usr/bin/$tool" ] && mount --bind /bin/false "/usr/bin/$tool"
  done
  test ! -e /dev/kvm
  cd "$repo"
  exec setpriv --reuid="$user" --regid="$user" --clear-groups --no-new-privs \
    env -i PATH="$cargo_home/bin:/usr/bin:/bin" HOME="$work/home" CARGO_HOME="$cargo_home" \
    RUSTUP_HOME="$rustup_home" TMPDIR="$work/home" \
    bash -c "id; ls /dev; cargo test --workspace --release --locked --offline --no-fail-fast"
' bash "$work" "$repo" "$cargo_home" "$rustup_home" "$user"
