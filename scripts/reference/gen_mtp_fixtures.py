#!/usr/bin/env python3
"""Reference fixture for the engine's MTP (multi-token prediction) head.

transformers drops Qwen3.5's `mtp.*` weights and has no MTP forward, so this
script computes one in PyTorch following the module vLLM defines in
`vllm/model_executor/models/qwen3_5_mtp.py` (`Qwen3_5MultiTokenPredictor`):

    e = pre_fc_norm_embedding(embed_tokens(x_{i+1}))       (1+w) RMSNorm
    h = pre_fc_norm_hidden(h_i)                            h_i: trunk's final *normed* state
    u = fc(concat(e, h))                                   embedding first; [2H] -> [H]
    u = decoder_layer(u)                                   one full-attention layer, rope position i
    g = norm(u)                                            returned normed; logits = lm_head(g)

The decoder layer is transformers' own `Qwen3_5DecoderLayer` (full attention)
loaded with the `mtp.layers.0.*` weights, as vLLM instantiates its
`Qwen3_5DecoderLayer(layer_type="full_attention")`. Chained drafts feed the
MTP's normed output `g` back as the hidden of the next position (vLLM's
proposer passes the MTP forward's returned hidden states to the next step).
Everything is computed cache-free (the whole MTP sequence each time), which is
valid because the MTP layer is causal.

Output: appliance/engine/tests/fixtures/mtp_f32_untied/
  config.json, model.safetensors (trunk + random mtp.* weights)
  mtp_reference.safetensors (not reference.safetensors: tests/reference.rs owns that name):
      prompt        I32 [T]       x_0..x_{T-1}
      next          I32 [1]       x_T (the token after the prompt)
      trunk_hidden  F32 [T, H]    h_0..h_{T-1}, final-normed trunk states
      mtp_hidden    F32 [T, H]    g_0..g_{T-1}: MTP over (x_{i+1}, h_i) at positions 0..T-1
      mtp_logits    F32 [T, V]    lm_head(g)
      chain_tokens  I32 [C]       greedy chained drafts d_1..d_C (d_1 = argmax mtp_logits[T-1])
      chain_logits  F32 [C, V]    logits at positions T..T+C-1, MTP fed (d_j, g_prev)
Usage: python3 scripts/reference/gen_mtp_fixtures.py
"""

import json
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers.models.qwen3_5.modeling_qwen3_5 import (
    Qwen3_5DecoderLayer,
    Qwen3_5TextRotaryEmbedding,
)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_fixtures as gf  # noqa: E402

FX = dict(
    name="mtp_f32_untied",
    dtype="f32",
    tied=False,
    naming="text",
    shards=1,
    mtp=True,
    cfg=dict(
        hidden_size=64,
        intermediate_size=96,
        layer_types=["linear_attention", "full_attention", "linear_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25),
    ),
)
PROMPT = 23
CHAIN = 4


def rms1p(x, w, eps):
    """Qwen3.5's (1 + w) RMSNorm in float32."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)


class Mtp:
    """The MTP head of vLLM's Qwen3_5MultiTokenPredictor, on plain tensors."""

    def __init__(self, cfg, sd):
        self.eps = cfg.rms_norm_eps
        self.embed = sd["model.embed_tokens.weight"]
        self.lm_head = sd["lm_head.weight"]
        self.fc = sd["mtp.fc.weight"]
        self.norm_e = sd["mtp.pre_fc_norm_embedding.weight"]
        self.norm_h = sd["mtp.pre_fc_norm_hidden.weight"]
        self.norm = sd["mtp.norm.weight"]
        lcfg = transformers.Qwen3_5TextConfig(**{**cfg.to_dict(), "layer_types": ["full_attention"],
                                                 "num_hidden_layers": 1})
        lcfg._attn_implementation = "eager"
        self.layer = Qwen3_5DecoderLayer(lcfg, 0).float().eval()
        prefix = "mtp.layers.0."
        own = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
        self.layer.load_state_dict(own, strict=True)
        self.rope = Qwen3_5TextRotaryEmbedding(lcfg)

    def forward(self, tokens, hidden):
        """tokens [T] (x_{i+1}), hidden [T, H] (h_i) at positions 0..T-1 -> normed [T, H]."""
        t = len(tokens)
        e = rms1p(self.embed[torch.tensor(tokens)], self.norm_e, self.eps)
        h = rms1p(hidden, self.norm_h, self.eps)
        u = torch.cat([e, h], dim=-1) @ self.fc.T
        u = u[None]
        pos = torch.arange(t).view(1, 1, -1).expand(3, 1, -1)
        cos_sin = self.rope(u, pos)
        mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
        u = self.layer(u, position_embeddings=cos_sin, attention_mask=mask, position_ids=pos[0])
        return rms1p(u[0], self.norm, self.eps)


def check_roundtrip(path, model, ids):
    """The written checkpoint loads back into transformers with identical logits."""
    again = transformers.Qwen3_5ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    again.config._attn_implementation = "eager"
    x = torch.tensor([ids])
    with torch.no_grad():
        a = model(input_ids=x, use_cache=False).logits
        b = again(input_ids=x, use_cache=False).logits
    assert torch.equal(a, b), f"{path}: reloaded checkpoint differs"


def main():
    path = os.path.join(gf.OUT, FX["name"])
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path)
    seed = 9100
    cfg, model = gf.build(FX, seed)
    gen = torch.Generator().manual_seed(seed + 2)
    gf.write_config(path, cfg, FX)
    gf.write_weights(path, cfg, model, FX, gen)
    sd = load_file(os.path.join(path, "model.safetensors"))
    sd = {k: v.float() for k, v in sd.items()}
    mtp = Mtp(cfg, sd)
    ids = torch.randint(0, gf.VOCAB, (PROMPT + 1,), generator=gen).tolist()
    prompt, nxt = ids[:PROMPT], ids[PROMPT]
    with torch.no_grad():
        trunk = model.model(input_ids=torch.tensor([prompt]), use_cache=False).last_hidden_state[0]
        g = mtp.forward(ids[1:], trunk)
        logits = g @ mtp.lm_head.T
        tokens, hidden = list(ids[1:]), trunk
        chain, chain_logits = [], []
        last_g, last_logits = g[-1], logits[-1]
        margins = []
        for _ in range(CHAIN):
            top2 = last_logits.topk(2).values
            margins.append(float(top2[0] - top2[1]))
            d = int(last_logits.argmax())
            chain.append(d)
            tokens.append(d)
            hidden = torch.cat([hidden, last_g[None]], dim=0)
            g_all = mtp.forward(tokens, hidden)
            last_g = g_all[-1]
            last_logits = last_g @ mtp.lm_head.T
            chain_logits.append(last_logits)
    ref = {
        "prompt": torch.tensor(prompt, dtype=torch.int32),
        "next": torch.tensor([nxt], dtype=torch.int32),
        "trunk_hidden": trunk.contiguous(),
        "mtp_hidden": g.contiguous(),
        "mtp_logits": logits.contiguous(),
        "chain_tokens": torch.tensor(chain, dtype=torch.int32),
        "chain_logits": torch.stack(chain_logits).contiguous(),
    }
    save_file(ref, os.path.join(path, "mtp_reference.safetensors"))
    check_roundtrip(path, model, prompt)
    meta = {
        "generator": "scripts/reference/gen_mtp_fixtures.py",
        "mtp_definition": "vllm/model_executor/models/qwen3_5_mtp.py (Qwen3_5MultiTokenPredictor)",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "prompt_tokens": PROMPT,
        "chain": CHAIN,
        "chain_top2_margins": margins,
    }
    with open(os.path.join(path, "mtp_reference.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    print(FX["name"], meta)


if __name__ == "__main__":
    main()
