#!/usr/bin/env python3
"""A ModelOpt-NVFP4 Hugging Face directory from a Kore pack, for llama.cpp's converter.

    bench_llamacpp_hf.py PACK OUT

Writes OUT/config.json (pack.toml [config] + a ModelOpt `quantization_config`),
OUT/hf_quant_config.json (`producer: modelopt`, `quant_algo: NVFP4`, group 16),
OUT/model.safetensors and a tokenizer.json symlink. convert_hf_to_gguf.py then
takes its ModelOpt NVFP4 path (conversion/base.py `_generate_nvfp4_tensors`) and
repacks every NVFP4 linear as GGML NVFP4 without dequantizing it.

model.safetensors holds the pack's tensors with byte-identical data in the pack's
order; only the pack's alignment fillers (`__kore_pad_*`) are left out, because
the converter would try to map them to GGUF names. The pack is in ModelOpt layout
already: weight U8 [N, K/2], weight_scale F8_E4M3 [N, K/16], weight_scale_2 F32.
A checksum of every copied tensor is compared with the source (--no-verify skips).
Only the standard library is needed.
"""
import argparse
import hashlib
import json
import os
import struct
import sys
import tomllib

PAD_PREFIX = "__kore_pad"
CHUNK = 64 << 20


def read_header(path):
    """The safetensors header (without __metadata__) and the data section's offset."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


def hf_config(pack):
    """config.json for Qwen3_5ForCausalLM with a ModelOpt NVFP4 quantization_config."""
    manifest = tomllib.load(open(os.path.join(pack, "pack.toml"), "rb"))
    cfg = dict(manifest["config"])
    cfg["model_type"] = "qwen3_5_text"
    cfg["architectures"] = ["Qwen3_5ForCausalLM"]
    cfg["torch_dtype"] = "bfloat16"
    quant = manifest.get("quantization", {})
    modules = quant.get("modules", {})
    excluded = sorted(m for m, kind in modules.items() if kind != "nvfp4")
    group = int(quant.get("group_size", 16))
    cfg["quantization_config"] = {
        "quant_method": "modelopt",
        "quant_algo": "NVFP4",
        "group_size": group,
        "exclude_modules": sorted(set(excluded) | {"lm_head", "model.embed_tokens"}),
    }
    return cfg, group


def copy_tensors(src, dst, verify):
    """Write dst with src's tensors minus the pad fillers; data bytes unchanged."""
    header, base = read_header(src)
    names = [k for k in header if not k.startswith(PAD_PREFIX)]
    names.sort(key=lambda k: header[k]["data_offsets"][0])
    plan, off = {}, 0
    for k in names:
        a, b = header[k]["data_offsets"]
        plan[k] = {"dtype": header[k]["dtype"], "shape": header[k]["shape"], "data_offsets": [off, off + b - a]}
        off += b - a
    plan["__metadata__"] = {"format": "pt", "source": "kore pack " + os.path.basename(os.path.abspath(os.path.dirname(src)))}
    hdr = json.dumps(plan).encode()
    hdr += b" " * (-len(hdr) % 8)
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        fout.write(struct.pack("<Q", len(hdr)) + hdr)
        for k in names:
            a, b = header[k]["data_offsets"]
            fin.seek(base + a)
            left = b - a
            while left:
                chunk = fin.read(min(CHUNK, left))
                if not chunk:
                    sys.exit(f"{src}: truncated inside tensor {k}; run `kore-launch pack verify` on the pack")
                fout.write(chunk)
                left -= len(chunk)
    if verify:
        check(src, dst, names)
    return len(names), off


def digest(path, header, base, name):
    a, b = header[name]["data_offsets"]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(base + a)
        left = b - a
        while left:
            chunk = f.read(min(CHUNK, left))
            h.update(chunk)
            left -= len(chunk)
    return h.hexdigest()


def check(src, dst, names):
    """Every tensor of dst has the same dtype, shape and bytes as in src."""
    hs, bs = read_header(src)
    hd, bd = read_header(dst)
    for k in names:
        if (hs[k]["dtype"], hs[k]["shape"]) != (hd[k]["dtype"], hd[k]["shape"]):
            sys.exit(f"{dst}: {k} dtype/shape differs from the pack")
        if digest(src, hs, bs, k) != digest(dst, hd, bd, k):
            sys.exit(f"{dst}: {k} bytes differ from the pack; delete {dst} and re-run")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pack")
    ap.add_argument("out")
    ap.add_argument("--no-verify", action="store_true", help="skip the per-tensor checksum comparison")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    cfg, group = hf_config(args.pack)
    json.dump(cfg, open(os.path.join(args.out, "config.json"), "w"), indent=1)
    hf_quant = {
        "producer": {"name": "modelopt", "version": "kore-pack"},
        "quantization": {
            "quant_algo": "NVFP4",
            "group_size": group,
            "exclude_modules": cfg["quantization_config"]["exclude_modules"],
        },
    }
    json.dump(hf_quant, open(os.path.join(args.out, "hf_quant_config.json"), "w"), indent=1)
    link = os.path.join(args.out, "tokenizer.json")
    if not os.path.lexists(link):
        os.symlink(os.path.abspath(os.path.join(args.pack, "tokenizer.json")), link)
    n, size = copy_tensors(
        os.path.join(args.pack, "weights.safetensors"),
        os.path.join(args.out, "model.safetensors"),
        not args.no_verify,
    )
    print(f"wrote {args.out}: {n} tensors, {size / 1e9:.2f} GB (pack bytes, fillers dropped)")


if __name__ == "__main__":
    main()
