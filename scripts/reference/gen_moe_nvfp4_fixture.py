#!/usr/bin/env python3
"""A small ModelOpt-style NVFP4 Qwen3.5 MoE checkpoint and its dequantized reference.

Builds a random `qwen3_5_moe` model as scripts/reference/gen_moe_fixtures.py
does (bf16 weights), then quantizes every routed expert and the shared
expert to NVFP4 the way NVIDIA ModelOpt exports them, and writes the
checkpoint as ModelOpt lays it out:

  model.language_model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight        U8 [N, K/2]
                                                  .weight_scale    F8_E4M3 [N, K/16]
                                                  .weight_scale_2  F32 []
                                                  .input_scale     F32 []
  (the same for mlp.shared_expert.*), everything else BF16: the router
  `mlp.gate`, `mlp.shared_expert_gate`, attention, DeltaNet, embeddings,
  lm_head; hf_quant_config.json names them in exclude_modules.

NVFP4 recipe (ModelOpt's NVFP4QTensor, dynamic weight path), in float32:
  s2 = amax(|W|) / (6 * 448)
  s  = block_amax / (6 * s2), 0 -> 1, clamped to [2^-9, 448], cast to E4M3
  q  = x / (e4m3(s) * s2) rounded to the nearest E2M1 value (ties to the even code)
The reference is transformers' forward (float32) over the *dequantized*
weights W = e2m1(code) * e4m3(s) * s2, so an importer that copies the NVFP4
tensors and an engine that computes with them must reproduce its logits.

Output: model-packs/tools/tests/fixtures/moe_nvfp4_modelopt/
  config.json, hf_quant_config.json, model.safetensors
  reference.safetensors: prompt_i I32 [T], prefill_logits_i F32 [T, V],
                         generated_i I32 [G] (greedy, full forwards)
  reference.json

Usage: python3 scripts/reference/gen_moe_nvfp4_fixture.py
"""

import json
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_fixtures as gf  # noqa: E402
import gen_moe_fixtures as gm  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "model-packs", "tools", "tests", "fixtures", "moe_nvfp4_modelopt")

FX = dict(
    name="moe_nvfp4_modelopt",
    dtype="bf16",
    tied=False,
    naming="multimodal",
    experts="per_expert",
    cfg=dict(
        hidden_size=64,
        layer_types=["linear_attention", "full_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25),
    ),
    prompts=[5, 37],
    gen=10,
)

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
# Midpoints between E2M1 magnitudes; a tie goes to the even code.
BOUNDS = [(0.25, 0), (0.75, 2), (1.25, 2), (1.75, 4), (2.5, 4), (3.5, 6), (5.0, 6)]


def e2m1_codes(q):
    """Nearest E2M1 code (magnitude 0-7, sign bit 3) of each value of q."""
    a = q.abs()
    code = torch.zeros_like(a, dtype=torch.int64)
    for i, (bound, even) in enumerate(BOUNDS):
        above = a > bound
        tie = a == bound
        code = torch.where(above, torch.full_like(code, i + 1), code)
        code = torch.where(tie, torch.full_like(code, even), code)
    return code | torch.where(q < 0, 8, 0)


def quantize(w):
    """ModelOpt NVFP4 of a float32 [N, K] weight -> (packed U8, E4M3 scales, s2)."""
    n, k = w.shape
    amax = w.abs().max()
    s2 = (amax / (6.0 * 448.0)).float()
    blocks = w.reshape(n, k // 16, 16)
    s = blocks.abs().amax(dim=-1) / (6.0 * s2)
    s = torch.where(s == 0, torch.ones_like(s), s).clamp(2.0**-9, 448.0)
    s8 = s.to(torch.float8_e4m3fn)
    q = blocks / (s8.float()[..., None] * s2)
    codes = e2m1_codes(q).reshape(n, k)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    return packed, s8, s2


def dequantize(packed, s8, s2):
    lo, hi = packed.long() & 15, packed.long() >> 4
    codes = torch.stack([lo, hi], dim=-1).reshape(packed.shape[0], -1)
    mag = E2M1[codes & 7]
    val = torch.where(codes >= 8, -mag, mag)
    return val * s8.float().repeat_interleave(16, dim=1) * s2


def is_quantized(name):
    parts = name.split(".")
    return name.endswith(".weight") and (".mlp.experts." in name or ".mlp.shared_expert." in name) \
        and parts[-2] in ("gate_proj", "up_proj", "down_proj")


def main():
    torch.set_num_threads(2)
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    seed = 4700
    cfg, model = gm.build(FX, seed)
    sd = gm.split_experts({k: v.detach().clone() for k, v in model.state_dict().items()},
                          cfg.num_experts)
    ckpt, deq = {}, {}
    for name, w in sd.items():
        if is_quantized(name):
            packed, s8, s2 = quantize(w.float())
            m = name[: -len(".weight")]
            ckpt[m + ".weight"] = packed
            ckpt[m + ".weight_scale"] = s8
            ckpt[m + ".weight_scale_2"] = s2.reshape(())
            ckpt[m + ".input_scale"] = torch.tensor(1.0 / 448.0)
            deq[name] = dequantize(packed, s8, s2)
        else:
            ckpt[name] = w.to(torch.bfloat16)
            deq[name] = w.float()
    # The dequantized weights back into the model: the reference computes with them.
    fused = {}
    for name, w in deq.items():
        if ".mlp.experts." in name:
            base, rest = name.split(".mlp.experts.")
            e, part = rest.split(".")[:2]
            fused.setdefault(base, {}).setdefault(int(e), {})[part] = w
        else:
            fused[name] = w
    state = {}
    for k, v in fused.items():
        if isinstance(v, dict):
            experts = [v[e] for e in range(cfg.num_experts)]
            state[k + ".mlp.experts.gate_up_proj"] = torch.stack(
                [torch.cat([x["gate_proj"], x["up_proj"]]) for x in experts])
            state[k + ".mlp.experts.down_proj"] = torch.stack([x["down_proj"] for x in experts])
        else:
            state[k] = v
    model.load_state_dict(state, strict=True)
    gaps = gm.RouteGaps(model)
    gen = torch.Generator().manual_seed(seed + 2)
    ref, info = {}, []
    for i, length in enumerate(FX["prompts"]):
        for attempt in range(200):
            ids = torch.randint(0, gf.VOCAB, (length,), generator=gen).tolist()
            gaps.reset()
            with torch.no_grad():
                prefill = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
                generated, decode = gf.greedy_without_cache(model, ids, FX["gen"])
            top2 = decode.topk(2, dim=-1).values
            margin = float((top2[:, 0] - top2[:, 1]).min())
            if margin >= gf.MIN_MARGIN and gaps.min_gap >= gm.MIN_ROUTE_GAP:
                break
        else:
            sys.exit(f"no prompt of length {length} with clear greedy and routing choices")
        ref[f"prompt_{i}"] = torch.tensor(ids, dtype=torch.int32)
        ref[f"prefill_logits_{i}"] = prefill.contiguous()
        ref[f"generated_{i}"] = torch.tensor(generated, dtype=torch.int32)
        info.append({"prompt_tokens": length, "generated": len(generated), "min_top2_margin": margin,
                     "min_route_gap": gaps.min_gap, "attempts": attempt + 1})
    save_file(ref, os.path.join(OUT, "reference.safetensors"))
    ckpt = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
            for k, v in ckpt.items()}
    save_file(ckpt, os.path.join(OUT, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(gm.config_json(cfg, FX), f, indent=2, sort_keys=True)
        f.write("\n")
    quant = {
        "producer": {"name": "modelopt", "version": "reference script"},
        "quantization": {
            "quant_algo": "NVFP4",
            "kv_cache_quant_algo": None,
            "group_size": 16,
            "exclude_modules": ["lm_head", "*self_attn*", "*linear_attn*", "*mlp.gate",
                                "*shared_expert_gate*", "*embed_tokens*"],
        },
    }
    with open(os.path.join(OUT, "hf_quant_config.json"), "w") as f:
        json.dump(quant, f, indent=2)
        f.write("\n")
    meta = {
        "generator": "scripts/reference/gen_moe_nvfp4_fixture.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "nvfp4_modules": sum(1 for k in ckpt if k.endswith(".weight_scale_2")),
        "details": info,
    }
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    print(meta)


if __name__ == "__main__":
    main()
