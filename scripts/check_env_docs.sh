#!/usr/bin/env bash
# Checks that every KORE_* environment variable named in the code (Rust, shell, Python) is
# documented: user-facing ones in docs/user-guide.md, developer knobs in docs/developer.md.
# Run by scripts/test.sh; fails naming the undocumented ones.
set -euo pipefail
cd "$(dirname "$0")/.."

names=$(git ls-files -- '*.rs' '*.sh' '*.py' | xargs grep -ho 'KORE_[A-Z0-9_]*' \
  | grep -v '_$' | sort -u)
[ -n "$names" ] || { echo "check_env_docs.sh: found no KORE_ names" >&2; exit 1; }
missing=()
for n in $names; do
  grep -q -w -- "$n" docs/user-guide.md docs/developer.md || missing+=("$n")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "check_env_docs.sh: not in docs/user-guide.md or docs/developer.md: ${missing[*]}" >&2
  exit 1
fi
echo "every KORE_* variable in the code is documented ($(echo "$names" | wc -l) names)"
