#!/usr/bin/env python3
"""Train Kore's tiny default model: a small Qwen3.5 text model plus one MTP layer.

The trunk is transformers' `Qwen3_5ForCausalLM` (model_type `qwen3_5_text`, Gated DeltaNet
and gated full-attention layers). The MTP head follows Qwen3.5's layout (vLLM
`qwen3_5_mtp.py`, llama.cpp `qwen35`): for position t,

    u = mtp.fc(concat(mtp.pre_fc_norm_embedding(embed(x[t+1])), mtp.pre_fc_norm_hidden(h[t])))
    logits(x[t+2]) = lm_head(mtp.norm(mtp.layers.0(u)))

where h[t] is the trunk's final *normed* hidden state, mtp.layers.0 is a full-attention
decoder layer shaped like the trunk's (own causal attention over the MTP sequence, RoPE
position t) and embed/lm_head are shared with the trunk. Trunk and MTP train jointly:
loss = CE(trunk, x[t+1]) + mtp_weight * CE(mtp, x[t+2]).

The run is budgeted by wall-clock time: the learning-rate schedule (linear warmup, cosine
to 10%) follows elapsed/budget, and training stops when the budget is spent. A checkpoint
is written every --ckpt-minutes; --resume continues from it. At the end the model is
exported as a Hugging Face directory (see export.py).

Usage:
  python3 train.py --data /work/tiny-data --out /work/tiny-hf --minutes 75
"""

import argparse
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm


def make_config(vocab_size: int, ids: dict) -> Qwen3_5TextConfig:
    """The tiny model's architecture (Qwen3.5 shapes scaled down)."""
    n_layers = 8
    return Qwen3_5TextConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=n_layers,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        linear_num_key_heads=4,
        linear_num_value_heads=8,
        hidden_act="silu",
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
        attention_bias=False,
        attention_dropout=0.0,
        initializer_range=0.02,
        bos_token_id=None,
        eos_token_id=ids["<|endoftext|>"],
        pad_token_id=ids["<|endoftext|>"],
        mtp_num_hidden_layers=1,
        mtp_use_dedicated_embeddings=False,
    )


class MTPHead(nn.Module):
    """Qwen3.5's multi-token-prediction layer; parameter names match `mtp.*` checkpoints."""

    def __init__(self, config: Qwen3_5TextConfig):
        super().__init__()
        h = config.hidden_size
        full_idx = config.layer_types.index("full_attention")
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(h, eps=config.rms_norm_eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(h, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(config, full_idx)])
        self.norm = Qwen3_5RMSNorm(h, eps=config.rms_norm_eps)
        std = config.initializer_range
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, mean=0.0, std=std)

    def forward(self, next_embeds, hidden, position_embeddings):
        """next_embeds = embed(x[t+1]), hidden = normed trunk state h[t]; both [B, T, H]."""
        u = torch.cat([self.pre_fc_norm_embedding(next_embeds), self.pre_fc_norm_hidden(hidden)], dim=-1)
        u = self.fc(u)
        for layer in self.layers:
            u = layer(u, position_embeddings=position_embeddings, attention_mask=None)
        return self.norm(u)


class TinyQwen35(nn.Module):
    """Trunk + MTP head, with joint losses."""

    def __init__(self, config: Qwen3_5TextConfig):
        super().__init__()
        self.lm = Qwen3_5ForCausalLM(config)
        self.mtp = MTPHead(config)

    def rope(self, x, length: int):
        pos = torch.arange(length, device=x.device).view(1, 1, -1).expand(3, x.shape[0], -1)
        return self.lm.model.rotary_emb(x, pos)

    def forward(self, seq):
        """seq: [B, T+1] token ids. Returns (trunk loss, mtp loss, trunk logits, mtp logits)."""
        inp, tgt = seq[:, :-1], seq[:, 1:]
        out = self.lm.model(input_ids=inp, use_cache=False)
        h = out.last_hidden_state  # final normed hidden state, [B, T, H]
        logits = self.lm.lm_head(h)
        loss = F.cross_entropy(logits.float().flatten(0, 1), tgt.flatten())
        # MTP at position t (0..T-2): h[t] with embed(x[t+1]) -> x[t+2]
        t = h.shape[1] - 1
        emb_next = self.lm.model.embed_tokens(inp[:, 1:])
        m = self.mtp(emb_next, h[:, :t], self.rope(h, t))
        mtp_logits = self.lm.lm_head(m)
        mtp_loss = F.cross_entropy(mtp_logits.float().flatten(0, 1), tgt[:, 1:].flatten())
        return loss, mtp_loss, logits, mtp_logits


def lr_at(progress: float, peak: float, warmup: float) -> float:
    if progress < warmup:
        return peak * max(progress / warmup, 0.02)
    p = min((progress - warmup) / max(1e-9, 1 - warmup), 1.0)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def batches(data: np.ndarray, batch: int, seq: int, rng: np.random.Generator):
    while True:
        starts = rng.integers(0, data.size - seq - 2, size=batch)
        arr = np.stack([data[s : s + seq + 1] for s in starts]).astype(np.int64)
        yield torch.from_numpy(arr)


@torch.no_grad()
def evaluate(model: TinyQwen35, val: np.ndarray, seq: int, max_windows: int = 64):
    """Mean trunk and MTP loss over contiguous, non-overlapping validation windows."""
    model.eval()
    n = min((val.size - 1) // seq, max_windows)
    tl, ml, count = 0.0, 0.0, 0
    for i in range(0, n, 8):
        rows = [val[j * seq : j * seq + seq + 1] for j in range(i, min(i + 8, n))]
        x = torch.from_numpy(np.stack(rows).astype(np.int64))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, mtp_loss, _, _ = model(x)
        tl += loss.item() * len(rows)
        ml += mtp_loss.item() * len(rows)
        count += len(rows)
    model.train()
    return tl / count, ml / count


def param_groups(model: nn.Module, wd: float):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.ndim >= 2 and "conv1d" not in name:
            decay.append(p)
        else:
            no_decay.append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="output dir of prepare.py")
    ap.add_argument("--out", required=True, help="Hugging Face output dir")
    ap.add_argument("--ckpt", default=None, help="checkpoint file (default: OUT.ckpt.pt)")
    ap.add_argument("--minutes", type=float, default=75.0, help="wall-clock training budget")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--warmup", type=float, default=0.03, help="warmup share of the budget")
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ckpt-minutes", type=float, default=5.0)
    ap.add_argument("--eval-minutes", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--max-steps", type=int, default=0, help="stop after N steps (0: budget only)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)

    info = json.load(open(os.path.join(args.data, "corpus.json")))
    train = np.fromfile(os.path.join(args.data, "train.bin"), dtype=np.uint16)
    val = np.fromfile(os.path.join(args.data, "val.bin"), dtype=np.uint16)
    config = make_config(info["vocab_size"], info["added_token_ids"])
    model = TinyQwen35(config)
    n_trunk = sum(p.numel() for p in model.lm.parameters())
    n_mtp = sum(p.numel() for p in model.mtp.parameters())
    print(f"params: trunk {n_trunk:,} mtp {n_mtp:,} (total {n_trunk + n_mtp:,})", flush=True)

    opt = torch.optim.AdamW(param_groups(model, args.wd), lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    ckpt_path = args.ckpt or args.out.rstrip("/") + ".ckpt.pt"
    step, tokens, spent = 0, 0, 0.0
    if args.resume and os.path.exists(ckpt_path):
        state = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, tokens, spent = state["step"], state["tokens"], state["spent"]
        rng = np.random.default_rng(args.seed + step)
        print(f"resumed at step {step}, {tokens:,} tokens, {spent / 60:.1f} min", flush=True)

    def save_ckpt():
        tmp = ckpt_path + ".tmp"
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                    "tokens": tokens, "spent": spent, "args": vars(args)}, tmp)
        os.replace(tmp, ckpt_path)

    budget = args.minutes * 60.0
    start = time.time() - spent
    last_ckpt = last_eval = last_log = time.time()
    ema = None
    model.train()
    for x in batches(train, args.batch, args.seq, rng):
        spent = time.time() - start
        if spent >= budget or (args.max_steps and step >= args.max_steps):
            break
        lr = lr_at(spent / budget, args.lr, args.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, mtp_loss, _, _ = model(x)
            total = loss + args.mtp_weight * mtp_loss
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += args.batch * args.seq
        pair = (loss.item(), mtp_loss.item())
        ema = pair if ema is None else tuple(0.95 * e + 0.05 * v for e, v in zip(ema, pair))
        now = time.time()
        if now - last_log >= 30 or step <= 3:
            print(f"step {step} min {spent / 60:.1f} lr {lr:.2e} loss {ema[0]:.3f} mtp {ema[1]:.3f} "
                  f"tok/s {tokens / max(spent, 1e-9):.0f} tokens {tokens:,}", flush=True)
            last_log = now
        if now - last_eval >= args.eval_minutes * 60:
            vl, vm = evaluate(model, val, args.seq)
            print(f"eval step {step} val_loss {vl:.4f} ppl {math.exp(vl):.2f} val_mtp_loss {vm:.4f}", flush=True)
            last_eval = time.time()
        if now - last_ckpt >= args.ckpt_minutes * 60:
            save_ckpt()
            last_ckpt = time.time()
    spent = time.time() - start
    save_ckpt()
    vl, vm = evaluate(model, val, args.seq, max_windows=1 << 30)
    print(f"final step {step} tokens {tokens:,} minutes {spent / 60:.1f} val_loss {vl:.4f} "
          f"ppl {math.exp(vl):.2f} val_mtp_loss {vm:.4f}", flush=True)
    from export import export_hf

    export_hf(model, config, args.data, args.out,
              {"steps": step, "tokens": tokens, "minutes": round(spent / 60, 1)})
    print(f"exported {args.out}", flush=True)


if __name__ == "__main__":
    main()
