#!/usr/bin/env python3
"""A ModelOpt-NVFP4 Hugging Face directory from a Kore pack, for llama.cpp's converter.

    bench_llamacpp_hf.py PACK OUT          # ModelOpt NVFP4 view (bytes unchanged)
    bench_llamacpp_hf.py --bf16 PACK OUT   # plain BF16 view, for llama-quantize

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

With --bf16 the directory is a plain BF16 checkpoint instead (no quantization
config): every NVFP4 linear is dequantized with its scales folded in (E2M1 code x
E4M3 block scale x weight_scale_2, rounded to nearest-even BF16), a q8 or NVFP4
output head of a tied model and an untied head's `lm_head_exact` copy are dropped (the converter then ties the output to the
BF16 embedding, and llama-quantize makes its own head from it), and every other
tensor is copied unchanged. This is what llama.cpp's users start from:
`llama-quantize` turns its GGUF into Q4_0 / Q4_K_M with llama.cpp's own rounding.
Needs numpy.
"""
import argparse
import hashlib
import json
import os
import struct
import sys
import tomllib

PAD_PREFIX = "__kore_pad"
# An untied NVFP4 head's q8 copy that only rescores its candidates in Kore
# (docs/pack-format.md): not a model tensor, so neither view carries it.
EXACT_PREFIX = "lm_head_exact."
CHUNK = 64 << 20


def read_header(path):
    """The safetensors header (without __metadata__) and the data section's offset."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


def hf_config(pack):
    """config.json for Qwen3_5ForCausalLM (Qwen3_5MoeForCausalLM for a pack with
    [config.moe], its keys at the top level as transformers names them) with a
    ModelOpt NVFP4 quantization_config."""
    manifest = tomllib.load(open(os.path.join(pack, "pack.toml"), "rb"))
    cfg = dict(manifest["config"])
    moe = cfg.pop("moe", None)
    if moe:
        cfg.update(moe)
        cfg.pop("intermediate_size", None)  # not a qwen3_5_moe_text key
        cfg["model_type"] = "qwen3_5_moe_text"
        cfg["architectures"] = ["Qwen3_5MoeForCausalLM"]
    else:
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
    names = [k for k in header if not k.startswith((PAD_PREFIX, EXACT_PREFIX))]
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


def e4m3_table():
    """Float value of every E4M3 (FN) byte; NaN for the two NaN codes."""
    out = []
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 3) & 0xF, b & 7
        if e == 15 and m == 7:
            out.append(float("nan"))
        elif e == 0:
            out.append(sign * m / 8 * 2.0**-6)
        else:
            out.append(sign * (1 + m / 8) * 2.0 ** (e - 7))
    return out


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
ROWS_PER_BLOCK = 1024


def bf16_plan(header, tied):
    """(output name, dtype, shape, kind, source names) per tensor of the BF16 view, in
    pack order; kind is "copy", "nvfp4" or "q8" (int8, one F16 scale per 32 columns)."""
    names = [k for k in header if not k.startswith((PAD_PREFIX, EXACT_PREFIX))]
    names.sort(key=lambda k: header[k]["data_offsets"][0])
    plan = []
    for k in names:
        if k.endswith(".weight_scale") or k.endswith(".weight_scale_2"):
            continue
        if tied and k.startswith("lm_head."):
            continue
        base = k[: -len(".weight")] if k.endswith(".weight") else None
        dtype, shape = header[k]["dtype"], header[k]["shape"]
        if base and dtype == "U8" and base + ".weight_scale_2" in header:
            n, half = shape
            srcs = (k, base + ".weight_scale", base + ".weight_scale_2")
            plan.append((k, "BF16", [n, 2 * half], "nvfp4", srcs))
        elif base and dtype == "I8" and base + ".weight_scale" in header:
            plan.append((k, "BF16", shape, "q8", (k, base + ".weight_scale")))
        else:
            plan.append((k, dtype, shape, "copy", (k,)))
    return plan


def write_bf16(src, dst, tied):
    """dst: the BF16 view of src (see the module docs); returns (tensors, bytes)."""
    import numpy as np

    header, base = read_header(src)
    plan = bf16_plan(header, tied)
    sizes = {"BF16": 2, "F16": 2, "F32": 4, "U8": 1, "I8": 1}
    meta, off = {}, 0
    for name, dtype, shape, kind, srcs in plan:
        n = sizes.get(dtype, 0)
        for d in shape:
            n *= d
        if kind == "copy":
            a, b = header[name]["data_offsets"]
            n = b - a
        meta[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    meta["__metadata__"] = {"format": "pt", "source": "kore pack, NVFP4 dequantized to BF16"}
    hdr = json.dumps(meta).encode()
    hdr += b" " * (-len(hdr) % 8)
    e2m1 = np.array(E2M1, dtype=np.float32)
    e4m3 = np.array(e4m3_table(), dtype=np.float32)

    def read(fin, name):
        a, b = header[name]["data_offsets"]
        fin.seek(base + a)
        data = fin.read(b - a)
        if len(data) != b - a:
            sys.exit(f"{src}: truncated inside tensor {name}; run `kore-launch pack verify` on the pack")
        return data

    with open(src, "rb") as fin, open(dst, "wb") as fout:
        fout.write(struct.pack("<Q", len(hdr)) + hdr)
        for name, dtype, shape, kind, srcs in plan:
            if kind == "copy":
                fout.write(read(fin, name))
                continue
            n, k = shape
            if kind == "nvfp4":
                codes = np.frombuffer(read(fin, srcs[0]), dtype=np.uint8).reshape(n, k // 2)
                scales = np.frombuffer(read(fin, srcs[1]), dtype=np.uint8).reshape(n, k // 16)
                gs = np.frombuffer(read(fin, srcs[2]), dtype=np.float32)[0]
            else:
                codes = np.frombuffer(read(fin, srcs[0]), dtype=np.int8).reshape(n, k)
                scales = np.frombuffer(read(fin, srcs[1]), dtype=np.float16).reshape(n, k // 32)
            for r0 in range(0, n, ROWS_PER_BLOCK):
                c = codes[r0 : r0 + ROWS_PER_BLOCK]
                if kind == "nvfp4":
                    w = np.empty((c.shape[0], k), dtype=np.float32)
                    w[:, 0::2] = e2m1[c & 0xF]
                    w[:, 1::2] = e2m1[c >> 4]
                    w *= np.repeat(e4m3[scales[r0 : r0 + ROWS_PER_BLOCK]] * gs, 16, axis=1)
                else:
                    s32 = scales[r0 : r0 + ROWS_PER_BLOCK].astype(np.float32)
                    w = c.astype(np.float32) * np.repeat(s32, 32, axis=1)
                u = w.view(np.uint32)
                bf = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
                fout.write(bf.tobytes())
    return len(plan), off


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pack")
    ap.add_argument("out")
    ap.add_argument("--no-verify", action="store_true", help="skip the per-tensor checksum comparison")
    ap.add_argument("--bf16", action="store_true", help="write a plain BF16 checkpoint (NVFP4 dequantized)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.bf16:
        return main_bf16(args)
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


def main_bf16(args):
    cfg, _ = hf_config(args.pack)
    del cfg["quantization_config"]
    json.dump(cfg, open(os.path.join(args.out, "config.json"), "w"), indent=1)
    link = os.path.join(args.out, "tokenizer.json")
    if not os.path.lexists(link):
        os.symlink(os.path.abspath(os.path.join(args.pack, "tokenizer.json")), link)
    n, size = write_bf16(
        os.path.join(args.pack, "weights.safetensors"),
        os.path.join(args.out, "model.safetensors"),
        bool(cfg.get("tie_word_embeddings")),
    )
    print(f"wrote {args.out}: {n} tensors, {size / 1e9:.2f} GB (BF16 view)")


if __name__ == "__main__":
    main()
