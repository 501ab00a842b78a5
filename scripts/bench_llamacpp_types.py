#!/usr/bin/env python3
"""Check that a GGUF holds the same weights as the Kore pack it came from.

    bench_llamacpp_types.py MODEL.gguf [--json]

Reads the GGUF with llama.cpp's gguf-py (put its directory on PYTHONPATH) and
prints the tensor count and bytes per GGML type, then checks the comparison's
premise: every projection (2-D `.weight` except the embedding, the output head
and the conv1d kernel) is NVFP4, and the embedding and output head are BF16 (a
tied output head is the embedding). Exits 1 with the offending tensors otherwise.
"""
import json
import sys
from collections import defaultdict

from gguf import GGUFReader

UNQUANTIZED = ("token_embd.weight", "output.weight")


def summarize(path):
    reader = GGUFReader(path)
    by_type = defaultdict(lambda: [0, 0])
    wrong = []
    for t in reader.tensors:
        kind = t.tensor_type.name
        by_type[kind][0] += 1
        by_type[kind][1] += int(t.n_bytes)
        is_matrix = sum(1 for d in t.shape if d > 1) >= 2
        if t.name in UNQUANTIZED:
            if kind != "BF16":
                wrong.append(f"{t.name}: {kind}, expected BF16")
        elif t.name.endswith(".weight") and is_matrix and "conv1d" not in t.name and kind != "NVFP4":
            wrong.append(f"{t.name}: {kind}, expected NVFP4")
    names = {t.name for t in reader.tensors}
    return by_type, wrong, "output.weight" not in names


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__.split("\n\n")[1].strip())
    by_type, wrong, tied = summarize(sys.argv[1])
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
