#!/usr/bin/env python3
"""Documents classified by the `jsonschema` package, for kore-grammar's tests.

For each schema: hand-written valid documents in the form the grammar generates (compact,
properties in schema order) plus seeded random mutations of them and random JSON values, each
serialized compactly and classified by jsonschema's Draft 2020-12 validator, and marked
canonical when valid and in the grammar's form (no keys beyond the declared properties unless
additionalProperties is given). The Rust test (appliance/grammar/tests/jsonschema_agreement.rs)
checks that every document the grammar accepts is valid, and that the canonical ones are
accepted.

Needs: pip install jsonschema. Writes appliance/grammar/tests/data/jsonschema_docs.json.
"""

import json
import random
from pathlib import Path

from jsonschema import Draft202012Validator

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "appliance/grammar/tests/data/jsonschema_docs.json"

CASES = [
    ({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
      "required": ["name"]},
     [{"name": "Ann"}, {"name": "B\"ob\n", "age": 42}, {"name": "", "age": -7}]),
    ({"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 3},
     [[1], [1.5, -2e-3, 0], [0.25, 7]]),
    ({"enum": ["red", "green", 3, None, True]}, ["red", 3, None, True]),
    ({"type": "object", "properties": {"ok": {"type": "boolean"}, "note": {"type": ["string", "null"]}},
      "required": ["ok", "note"]},
     [{"ok": True, "note": None}, {"ok": False, "note": "x\u00e9\u4e2d"}]),
    ({"anyOf": [{"type": "integer"}, {"type": "object", "properties": {"err": {"type": "string"}},
                                       "required": ["err"]}]},
     [5, {"err": "bad"}, -12]),
    ({"$defs": {"t": {"type": "object", "properties": {"v": {"type": "integer"},
                                                      "kids": {"type": "array", "items": {"$ref": "#/$defs/t"}}},
                      "required": ["v"]}}, "$ref": "#/$defs/t"},
     [{"v": 1}, {"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": []}]}]),
    ({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"],
      "additionalProperties": {"type": "boolean"}},
     [{"id": 1}, {"id": 2, "x": True, "y": False}]),
    ({"type": "object", "properties": {"c": {"const": "fixed"}, "n": {"type": "null"},
                                       "s": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}}},
     [{}, {"c": "fixed", "n": None, "s": ["a", "b"]}, {"s": []}]),
]

PIECES = [None, True, False, 0, -1, 1.5, 12345678901234, "", "a", "red", "fixed", "\"q\"", [], {}, [1, "a"],
          {"name": "x"}, {"v": 1}, {"err": 1}, {"ok": True}, {"id": "1"}]


def mutate(rng, doc):
    if isinstance(doc, dict) and doc and rng.random() < 0.5:
        d = dict(doc)
        k = rng.choice(list(d))
        op = rng.randrange(3)
        if op == 0:
            del d[k]
        elif op == 1:
            d[k] = rng.choice(PIECES)
        else:
            d["extra" + str(rng.randrange(3))] = rng.choice(PIECES)
        return d
    if isinstance(doc, list) and rng.random() < 0.5:
        d = list(doc)
        if d and rng.random() < 0.5:
            d[rng.randrange(len(d))] = rng.choice(PIECES)
        else:
            d.append(rng.choice(PIECES))
        return d
    return rng.choice(PIECES)


def declared(schema):
    """Every property name the schema declares anywhere."""
    out = set()
    if isinstance(schema, dict):
        out |= set(schema.get("properties", {}))
        for v in schema.values():
            out |= declared(v)
    elif isinstance(schema, list):
        for v in schema:
            out |= declared(v)
    return out


def keys(doc):
    if isinstance(doc, dict):
        return set(doc) | set().union(*(keys(v) for v in doc.values()))
    if isinstance(doc, list):
        return set().union(*(keys(v) for v in doc)) if doc else set()
    return set()


def compact(doc):
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def main():
    rng = random.Random(20261206)
    out = []
    for schema, valid in CASES:
        v = Draft202012Validator(schema)
        docs = [{"text": compact(d), "valid": True, "canonical": True} for d in valid]
        assert all(v.is_valid(d) for d in valid), schema
        seen = {d["text"] for d in docs}
        for _ in range(60):
            base = rng.choice(valid)
            d = mutate(rng, base)
            if rng.random() < 0.3:
                d = mutate(rng, d)
            text = compact(d)
            if text in seen:
                continue
            seen.add(text)
            ok = v.is_valid(json.loads(text))
            # The grammar writes declared properties only (unless additionalProperties is
            # given), in schema order; mutations keep the order and add "extraN" keys last.
            canonical = ok and ("additionalProperties" in schema or keys(d) <= declared(schema))
            docs.append({"text": text, "valid": ok, "canonical": canonical})
        out.append({"schema": schema, "docs": docs})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n")
    n = sum(len(c["docs"]) for c in out)
    print(f"wrote {len(out)} schemas, {n} documents to {OUT}")


if __name__ == "__main__":
    main()
