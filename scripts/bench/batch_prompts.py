#!/usr/bin/env python3
"""The 64-prompt batch of docs/batched-decode.md, as JSON lines on stdout.

    batch_prompts.py [MAX_TOKENS] > p64.jsonl

Prompt i is 4 + i % 5 words taken in turn from a fixed sentence starting at
word 3i; odd lines are sampled (temperature 0.8, top_k 40, seed i), even
lines greedy; every line asks for MAX_TOKENS (default 48). Then
`kore-launch batch p64.jsonl -o OUT --native --model PACK --concurrency N`.
"""
import json
import sys

WORDS = ("the quick brown fox jumps over a lazy dog while seven bright stars "
         "watch quietly from far away").split()


def main():
    max_tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 48
    for i in range(64):
        words = [WORDS[(3 * i + j) % len(WORDS)] for j in range(4 + i % 5)]
        line = {"id": i, "prompt": " ".join(words), "max_tokens": max_tokens}
        if i % 2:
            line.update(temperature=0.8, top_k=40, seed=i)
        print(json.dumps(line))


if __name__ == "__main__":
    main()
