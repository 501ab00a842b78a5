#!/usr/bin/env python3
"""Measure how closely a Kore pack (e.g. the NVFP4 `model-packs/tiny`) follows its bf16 source.

Independent of Kore's engine: the pack's `weights.safetensors` is read with `safetensors`,
NVFP4 modules are dequantized here from ModelOpt's definition (FACTS.md: value =
E2M1(code) * E4M3(block scale) * weight_scale_2, low nibble = even column), and both models
run in transformers (`Qwen3_5ForCausalLM`, f32 compute) with train.py's `MTPHead`, teacher-forced
over non-overlapping windows of held-out text. Reports, for the pack relative to the source:
  - trunk top-1 next-token agreement, held-out loss of both
  - MTP top-1 draft agreement (same h[t]/x[t+1] inputs through each model's own trunk)
  - the pack's MTP agreement with its own trunk's greedy next-next token (draft acceptance)

Usage: python3 pack_agreement.py --source model-packs/tiny-hf --pack model-packs/tiny \
           --text heldout.txt [--seq 256] [--json out.json]
"""

import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F
from safetensors import safe_open
from tokenizers import Tokenizer
from transformers import Qwen3_5ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from evaluate import emit_json, load_mtp  # noqa: E402
from train import MTPHead  # noqa: E402

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def nvfp4_modules(pack: str) -> set:
    """Module names listed under [quantization.modules] in pack.toml."""
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomli as tomllib
    with open(os.path.join(pack, "pack.toml"), "rb") as f:
        manifest = tomllib.load(f)
    return {m for m, s in manifest["quantization"].get("modules", {}).items() if s == "nvfp4"}


def dequantize(codes: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """ModelOpt NVFP4 [N, K/2] u8 + [N, K/16] e4m3 + scalar f32 -> [N, K] f32."""
    lo, hi = codes & 0x0F, codes >> 4
    nib = torch.stack([lo, hi], dim=-1).flatten(-2).long()  # even column = low nibble
    mag = E2M1[nib & 7]
    val = torch.where(nib & 8 != 0, -mag, mag)
    block = scales.float().repeat_interleave(16, dim=-1)
    return val * block * global_scale.float()


def pack_state(pack: str) -> dict:
    quant = nvfp4_modules(pack)
    out = {}
    with safe_open(os.path.join(pack, "weights.safetensors"), "pt") as f:
        names = [k for k in f.keys() if not k.startswith("__")]
        for name in names:
            module, _, suffix = name.rpartition(".")
            if module in quant:
                if suffix == "weight":
                    out[name] = dequantize(f.get_tensor(name), f.get_tensor(module + ".weight_scale"),
                                           f.get_tensor(module + ".weight_scale_2"))
                continue  # scales are folded into the weight
            out[name] = f.get_tensor(name).float()
    return out


def load_pair(source: str, pack: str):
    ref = Qwen3_5ForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    ref_mtp = load_mtp(source, ref)
    quant = Qwen3_5ForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    state = pack_state(pack)
    trunk = {k: v for k, v in state.items() if not k.startswith("mtp.")}
    missing, unexpected = quant.load_state_dict(trunk, strict=False)
    if unexpected or any(not k.endswith("rotary_emb.inv_freq") for k in missing):
        raise SystemExit(f"pack tensors do not match the model: missing {missing}, unexpected {unexpected}")
    quant_mtp = MTPHead(quant.config)
    quant_mtp.load_state_dict({k[4:]: v for k, v in state.items() if k.startswith("mtp.")}, strict=True)
    return (ref, ref_mtp), (quant, quant_mtp.eval())


@torch.no_grad()
def run(model, mtp, inp):
    h = model.model(input_ids=inp, use_cache=False).last_hidden_state
    logits = model.lm_head(h).float()
    t = h.shape[1] - 1
    pos = torch.arange(t).view(1, 1, -1).expand(3, 1, -1)
    m = mtp(model.model.embed_tokens(inp[:, 1:]), h[:, :t], model.model.rotary_emb(h, pos))
    return logits, model.lm_head(m).float()


def measure(ref, quant, ids: list, seq: int) -> dict:
    n = (len(ids) - 1) // seq
    c = dict(tok=0, agree=0, loss_ref=0.0, loss_q=0.0, mtp_n=0, mtp_agree=0, acc_ref=0, acc_q=0)
    for i in range(n):
        x = torch.tensor(ids[i * seq : i * seq + seq + 1])[None]
        inp, tgt = x[:, :-1], x[:, 1:]
        lr, mr = run(*ref, inp)
        lq, mq = run(*quant, inp)
        gr, gq = lr.argmax(-1), lq.argmax(-1)
        c["tok"] += tgt.numel()
        c["agree"] += (gr == gq).sum().item()
        c["loss_ref"] += F.cross_entropy(lr[0], tgt[0], reduction="sum").item()
        c["loss_q"] += F.cross_entropy(lq[0], tgt[0], reduction="sum").item()
        dr, dq = mr.argmax(-1), mq.argmax(-1)
        c["mtp_n"] += dr.numel()
        c["mtp_agree"] += (dr == dq).sum().item()
        c["acc_ref"] += (dr == gr[:, 1:]).sum().item()
        c["acc_q"] += (dq == gq[:, 1:]).sum().item()
    r = lambda v: round(v, 4)  # noqa: E731
    return {
        "windows": n,
        "positions": c["tok"],
        "trunk_top1_agreement": r(c["agree"] / c["tok"]),
        "loss_source": r(c["loss_ref"] / c["tok"]),
        "loss_pack": r(c["loss_q"] / c["tok"]),
        "ppl_source": round(math.exp(c["loss_ref"] / c["tok"]), 2),
        "ppl_pack": round(math.exp(c["loss_q"] / c["tok"]), 2),
        "mtp_positions": c["mtp_n"],
        "mtp_top1_agreement": r(c["mtp_agree"] / c["mtp_n"]),
        "mtp_vs_own_trunk_source": r(c["acc_ref"] / c["mtp_n"]),
        "mtp_vs_own_trunk_pack": r(c["acc_q"] / c["mtp_n"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", required=True, help="bf16 Hugging Face directory")
    ap.add_argument("--pack", required=True, help="Kore pack directory imported from --source")
    ap.add_argument("--text", required=True, nargs="+", help="held-out text file(s)")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    tok = Tokenizer.from_file(os.path.join(args.pack, "tokenizer.json"))
    ref, quant = load_pair(args.source, args.pack)
    result = {"pack": args.pack, "nvfp4_modules": len(nvfp4_modules(args.pack)), "texts": {}}
    for path in args.text:
        text = open(path, encoding="utf-8").read().replace("\r\n", "\n")
        ids = tok.encode(text, add_special_tokens=False).ids
        result["texts"][os.path.basename(path)] = measure(ref, quant, ids, min(args.seq, len(ids) - 1))
    emit_json(result, args.json)


if __name__ == "__main__":
    main()
