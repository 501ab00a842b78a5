#!/usr/bin/env python3
"""Independent NVFP4 reference (ModelOpt layout and arithmetic) and fixture writer.

This re-derives NVIDIA ModelOpt's NVFP4 weight quantization (NVFP4QTensor,
dynamic weight path) with numpy only, by a different method than kore-pack's
Rust code: E4M3 and E2M1 rounding are done by searching the full value tables
for the nearest value (ties to the even code), not by bit manipulation or
bound tables. All arithmetic that ModelOpt does in float32 is done in float32
here, in the same order:

    s2    = amax(|W|) / (6 * 448)
    s     = block_amax / (6 * s2);  s == 0 -> 1;  clamp to [2**-9, 448];  e4m3(s)
    q     = x / (f32(e4m3(s)) * s2)  -> nearest E2M1 value, ties to the even code
    byte  = code[2i] | code[2i+1] << 4

One documented difference: an all-zero weight (s2 == 0) gives NaN scales in
ModelOpt; kore-pack (and this reference) write codes 0, scales 1.0, s2 = 0.

If `modelopt` (nvidia-modelopt) and torch import, every case is also checked
byte for byte against ModelOpt's own NVFP4QTensor.quantize.

Writes model-packs/tools/tests/fixtures/nvfp4_reference.safetensors with, per case,
`caseN.input` (BF16 or F32) and the expected `caseN.weight` (U8),
`caseN.weight_scale` (F8_E4M3) and `caseN.weight_scale_2` (F32 scalar).
The Rust test `nvfp4_reference` asserts kore-pack produces identical bytes.

Usage: python3 scripts/packs/nvfp4_reference.py [--out PATH] [--no-modelopt]
"""

import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np

F32 = np.float32
GROUP = 16


def e4m3_table():
    """Value of each E4M3 (float8_e4m3fn) code 0..126 (positive, finite)."""
    vals = []
    for code in range(0x7F):
        exp, mant = code >> 3, code & 7
        if exp == 0:
            vals.append(mant * 2.0**-9)
        else:
            vals.append((1 + mant / 8) * 2.0 ** (exp - 7))
    return np.array(vals, dtype=np.float64)


E4M3 = e4m3_table()
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float64)


def nearest_even(table, a):
    """Index of the table value nearest to a; ties go to the even index."""
    d = np.abs(table - float(a))
    best = d.min()
    idx = np.nonzero(d == best)[0]
    if len(idx) == 1:
        return int(idx[0])
    even = [i for i in idx if i % 2 == 0]
    return int(even[0])


def to_e4m3(s):
    # Saturate above the largest value (ModelOpt clamps to 448 before casting).
    if s >= 448.0:
        return 0x7E
    return nearest_even(E4M3, s)


def to_e2m1(q):
    q = F32(q)
    sign = 8 if q < 0 else 0
    a = abs(float(q))
    if a > 6.0:
        return sign | 7
    return sign | nearest_even(E2M1, a)


def quantize(x):
    """x: float32 array [N, K]. Returns (packed u8 [N, K/2], scales u8 [N, K/16], s2 f32)."""
    x = x.astype(F32)
    n, k = x.shape
    assert k % GROUP == 0
    amax = F32(np.max(np.abs(x))) if x.size else F32(0)
    s2 = F32(amax / F32(6.0 * 448.0))
    codes = np.zeros((n, k), dtype=np.uint8)
    scales = np.full((n, k // GROUP), 0x38, dtype=np.uint8)
    if s2 > 0:
        six_s2 = F32(F32(6.0) * s2)
        for r in range(n):
            for b in range(k // GROUP):
                blk = x[r, b * GROUP:(b + 1) * GROUP]
                bamax = F32(np.max(np.abs(blk)))
                s = F32(bamax / six_s2)
                if s == 0:
                    s = F32(1.0)
                s = F32(min(max(float(s), 2.0**-9), 448.0))
                code = to_e4m3(s)
                scales[r, b] = code
                d = F32(F32(E4M3[code]) * s2)
                for j in range(GROUP):
                    codes[r, b * GROUP + j] = to_e2m1(F32(blk[j] / d))
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return packed, scales, s2


def to_bf16_bits(x):
    """float32 -> bfloat16 bits, round to nearest even (inputs are finite)."""
    u = np.asarray(x, dtype=F32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def from_bf16_bits(b):
    return (b.astype(np.uint32) << 16).view(F32)


def cases():
    rng = np.random.default_rng(20261202)
    out = []
    # 1. plain random weights
    out.append(("bf16", rng.normal(0, 0.02, (8, 64))))
    # 2. exact ties: s2 = 2**-10 (amax 2.625), block scale 4, q = t exactly
    t = [6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -0.75, -2.5, -3.5, -5, 0.0, -0.0, 4.5]
    tie = np.zeros((4, 32))
    tie[0, 0] = 2.625
    tie[1, :16] = np.array(t) * 2.0**-8
    tie[2, 16:] = np.array(t[::-1]) * 2.0**-8
    tie[3, :16] = np.array([5.0, 0.75, 3.5, 1.75] * 4) * 2.0**-8 * 0.5
    out.append(("bf16", tie))
    # 3. huge dynamic range: subnormal and clamped block scales, zero blocks
    wide = rng.normal(0, 1, (6, 48)) * (10.0 ** -np.arange(6))[:, None] * 3
    wide[2, 16:32] = 0
    wide[5, :] = 0
    out.append(("bf16", wide))
    # 4. all-zero weight (documented difference from ModelOpt)
    out.append(("bf16", np.zeros((2, 32))))
    # 5. float32 input with outliers
    f = rng.standard_t(2, (16, 64)) * 0.05
    out.append(("f32", f))
    # 6. a single block
    out.append(("bf16", rng.normal(0, 1, (1, 16))))
    # 7. heavier, larger
    out.append(("bf16", rng.standard_t(3, (32, 256)) * 0.01))
    # 8. values near E2M1 bounds after scaling, random signs
    base = rng.choice([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], (8, 32)) * rng.choice([-1, 1], (8, 32))
    jitter = 1 + rng.normal(0, 1e-3, (8, 32))
    out.append(("bf16", base * jitter * 0.01))
    return out


def write_safetensors(path, tensors):
    """Minimal safetensors writer: tensors = [(name, dtype, shape, bytes)]."""
    header, offset, blobs = {}, 0, []
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def modelopt_check(inputs, expected):
    try:
        import torch
        from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor
    except Exception as e:  # noqa: BLE001
        print(f"modelopt not importable ({type(e).__name__}: {e}); reference-only")
        return None
    ok = True
    for i, ((kind, x), (packed, scales, s2)) in enumerate(zip(inputs, expected)):
        if kind == "bf16":
            t = torch.from_numpy(to_bf16_bits(x).view(np.int16)).view(torch.bfloat16)
        else:
            t = torch.from_numpy(x.astype(F32))
        if not torch.any(t != 0):
            print(f"case{i}: all-zero weight, ModelOpt gives NaN scales (documented difference), skipped")
            continue
        q, sc, g = NVFP4QTensor.quantize(t.clone(), GROUP)
        same = (
            np.array_equal(q._quantized_data.numpy(), packed)
            and np.array_equal(sc.view(torch.uint8).numpy(), scales)
            and g.float().numpy().tobytes() == np.array(s2, dtype=F32).tobytes()
        )
        print(f"case{i}: modelopt {'equal' if same else 'DIFFERENT'}")
        ok &= same
    return ok


def main():
    ap = argparse.ArgumentParser()
    root = Path(__file__).resolve().parents[2]
    ap.add_argument("--out", default=root / "model-packs/tools/tests/fixtures/nvfp4_reference.safetensors")
    ap.add_argument("--no-modelopt", action="store_true")
    args = ap.parse_args()
    inputs, expected, tensors = [], [], []
    for i, (kind, x) in enumerate(cases()):
        if kind == "bf16":
            bits = to_bf16_bits(x)
            xin = from_bf16_bits(bits).reshape(x.shape)
            tensors.append((f"case{i}.input", "BF16", x.shape, bits.tobytes()))
        else:
            xin = x.astype(F32)
            tensors.append((f"case{i}.input", "F32", x.shape, xin.tobytes()))
        inputs.append((kind, xin))
        packed, scales, s2 = quantize(xin)
        expected.append((packed, scales, s2))
        tensors.append((f"case{i}.weight", "U8", packed.shape, packed.tobytes()))
        tensors.append((f"case{i}.weight_scale", "F8_E4M3", scales.shape, scales.tobytes()))
        tensors.append((f"case{i}.weight_scale_2", "F32", (), np.array(s2, dtype=F32).tobytes()))
    if not args.no_modelopt:
        ok = modelopt_check(inputs, expected)
        if ok is False:
            print("reference disagrees with ModelOpt", file=sys.stderr)
            sys.exit(1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_safetensors(args.out, tensors)
    print(f"wrote {args.out} ({len(inputs)} cases)")


if __name__ == "__main__":
    main()
