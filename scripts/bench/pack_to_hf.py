#!/usr/bin/env python3
"""Hugging Face views of a Kore pack, for benchmarks.

    pack_to_hf.py PACK OUT_BF16 [VIEW]

OUT_BF16: config.json (from pack.toml [config]) + model.safetensors with every
NVFP4 Linear dequantized to bf16 (W = e2m1(code) * e4m3(scale) * scale_2, the
ModelOpt layout) for llama.cpp's convert_hf_to_gguf.py.
VIEW: config.json + symlinks to the pack's own files (NVFP4 kept), for
`kore-launch bench --native` while packs cannot be opened natively.
Only numpy is needed.
"""
import json, os, struct, sys, tomllib

import numpy as np

E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def e4m3(b):
    b = b.astype(np.uint32)
    bits = ((b & 0x7F) << 20) | ((b & 0x80) << 24)
    return bits.view(np.float32) * np.float32(2.0 ** 120)


def read(path):
    f = open(path, "rb")
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    data = np.memmap(path, np.uint8, "r", offset=8 + n)
    return header, data


def config(pack):
    c = tomllib.load(open(os.path.join(pack, "pack.toml"), "rb"))["config"]
    c["model_type"] = "qwen3_5_text"
    c["architectures"] = ["Qwen3_5ForCausalLM"]
    c["torch_dtype"] = "bfloat16"
    return c


def bf16_bits(x):
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def main():
    pack, out = sys.argv[1], sys.argv[2]
    view = sys.argv[3] if len(sys.argv) > 3 else None
    cfg = config(pack)
    if view:
        os.makedirs(view, exist_ok=True)
        json.dump(cfg, open(os.path.join(view, "config.json"), "w"), indent=1)
        for src, dst in [("weights.safetensors", "model.safetensors"), ("tokenizer.json", "tokenizer.json")]:
            link = os.path.join(view, dst)
            if not os.path.lexists(link):
                os.symlink(os.path.abspath(os.path.join(pack, src)), link)
    os.makedirs(out, exist_ok=True)
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)
    for f in ["tokenizer.json"]:
        if not os.path.lexists(os.path.join(out, f)):
            os.symlink(os.path.abspath(os.path.join(pack, f)), os.path.join(out, f))
    header, data = read(os.path.join(pack, "weights.safetensors"))
    skip = (".weight_scale", ".weight_scale_2", ".input_scale")
    names = [k for k in sorted(header) if not k.endswith(skip) and not k.startswith("__kore_pad")]

    def raw(k):
        a, b = header[k]["data_offsets"]
        return data[a:b]

    # Pass 1: the header (shapes and dtypes of the output).
    plan, off = {}, 0
    for k in names:
        t = header[k]
        if t["dtype"] == "U8" and k + "_scale" in header:
            shape, dtype = [t["shape"][0], t["shape"][1] * 2], "BF16"
        else:
            shape, dtype = t["shape"], t["dtype"]
        size = int(np.prod(shape)) * {"BF16": 2, "F16": 2, "F32": 4}[dtype]
        plan[k] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + size]}
        off += size
    hdr = json.dumps(plan).encode()
    hdr += b" " * (-len(hdr) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr)
        for k in names:
            t = header[k]
            if plan[k]["dtype"] == "BF16" and t["dtype"] == "U8":
                rows, half = t["shape"]
                packed = np.asarray(raw(k)).reshape(rows, half)
                scales = e4m3(np.asarray(raw(k + "_scale")).reshape(rows, half // 8))
                g = np.frombuffer(raw(k + "_scale_2").tobytes(), np.float32)[0]
                for r0 in range(0, rows, 1024):
                    p = packed[r0:r0 + 1024]
                    codes = np.stack([p & 15, p >> 4], axis=-1).reshape(p.shape[0], -1)
                    w = E2M1[codes] * np.repeat(scales[r0:r0 + 1024] * g, 16, axis=1)
                    f.write(bf16_bits(w).tobytes())
            else:
                f.write(np.asarray(raw(k)).tobytes())
    print(f"wrote {out} ({off / 1e9:.2f} GB)")


if __name__ == "__main__":
    main()
