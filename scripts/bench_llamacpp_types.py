#!/usr/bin/env python3
"""Check that a GGUF holds the same weights as the Kore pack it came from.

    bench_llamacpp_types.py MODEL.gguf [--json] [--expect nvfp4|bf16|any] [--bytes-per-token]

Reads the GGUF with llama.cpp's gguf-py (put its directory on PYTHONPATH) and
prints the tensor count and bytes per GGML type, then checks the comparison's
premise (`--expect`, default nvfp4): every projection (2-D `.weight` except the
embedding, the output head and the conv1d kernel) is NVFP4 (or BF16 with
`--expect bf16`, the source of llama-quantize; `any` checks nothing, for its
Q4_0 / Q4_K_M outputs), and the embedding and output head are BF16 (a tied
output head is the embedding). An MoE router (`ffn_gate_inp`) may be F32: the
converter writes it so whatever the output type. Exits 1 with the offending tensors otherwise.

`--bytes-per-token` prints only the weight bytes one decode step reads: every
tensor, less the embedding when a separate output head exists (a token reads
one embedding row), less MTP (`nextn`) tensors; of an MoE model's stacked
expert tensors (`*_exps`) only the routed share, expert_used_count of
expert_count.
"""
import json
import sys
from collections import defaultdict

from gguf import GGUFReader

UNQUANTIZED = ("token_embd.weight", "output.weight")


def summarize(path, expect="nvfp4"):
    reader = GGUFReader(path)
    by_type = defaultdict(lambda: [0, 0])
    wrong = []
    want = expect.upper()
    for t in reader.tensors:
        kind = t.tensor_type.name
        by_type[kind][0] += 1
        by_type[kind][1] += int(t.n_bytes)
        is_matrix = sum(1 for d in t.shape if d > 1) >= 2
        if expect == "any":
            continue
        if t.name in UNQUANTIZED:
            if kind != "BF16":
                wrong.append(f"{t.name}: {kind}, expected BF16")
        elif ".ffn_gate_inp" in t.name and kind == "F32":
            continue  # an MoE router (and shared-expert gate): the converter keeps it F32
        elif t.name.endswith(".weight") and is_matrix and "conv1d" not in t.name and kind != want:
            wrong.append(f"{t.name}: {kind}, expected {want}")
    names = {t.name for t in reader.tensors}
    return by_type, wrong, "output.weight" not in names


def expert_share(reader):
    """(experts used per token, experts) from the GGUF's metadata; (1, 1) if dense."""
    used = count = None
    for key, field in reader.fields.items():
        if key.endswith(".expert_used_count"):
            used = int(field.parts[field.data[0]][0])
        elif key.endswith(".expert_count"):
            count = int(field.parts[field.data[0]][0])
    return (used, count) if used and count else (1, 1)


def bytes_per_token(path):
    """Weight bytes a decode step reads (see the module docs)."""
    reader = GGUFReader(path)
    tensors = reader.tensors
    used, count = expert_share(reader)
    names = {t.name for t in tensors}
    total = 0
    for t in tensors:
        if "nextn" in t.name:
            continue
        if t.name == "token_embd.weight" and "output.weight" in names:
            continue
        n = int(t.n_bytes)
        total += n * used // count if "_exps." in t.name else n
    return total


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__.split("\n\n")[1].strip())
    args = sys.argv[2:]
    if "--bytes-per-token" in args:
        print(bytes_per_token(sys.argv[1]))
        return
    expect = args[args.index("--expect") + 1] if "--expect" in args else "nvfp4"
    if expect not in ("nvfp4", "bf16", "any"):
        sys.exit(f"--expect {expect}: one of nvfp4, bf16, any")
    by_type, wrong, tied = summarize(sys.argv[1], expect)
    if "--json" in sys.argv[2:]:
        print(json.dumps({k: {"tensors": n, "bytes": b} for k, (n, b) in sorted(by_type.items())}))
    else:
        for kind, (n, b) in sorted(by_type.items()):
            print(f"{kind:>6}: {n:4d} tensors, {b / 1e9:6.3f} GB")
        print("output head: " + ("tied to token_embd" if tied else "output.weight"))
    if wrong:
        print("not the pack's weight types:\n  " + "\n  ".join(wrong), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
