#!/usr/bin/env python3
"""Generate the engine's reference fixtures with Hugging Face transformers.

Builds several tiny random Qwen3.5 text models (different layer mixes, head
counts, tied/untied embeddings, f32/bf16 weights, text-only and multimodal
tensor naming, single-file and sharded checkpoints), perturbs the weights that
random init leaves at trivial values (norms, A_log, dt_bias) so every term of
the model matters, and records transformers' logits and greedy continuations.

Output: appliance/engine/tests/fixtures/<name>/
  config.json, model.safetensors or model-0000N-of-0000M.safetensors + index
  reference.safetensors: for each prompt i
      prompt_i          I32 [T]        the prompt ids
      prefill_logits_i  F32 [T, V]     logits of a cache-free forward over the prompt
      generated_i       I32 [G]        greedy continuation (model.generate, with cache)
      decode_logits_i   F32 [G, V]     the logits each generated token was chosen from
  reference.json: versions, prompt lengths, smallest greedy top-2 margin.
Also appliance/engine/tests/fixtures/nvfp4/: a ModelOpt-layout NVFP4 linear
with its dequantized weight and a matvec computed by torch.

Math is float32 throughout: bf16 fixtures store bf16 weights, and the reference
runs in float32 on exactly those bf16 values.

Usage: python3 scripts/reference/gen_fixtures.py  (torch + transformers >= 5.2)
"""

import json
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "appliance", "engine", "tests", "fixtures")

VOCAB = 256
MIN_MARGIN = 2e-3  # greedy top-2 gap required at every generated step

FIXTURES = [
    dict(
        name="mixed_f32_untied",
        dtype="f32",
        tied=False,
        naming="text",
        shards=1,
        mtp=False,
        cfg=dict(
            hidden_size=64,
            intermediate_size=128,
            layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=24,
            linear_conv_kernel_dim=4,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25),
        ),
        prompts=[1, 40, 300],
        gen=12,
    ),
    dict(
        name="linear_bf16_tied",
        dtype="bf16",
        tied=True,
        naming="text",
        shards=1,
        mtp=False,
        cfg=dict(
            hidden_size=48,
            intermediate_size=96,
            layer_types=["linear_attention"] * 3,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=6,
            linear_key_head_dim=8,
            linear_value_head_dim=16,
            linear_conv_kernel_dim=4,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25),
        ),
        prompts=[7, 70],
        gen=10,
    ),
    dict(
        name="full_f32_tied_mm",
        dtype="f32",
        tied=True,
        naming="multimodal",
        shards=1,
        mtp=False,
        cfg=dict(
            hidden_size=64,
            intermediate_size=80,
            layer_types=["full_attention", "full_attention"],
            num_attention_heads=6,
            num_key_value_heads=2,
            head_dim=32,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_conv_kernel_dim=4,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0, partial_rotary_factor=0.5),
        ),
        prompts=[5, 33],
        gen=10,
    ),
    dict(
        name="mixed_bf16_mm_sharded_mtp",
        dtype="bf16",
        tied=False,
        naming="multimodal",
        shards=2,
        mtp=True,
        cfg=dict(
            hidden_size=64,
            intermediate_size=112,
            layer_types=[
                "linear_attention",
                "full_attention",
                "linear_attention",
                "linear_attention",
                "full_attention",
            ],
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=32,
            linear_num_key_heads=2,
            linear_num_value_heads=2,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_conv_kernel_dim=3,
            rope_parameters=dict(
                rope_type="default",
                rope_theta=10000000.0,
                partial_rotary_factor=0.25,
                mrope_interleaved=True,
                mrope_section=[1, 1, 0],
            ),
        ),
        prompts=[1, 20, 280],
        gen=10,
    ),
]


def perturb(model, gen):
    """Give norms, A_log and dt_bias non-trivial values so each term matters."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + (torch.rand(p.shape, generator=gen) - 0.5))
            elif name.endswith("norm.weight"):  # (1 + w) RMSNorms
                p.copy_((torch.rand(p.shape, generator=gen) - 0.5) * 1.0)
            elif name.endswith("A_log"):
                p.copy_(torch.log(0.1 + 2.9 * torch.rand(p.shape, generator=gen)))
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.7)


def build(fx, seed):
    cfg = Qwen3_5TextConfig(
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
    model = Qwen3_5ForCausalLM(cfg)
    model.config._attn_implementation = "eager"
    gen = torch.Generator().manual_seed(seed + 1)
    perturb(model, gen)
    model = model.float().eval()
    if fx["dtype"] == "bf16":
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
    return cfg, model


def greedy_without_cache(model, ids, n_gen):
    """Greedy decoding by full forwards (transformers 5.24's cache cannot hold a
    model without any full-attention layer: get_seq_length raises)."""
    seq, steps = list(ids), []
    for _ in range(n_gen):
        logits = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].float()
        steps.append(logits)
        seq.append(int(logits.argmax()))
    return seq[len(ids):], torch.stack(steps)


def run_prompt(model, ids, n_gen):
    x = torch.tensor([ids], dtype=torch.long)
    with torch.no_grad():
        prefill = model(input_ids=x, use_cache=False).logits[0].float()
        if "full_attention" not in model.config.layer_types:
            generated, decode = greedy_without_cache(model, ids, n_gen)
            top2 = decode.topk(2, dim=-1).values
            return prefill, generated, decode, float((top2[:, 0] - top2[:, 1]).min())
        # An explicit all-ones mask: without it generate() would infer padding
        # from pad_token_id and mask every prompt token equal to it.
        out = model.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=n_gen,
            min_new_tokens=n_gen,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            eos_token_id=None,
            pad_token_id=0,
        )
    generated = out.sequences[0, len(ids):].tolist()
    decode = torch.stack([lg[0].float() for lg in out.logits])
    top2 = decode.topk(2, dim=-1).values
    margin = float((top2[:, 0] - top2[:, 1]).min())
    return prefill, generated, decode, margin


def text_config_dict(cfg, fx):
    d = cfg.to_dict()
    d["dtype"] = "bfloat16" if fx["dtype"] == "bf16" else "float32"
    if fx["mtp"]:
        d["mtp_num_hidden_layers"] = 1
    d.pop("transformers_version", None)
    return d


def write_config(path, cfg, fx):
    text = text_config_dict(cfg, fx)
    if fx["naming"] == "text":
        text["architectures"] = ["Qwen3_5ForCausalLM"]
        conf = text
    else:
        text.pop("architectures", None)
        conf = {
            "architectures": ["Qwen3_5ForConditionalGeneration"],
            "model_type": "qwen3_5",
            "tie_word_embeddings": fx["tied"],
            "image_token_id": 248056,
            "video_token_id": 248057,
            "text_config": text,
            "vision_config": {"model_type": "qwen3_5_vision", "depth": 1, "hidden_size": 16},
        }
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(conf, f, indent=2, sort_keys=True)
        f.write("\n")


def mtp_tensors(cfg, gen):
    """Random MTP head weights in the published checkpoints' naming."""
    h, hd = cfg.hidden_size, cfg.head_dim
    nq, nkv, inter = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size

    def r(*shape):
        return torch.randn(shape, generator=gen) * 0.1

    t = {
        "mtp.fc.weight": r(h, 2 * h),
        "mtp.pre_fc_norm_embedding.weight": r(h),
        "mtp.pre_fc_norm_hidden.weight": r(h),
        "mtp.norm.weight": r(h),
    }
    p = "mtp.layers.0."
    t.update({
        p + "input_layernorm.weight": r(h),
        p + "post_attention_layernorm.weight": r(h),
        p + "self_attn.q_proj.weight": r(2 * nq * hd, h),
        p + "self_attn.k_proj.weight": r(nkv * hd, h),
        p + "self_attn.v_proj.weight": r(nkv * hd, h),
        p + "self_attn.o_proj.weight": r(h, nq * hd),
        p + "self_attn.q_norm.weight": r(hd),
        p + "self_attn.k_norm.weight": r(hd),
        p + "mlp.gate_proj.weight": r(inter, h),
        p + "mlp.up_proj.weight": r(inter, h),
        p + "mlp.down_proj.weight": r(h, inter),
    })
    return t


def write_weights(path, cfg, model, fx, gen):
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if fx["tied"]:
        sd.pop("lm_head.weight", None)
    if fx["naming"] == "multimodal":
        sd = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
              for k, v in sd.items()}
        # A few vision tower tensors the text engine must ignore (odd dtype on purpose).
        sd["model.visual.patch_embed.proj.weight"] = torch.randn(16, 3, 2, 2, generator=gen)
        sd["model.visual.blocks.0.attn.qkv.bias"] = torch.randn(48, generator=gen).to(torch.float16)
    if fx["mtp"]:
        sd.update(mtp_tensors(cfg, gen))
    want = torch.bfloat16 if fx["dtype"] == "bf16" else torch.float32
    sd = {k: (v.to(want) if v.dtype == torch.float32 and not k.startswith("model.visual.") else v)
          for k, v in sd.items()}
    names = sorted(sd)
    meta = {"format": "pt"}
    if fx["shards"] == 1:
        save_file(sd, os.path.join(path, "model.safetensors"), metadata=meta)
        return
    n = fx["shards"]
    weight_map, total = {}, 0
    for s in range(n):
        part = names[s::n]
        fname = f"model-{s + 1:05d}-of-{n:05d}.safetensors"
        save_file({k: sd[k] for k in part}, os.path.join(path, fname), metadata=meta)
        for k in part:
            weight_map[k] = fname
            total += sd[k].numel() * sd[k].element_size()
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
        f.write("\n")


def check_roundtrip(path, model, ids):
    """Text-named checkpoints must load back into transformers unchanged."""
    again = Qwen3_5ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    x = torch.tensor([ids], dtype=torch.long)
    with torch.no_grad():
        a = model(input_ids=x, use_cache=False).logits
        b = again(input_ids=x, use_cache=False).logits
    assert torch.equal(a, b), f"{path}: reloaded checkpoint differs"


def make_fixture(fx, base_seed):
    path = os.path.join(OUT, fx["name"])
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path)
    cfg, model = build(fx, base_seed)
    gen = torch.Generator().manual_seed(base_seed + 2)
    ref, info = {}, []
    for i, length in enumerate(fx["prompts"]):
        # Re-draw the prompt until greedy decoding has a clear winner at every step.
        for attempt in range(50):
            ids = torch.randint(0, VOCAB, (length,), generator=gen).tolist()
            prefill, generated, decode, margin = run_prompt(model, ids, fx["gen"])
            if margin >= MIN_MARGIN:
                break
        else:
            sys.exit(f"{fx['name']}: no prompt of length {length} with a clear greedy path")
        ref[f"prompt_{i}"] = torch.tensor(ids, dtype=torch.int32)
        ref[f"prefill_logits_{i}"] = prefill.contiguous()
        ref[f"generated_{i}"] = torch.tensor(generated, dtype=torch.int32)
        ref[f"decode_logits_{i}"] = decode.contiguous()
        info.append({"prompt_tokens": length, "generated": len(generated), "min_top2_margin": margin})
    save_file(ref, os.path.join(path, "reference.safetensors"))
    write_config(path, cfg, fx)
    write_weights(path, cfg, model, fx, gen)
    if fx["naming"] == "text":
        check_roundtrip(path, model, ref["prompt_0"].tolist())
    meta = {
        "generator": "scripts/reference/gen_fixtures.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "prompts": len(fx["prompts"]),
        "details": info,
    }
    with open(os.path.join(path, "reference.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    print(fx["name"], info)


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def make_nvfp4():
    """A ModelOpt-layout NVFP4 linear [N, K], its dequantized weight and W @ x."""
    path = os.path.join(OUT, "nvfp4")
    os.makedirs(path, exist_ok=True)
    gen = torch.Generator().manual_seed(7)
    n, k = 12, 64
    codes = torch.randint(0, 16, (n, k), generator=gen)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    scale = (torch.rand(n, k // 16, generator=gen) * 3 + 0.01).to(torch.float8_e4m3fn)
    scale_2 = torch.tensor(0.0123, dtype=torch.float32)
    mag = torch.tensor(E2M1)[codes & 7]
    val = torch.where(codes >= 8, -mag, mag)
    deq = val * scale.to(torch.float32).repeat_interleave(16, dim=1) * scale_2
    x = torch.randn(k, generator=gen)
    y = deq.double() @ x.double()
    save_file(
        {
            "linear.weight": packed.contiguous(),
            "linear.weight_scale": scale.contiguous(),
            "linear.weight_scale_2": scale_2,
            "linear.input_scale": torch.tensor(1.0),
            "dequantized": deq.contiguous(),
            "x": x.contiguous(),
            "y": y.float().contiguous(),
        },
        os.path.join(path, "nvfp4.safetensors"),
    )


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.set_num_threads(2)
    for i, fx in enumerate(FIXTURES):
        make_fixture(fx, 1000 + 17 * i)
    make_nvfp4()


if __name__ == "__main__":
    main()
