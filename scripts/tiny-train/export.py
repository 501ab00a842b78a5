"""Export the tiny model as a Hugging Face directory with Qwen3.5's MTP tensor names.

Writes config.json (model_type qwen3_5_text, `mtp_num_hidden_layers: 1`), model.safetensors
in bf16 (trunk under `model.*` and `lm_head.weight`, MTP under `mtp.*`), tokenizer.json,
tokenizer_config.json, special_tokens_map.json, generation_config.json and train_info.json.
transformers' Qwen3_5ForCausalLM reloads the directory and ignores `mtp.*` (it drops MTP
weights by design); evaluate.py reads them back itself.
"""

import json
import os
import shutil

import torch
from safetensors.torch import save_file

TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]


def hf_state_dict(model) -> dict:
    """Trunk tensors under their transformers names plus `mtp.*`, contiguous bf16."""
    tensors = {}
    for name, t in model.lm.state_dict().items():
        tensors[name] = t
    for name, t in model.mtp.state_dict().items():
        tensors["mtp." + name] = t
    return {k: v.detach().to(torch.bfloat16).contiguous().clone() for k, v in tensors.items()}


def export_hf(model, config, data_dir: str, out: str, train_info: dict) -> None:
    os.makedirs(out, exist_ok=True)
    config.architectures = ["Qwen3_5ForCausalLM"]
    config.dtype = "bfloat16"
    config.save_pretrained(out)
    # Qwen3.5 checkpoints carry the MTP depth in the text config; make sure it is kept.
    path = os.path.join(out, "config.json")
    cfg = json.load(open(path))
    cfg["mtp_num_hidden_layers"] = 1
    cfg["mtp_use_dedicated_embeddings"] = False
    # Text positions are equal in all three MRoPE sections, so the split is immaterial to the
    # math; state one that sums to this model's rotary pairs (head_dim * factor / 2 = 8).
    rope = cfg["rope_parameters"]
    pairs = int(cfg["head_dim"] * rope["partial_rotary_factor"]) // 2
    third = -(-pairs // 3)
    rope["mrope_section"] = [third, third, pairs - 2 * third]
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    save_file(hf_state_dict(model), os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    for name in TOKENIZER_FILES:
        shutil.copy(os.path.join(data_dir, name), os.path.join(out, name))
    ids = json.load(open(os.path.join(data_dir, "corpus.json")))["added_token_ids"]
    gen = {
        "bos_token_id": None,
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "pad_token_id": ids["<|endoftext|>"],
        "do_sample": True,
        "temperature": 1.0,
        "top_p": 0.95,
        "top_k": 20,
    }
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    with open(os.path.join(out, "train_info.json"), "w") as f:
        json.dump(train_info, f, indent=2)
