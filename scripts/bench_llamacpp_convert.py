#!/usr/bin/env python3
"""Run llama.cpp's bundled convert_hf_to_gguf.py on a Kore pack's HF directory.

    bench_llamacpp_convert.py LLAMA_CPP_DIR HF_DIR [convert_hf_to_gguf.py arguments...]

The converter runs unchanged (its ModelOpt NVFP4 path, tensor mapping, V-head
reordering and metadata) except for two tokenizer details that a synthetic pack
trips over and that a speed benchmark does not use (llama-bench feeds token ids):

1. The pre-tokenizer is identified by hashing the token ids of a test string.
   A pack whose tokenizer.json has Qwen3.5's split regex but not its vocabulary
   (`pack synth` writes a byte-only vocabulary) hashes to an unknown value; then
   the pre-tokenizer is named `qwen35`, which is that regex. Any other regex
   still fails as upstream does.
2. A byte-only BPE vocabulary has no merges, and GGUF cannot hold an empty merge
   list while llama.cpp refuses a BPE vocabulary without one. Then a single merge
   that can never fire (`ĠĠĠ ĠĠĠ`: neither half is ever formed, since no merge
   builds `ĠĠĠ`) is written, so llama.cpp tokenizes byte-wise, as the pack does.

Both substitutions are logged. A real Qwen3.5 tokenizer triggers neither.
"""
import json
import logging
import runpy
import sys
from pathlib import Path

QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
INERT_MERGE = "\u0120\u0120\u0120 \u0120\u0120\u0120"
log = logging.getLogger("kore-convert")


def split_regexes(tokenizer_json):
    """Every Split regex of the tokenizer.json's pre-tokenizer."""
    pre = json.load(open(tokenizer_json, encoding="utf-8")).get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", [pre])
    return [p.get("pattern", {}).get("Regex") for p in parts if p.get("type") == "Split"]


def patch(llama_dir, hf_dir):
    sys.path.insert(0, str(llama_dir / "gguf-py"))
    sys.path.insert(0, str(llama_dir))
    import gguf
    from conversion import base

    upstream_pre = base.TextModel.get_vocab_base_pre
    is_qwen35_split = split_regexes(hf_dir / "tokenizer.json") == [QWEN35_SPLIT]

    def vocab_base_pre(self, tokenizer):
        try:
            return upstream_pre(self, tokenizer)
        except NotImplementedError:
            if not is_qwen35_split:
                raise
            log.warning("unknown tokenizer hash, but the split regex is Qwen3.5's: pre-tokenizer 'qwen35'")
            return "qwen35"

    base.TextModel.get_vocab_base_pre = vocab_base_pre

    upstream_add = gguf.SpecialVocab.add_to_gguf

    def add_to_gguf(self, gw, quiet=False):
        if self.load_merges and not self.merges:
            log.warning("the vocabulary has no merges (byte-only): writing one inert merge %r", INERT_MERGE)
            self.merges = [INERT_MERGE]
        return upstream_add(self, gw, quiet)

    gguf.SpecialVocab.add_to_gguf = add_to_gguf


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__.split("\n\n")[1].strip())
    llama_dir, hf_dir = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    logging.basicConfig(level=logging.INFO)
    patch(llama_dir, hf_dir)
    script = llama_dir / "convert_hf_to_gguf.py"
    sys.argv = [str(script), str(hf_dir), *sys.argv[3:]]
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
