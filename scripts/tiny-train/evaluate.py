#!/usr/bin/env python3
"""Check an exported tiny model with transformers and measure it on held-out text.

Reloads the Hugging Face directory written by train.py with `Qwen3_5ForCausalLM` and
`AutoTokenizer` (weights in bf16, computed in f32), then reports:
  - tokenizer check: AutoTokenizer and the raw tokenizers.Tokenizer agree on sample text
  - held-out trunk loss and perplexity over non-overlapping windows of val.bin
  - trunk top-1 accuracy on the next token
  - MTP head (read from the `mtp.*` tensors): top-1 agreement of argmax MTP(h[t], x[t+1])
    with the trunk's own greedy prediction at t+1 (what a speculative draft must match),
    and its top-1 accuracy against the real x[t+2]
  - greedy continuations of a few prompts (transformers generate, with its cache)

Usage: python3 evaluate.py --model /work/tiny-hf --data /work/tiny-data [--json out.json]
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from tokenizers import Tokenizer
from transformers import AutoTokenizer, Qwen3_5ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train import MTPHead  # noqa: E402

PROMPTS = [
    "ROMEO.\nBut soft, what light",
    "HAMLET.\nTo be, or not to be,",
    "KING.\nMy lord, the",
    "First Citizen.\nBefore we proceed any further, hear me speak.\n\nAll.\n",
]


def load_mtp(model_dir: str, model: Qwen3_5ForCausalLM) -> MTPHead:
    mtp = MTPHead(model.config)
    state = {}
    with safe_open(os.path.join(model_dir, "model.safetensors"), "pt") as f:
        for key in f.keys():
            if key.startswith("mtp."):
                state[key[len("mtp."):]] = f.get_tensor(key).float()
    missing, unexpected = mtp.load_state_dict(state, strict=True), None
    del missing, unexpected
    return mtp.eval()


def check_tokenizer(model_dir: str) -> dict:
    raw = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(model_dir)
    samples = [
        "O Romeo, Romeo! wherefore art thou Romeo?\nDeny thy father, and refuse thy name;",
        "  Enter   KING HENRY, 1234 caf\u00e9 na\u0308ive \u00c6sop's 'tis we'll I'LL\r\n\n\tend",
        "<|im_start|>user\nSpeak.<|im_end|>\n<|im_start|>assistant\n<think>\n",
        "xq\u0307y a\u0303\u0331b 3.14 'S",  # combining marks NFC cannot compose
    ]
    mismatches = 0
    for s in samples:
        a = raw.encode(s, add_special_tokens=False).ids
        b = auto(s, add_special_tokens=False)["input_ids"]
        mismatches += int(a != b)
        if raw.decode(a, skip_special_tokens=False) != s and "\u0308" not in s:
            mismatches += 1
    chat = auto.apply_chat_template([{"role": "user", "content": "Speak."}], tokenize=False,
                                    add_generation_prompt=True)
    return {"samples": len(samples), "mismatches": mismatches, "chat_prompt": chat,
            "tokenizer_class": type(auto).__name__}


@torch.no_grad()
def measure(model, mtp, val: np.ndarray, seq: int, max_windows: int = 0) -> dict:
    n = (val.size - 1) // seq
    if max_windows:
        n = min(n, max_windows)
    loss_sum, tok = 0.0, 0
    trunk_correct = 0
    agree, mtp_correct, mtp_n = 0, 0, 0
    for i in range(n):
        x = torch.from_numpy(val[i * seq : i * seq + seq + 1].astype(np.int64))[None]
        inp, tgt = x[:, :-1], x[:, 1:]
        out = model.model(input_ids=inp, use_cache=False)
        h = out.last_hidden_state
        logits = model.lm_head(h).float()
        loss_sum += F.cross_entropy(logits[0], tgt[0], reduction="sum").item()
        tok += tgt.numel()
        greedy = logits.argmax(-1)  # greedy[t] predicts x[t+1]
        trunk_correct += (greedy == tgt).sum().item()
        t = seq - 1
        pos = torch.arange(t).view(1, 1, -1).expand(3, 1, -1)
        rope = model.model.rotary_emb(h, pos)
        m = mtp(model.model.embed_tokens(inp[:, 1:]), h[:, :t], rope)
        draft = model.lm_head(m).float().argmax(-1)  # draft[t] predicts x[t+2]
        agree += (draft == greedy[:, 1:]).sum().item()
        mtp_correct += (draft == tgt[:, 1:]).sum().item()
        mtp_n += draft.numel()
    loss = loss_sum / tok
    return {
        "val_windows": n,
        "val_tokens_scored": tok,
        "val_loss": round(loss, 4),
        "val_ppl": round(math.exp(loss), 2),
        "trunk_top1_acc": round(trunk_correct / tok, 4),
        "mtp_positions": mtp_n,
        "mtp_agree_with_trunk_next_next": round(agree / mtp_n, 4),
        "mtp_top1_acc_vs_truth": round(mtp_correct / mtp_n, 4),
    }


@torch.no_grad()
def samples(model, tok, max_new: int) -> list:
    outs = []
    for p in PROMPTS:
        enc = tok(p, return_tensors="pt", add_special_tokens=False)
        gen = model.generate(**enc, max_new_tokens=max_new, do_sample=False, eos_token_id=None,
                             pad_token_id=tok.pad_token_id)
        outs.append({"prompt": p, "continuation": tok.decode(gen[0, enc["input_ids"].shape[1]:])})
    return outs


def emit_json(result: dict, path) -> None:
    """Prints `result` as JSON and, when `path` is given, writes it there too."""
    text = json.dumps(result, indent=2, ensure_ascii=False)
    print(text)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--max-new", type=int, default=60)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--max-windows", type=int, default=0, help="limit held-out windows (0: all)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)

    tok_check = check_tokenizer(args.model)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = Qwen3_5ForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    mtp = load_mtp(args.model, model)
    val = np.fromfile(os.path.join(args.data, "val.bin"), dtype=np.uint16)
    t0 = time.time()
    metrics = measure(model, mtp, val, args.seq, args.max_windows)
    print(f"measured in {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    t0 = time.time()
    outs = samples(model, tok, args.max_new)
    print(f"generated in {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    emit_json({"tokenizer": tok_check, **metrics, "samples": outs}, args.json)


if __name__ == "__main__":
    main()
