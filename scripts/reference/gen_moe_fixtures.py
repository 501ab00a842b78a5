#!/usr/bin/env python3
"""Reference fixtures for Qwen3.5 MoE (`qwen3_5_moe`) made with transformers.

Builds small random `Qwen3_5MoeForCausalLM` models (every layer a sparse MoE
block: softmax router, top-k renormalised, a shared expert behind a sigmoid
gate), perturbs the weights random init leaves trivial (norms, A_log,
dt_bias) so every term matters, and records transformers' logits and greedy
continuations in the layout of scripts/reference/gen_fixtures.py, so
appliance/engine/tests/reference.rs checks them like the dense fixtures.

Experts are stored the two ways checkpoints store them:
  per expert  `mlp.experts.N.{gate,up,down}_proj.weight` (save_pretrained,
              ModelOpt exports)
  fused       `mlp.experts.gate_up_proj` [E, 2I, H] (gate rows first) and
              `mlp.experts.down_proj` [E, H, I] (transformers' own tensors)
Routing must not hinge on rounding: a prompt is re-drawn until, at every
router call (prefill and every decode step, every layer), the k-th and
(k+1)-th routing probabilities differ by at least MIN_ROUTE_GAP.

Also writes moe_mtp_bf16_untied/: an MoE model with a random MTP head whose
decoder layer is MoE too (vLLM's Qwen3_5MultiTokenPredictor builds its layer
from the MoE config), and mtp_reference.safetensors in the layout of
scripts/reference/gen_mtp_fixtures.py.

Math is float32 throughout: bf16 fixtures store bf16 weights, and the
reference runs in float32 on exactly those values.

Usage: python3 scripts/reference/gen_moe_fixtures.py  (torch + transformers >= 5.2)
"""

import json
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import (
    Qwen3_5MoeDecoderLayer,
    Qwen3_5MoeTextRotaryEmbedding,
    Qwen3_5MoeTopKRouter,
)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_fixtures as gf  # noqa: E402

OUT = gf.OUT
VOCAB = gf.VOCAB
MIN_MARGIN = gf.MIN_MARGIN
MIN_ROUTE_GAP = 1e-4

FIXTURES = [
    dict(
        name="moe_f32_untied",
        dtype="f32",
        tied=False,
        naming="text",
        experts="per_expert",
        cfg=dict(
            hidden_size=64,
            layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
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
        prompts=[1, 40, 300],
        gen=12,
    ),
    dict(
        name="moe_bf16_tied_mm_fused",
        dtype="bf16",
        tied=True,
        naming="multimodal",
        experts="fused",
        cfg=dict(
            hidden_size=48,
            layer_types=["linear_attention", "linear_attention", "full_attention"],
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=8,
            linear_value_head_dim=16,
            linear_conv_kernel_dim=4,
            num_experts=16,
            num_experts_per_tok=4,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=40,
            rope_parameters=dict(
                rope_type="default",
                rope_theta=10000000.0,
                partial_rotary_factor=0.25,
                mrope_interleaved=True,
                mrope_section=[1, 1, 0],
            ),
        ),
        prompts=[3, 64],
        gen=10,
    ),
]

MTP_FX = dict(
    name="moe_mtp_bf16_untied",
    dtype="bf16",
    tied=False,
    naming="text",
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
)
MTP_PROMPT = 23
MTP_CHAIN = 4


class RouteGaps:
    """Smallest gap between the k-th and (k+1)-th routing probability seen
    by any router since the last reset (forward hooks)."""

    def __init__(self, model):
        self.min_gap = float("inf")
        for m in model.modules():
            if isinstance(m, Qwen3_5MoeTopKRouter):
                m.register_forward_hook(self.hook)

    def hook(self, module, inputs, output):
        logits = output[0].float()
        probs = torch.softmax(logits, dim=-1)
        top = probs.topk(module.top_k + 1, dim=-1).values
        gap = float((top[:, -2] - top[:, -1]).min())
        self.min_gap = min(self.min_gap, gap)

    def reset(self):
        self.min_gap = float("inf")


def build(fx, seed):
    cfg = Qwen3_5MoeTextConfig(
        vocab_size=VOCAB,
        num_hidden_layers=len(fx["cfg"]["layer_types"]),
        tie_word_embeddings=fx["tied"],
        initializer_range=0.1,
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
        **fx["cfg"],
    )
    torch.manual_seed(seed)
    model = Qwen3_5MoeForCausalLM(cfg)
    model.config._attn_implementation = "eager"
    gen = torch.Generator().manual_seed(seed + 1)
    gf.perturb(model, gen)
    model = model.float().eval()
    if fx["dtype"] == "bf16":
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
    return cfg, model


def split_experts(sd, num_experts):
    """Fused expert tensors -> the per-expert names save_pretrained writes."""
    out = {}
    for k, v in sd.items():
        if k.endswith("mlp.experts.gate_up_proj"):
            base, inter = k[: -len("gate_up_proj")], v.shape[1] // 2
            for e in range(num_experts):
                out[f"{base}{e}.gate_proj.weight"] = v[e, :inter].contiguous()
                out[f"{base}{e}.up_proj.weight"] = v[e, inter:].contiguous()
        elif k.endswith("mlp.experts.down_proj"):
            base = k[: -len("down_proj")]
            for e in range(num_experts):
                out[f"{base}{e}.down_proj.weight"] = v[e].contiguous()
        else:
            out[k] = v
    return out


def config_json(cfg, fx, mtp=False):
    d = cfg.to_dict()
    d["dtype"] = "bfloat16" if fx["dtype"] == "bf16" else "float32"
    d.pop("transformers_version", None)
    if mtp:
        d["mtp_num_hidden_layers"] = 1
    if fx["naming"] == "text":
        d["architectures"] = ["Qwen3_5MoeForCausalLM"]
        return d
    d.pop("architectures", None)
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "tie_word_embeddings": fx["tied"],
        "image_token_id": 248056,
        "video_token_id": 248057,
        "text_config": d,
        "vision_config": {"model_type": "qwen3_5_moe_vision", "depth": 1, "hidden_size": 16},
    }


def write_checkpoint(path, cfg, model, fx, gen, extra=None):
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config_json(cfg, fx, mtp=extra is not None), f, indent=2, sort_keys=True)
        f.write("\n")
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if fx["tied"]:
        sd.pop("lm_head.weight", None)
    if extra:
        sd.update(extra)
    if fx["experts"] == "per_expert":
        sd = split_experts(sd, cfg.num_experts)
    if fx["naming"] == "multimodal":
        sd = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
              for k, v in sd.items()}
        sd["model.visual.patch_embed.proj.weight"] = torch.randn(16, 3, 2, 2, generator=gen)
    want = torch.bfloat16 if fx["dtype"] == "bf16" else torch.float32
    sd = {k: (v.to(want) if not k.startswith("model.visual.") else v) for k, v in sd.items()}
    save_file(sd, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})


def check_roundtrip(path, model, ids):
    """Text-named checkpoints load back into transformers with equal logits."""
    again = Qwen3_5MoeForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    again.config._attn_implementation = "eager"
    x = torch.tensor([ids], dtype=torch.long)
    with torch.no_grad():
        a = model(input_ids=x, use_cache=False).logits
        b = again(input_ids=x, use_cache=False).logits
    assert torch.equal(a, b), f"{path}: reloaded checkpoint differs"


def make_fixture(fx, seed):
    path = os.path.join(OUT, fx["name"])
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path)
    cfg, model = build(fx, seed)
    gaps = RouteGaps(model)
    gen = torch.Generator().manual_seed(seed + 2)
    ref, info = {}, []
    for i, length in enumerate(fx["prompts"]):
        for attempt in range(200):
            ids = torch.randint(0, VOCAB, (length,), generator=gen).tolist()
            gaps.reset()
            prefill, generated, decode, margin = gf.run_prompt(model, ids, fx["gen"])
            if margin >= MIN_MARGIN and gaps.min_gap >= MIN_ROUTE_GAP:
                break
        else:
            sys.exit(f"{fx['name']}: no prompt of length {length} with clear greedy and routing choices")
        ref[f"prompt_{i}"] = torch.tensor(ids, dtype=torch.int32)
        ref[f"prefill_logits_{i}"] = prefill.contiguous()
        ref[f"generated_{i}"] = torch.tensor(generated, dtype=torch.int32)
        ref[f"decode_logits_{i}"] = decode.contiguous()
        info.append({"prompt_tokens": length, "generated": len(generated), "min_top2_margin": margin,
                     "min_route_gap": gaps.min_gap, "attempts": attempt + 1})
    save_file(ref, os.path.join(path, "reference.safetensors"))
    write_checkpoint(path, cfg, model, fx, gen)
    if fx["naming"] == "text":
        check_roundtrip(path, model, ref["prompt_0"].tolist())
    meta = {
        "generator": "scripts/reference/gen_moe_fixtures.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "experts": fx["experts"],
        "prompts": len(fx["prompts"]),
        "details": info,
    }
    with open(os.path.join(path, "reference.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    print(fx["name"], info)


def rms1p(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)


class MoeMtp:
    """vLLM's Qwen3_5MultiTokenPredictor on an MoE config, on plain tensors:
    as gen_mtp_fixtures.Mtp, its decoder layer an MoE full-attention layer."""

    def __init__(self, cfg, model, gen):
        self.eps = cfg.rms_norm_eps
        h = cfg.hidden_size
        self.embed = model.model.embed_tokens.weight.detach()
        self.lm_head = model.lm_head.weight.detach()

        def r(*shape):
            return (torch.randn(shape, generator=gen) * 0.1).to(torch.bfloat16).float()

        self.fc, self.norm_e, self.norm_h, self.norm = r(h, 2 * h), r(h), r(h), r(h)
        lcfg = Qwen3_5MoeTextConfig(**{**cfg.to_dict(), "layer_types": ["full_attention"],
                                       "num_hidden_layers": 1})
        lcfg._attn_implementation = "eager"
        self.layer = Qwen3_5MoeDecoderLayer(lcfg, 0).float().eval()
        with torch.no_grad():
            for name, p in self.layer.named_parameters():
                v = torch.randn(p.shape, generator=gen) * (0.1 if "norm" in name else 0.15)
                p.copy_(v.to(torch.bfloat16).float())
        self.rope = Qwen3_5MoeTextRotaryEmbedding(lcfg)
        self.gaps = RouteGaps(self.layer)

    def tensors(self):
        t = {
            "mtp.fc.weight": self.fc,
            "mtp.pre_fc_norm_embedding.weight": self.norm_e,
            "mtp.pre_fc_norm_hidden.weight": self.norm_h,
            "mtp.norm.weight": self.norm,
        }
        for k, v in self.layer.state_dict().items():
            t["mtp.layers.0." + k] = v.detach().clone().contiguous()
        return t

    def forward(self, tokens, hidden):
        t = len(tokens)
        e = rms1p(self.embed[torch.tensor(tokens)], self.norm_e, self.eps)
        h = rms1p(hidden, self.norm_h, self.eps)
        u = (torch.cat([e, h], dim=-1) @ self.fc.T)[None]
        pos = torch.arange(t).view(1, 1, -1).expand(3, 1, -1)
        cos_sin = self.rope(u, pos)
        mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
        u = self.layer(u, position_embeddings=cos_sin, attention_mask=mask, position_ids=pos[0])
        return rms1p(u[0], self.norm, self.eps)


def make_mtp_fixture(seed):
    fx = MTP_FX
    path = os.path.join(OUT, fx["name"])
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path)
    cfg, model = build(fx, seed)
    trunk_gaps = RouteGaps(model)
    gen = torch.Generator().manual_seed(seed + 2)
    mtp = MoeMtp(cfg, model, gen)
    for attempt in range(200):
        ids = torch.randint(0, VOCAB, (MTP_PROMPT + 1,), generator=gen).tolist()
        prompt = ids[:MTP_PROMPT]
        trunk_gaps.reset()
        mtp.gaps.reset()
        with torch.no_grad():
            trunk = model.model(input_ids=torch.tensor([prompt]), use_cache=False).last_hidden_state[0]
            g = mtp.forward(ids[1:], trunk)
            logits = g @ mtp.lm_head.T
            tokens, hidden = list(ids[1:]), trunk
            chain, chain_logits, margins = [], [], []
            last_g, last_logits = g[-1], logits[-1]
            for _ in range(MTP_CHAIN):
                top2 = last_logits.topk(2).values
                margins.append(float(top2[0] - top2[1]))
                d = int(last_logits.argmax())
                chain.append(d)
                tokens.append(d)
                hidden = torch.cat([hidden, last_g[None]], dim=0)
                last_g = mtp.forward(tokens, hidden)[-1]
                last_logits = last_g @ mtp.lm_head.T
                chain_logits.append(last_logits)
        gap = min(trunk_gaps.min_gap, mtp.gaps.min_gap)
        if min(margins) >= MIN_MARGIN and gap >= MIN_ROUTE_GAP:
            break
    else:
        sys.exit(f"{fx['name']}: no prompt with clear drafts and routing choices")
    ref = {
        "prompt": torch.tensor(prompt, dtype=torch.int32),
        "next": torch.tensor([ids[MTP_PROMPT]], dtype=torch.int32),
        "trunk_hidden": trunk.contiguous(),
        "mtp_hidden": g.contiguous(),
        "mtp_logits": logits.contiguous(),
        "chain_tokens": torch.tensor(chain, dtype=torch.int32),
        "chain_logits": torch.stack(chain_logits).contiguous(),
    }
    save_file(ref, os.path.join(path, "mtp_reference.safetensors"))
    write_checkpoint(path, cfg, model, fx, gen, extra=mtp.tensors())
    check_roundtrip(path, model, prompt)
    meta = {
        "generator": "scripts/reference/gen_moe_fixtures.py",
        "mtp_definition": "vllm/model_executor/models/qwen3_5_mtp.py (Qwen3_5MultiTokenPredictor, MoE layer)",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "prompt_tokens": MTP_PROMPT,
        "chain": MTP_CHAIN,
        "chain_top2_margins": margins,
        "min_route_gap": gap,
        "attempts": attempt + 1,
    }
    with open(os.path.join(path, "mtp_reference.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    print(fx["name"], meta)


def main():
    torch.set_num_threads(2)
    for i, fx in enumerate(FIXTURES):
        make_fixture(fx, 3000 + 17 * i)
    make_mtp_fixture(3900)


if __name__ == "__main__":
    main()
