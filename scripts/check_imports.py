#!/usr/bin/env python3
"""Lists the import edges between the modules of Rust crates and fails on a cycle.

    python3 scripts/check_imports.py [--list] [--report-only DIR ...] [DIR ...]

Each DIR is a crate's `src/` (its root is `lib.rs` or `main.rs`). Without DIRs the
project's checked crates are taken: appliance/engine/src, appliance/service/src and
launcher/src.

A module is a file (`mod x;` -> `x.rs` or `x/mod.rs`); inline modules count as part of
their file, except `#[cfg(test)]` ones, which are left out (tests may reach anywhere).
An edge A -> B means that code of A names module B: in a `use` declaration, or in a path
in its code (`crate::b::..`, `super::..`, `self::..`, or a child module of A by name).
A path to an item that a module re-exports (`pub use x::Item`) leads to the module that
defines it. Edges between a module and its own ancestors are not counted: a child using
its parent's items and a parent re-exporting its children's are how a Rust module tree is
built, not a circle.

Two checks, both must pass:
  1. module level: no cycle among the modules (files);
  2. layer level: for every module, no cycle among its children, each child taken with
     all its descendants (so `kernels` and `simd` may not import each other at all, even
     through different files).

`--list` prints every edge. `--report-only DIR` checks DIR and prints its cycles
without failing (for crates whose circles are known and owned elsewhere).
Exit status: 0 when every strict crate passes, 1 otherwise.
"""

import os
import re
import sys
from collections import defaultdict

DEFAULT_STRICT = ["appliance/engine/src", "appliance/service/src", "launcher/src"]

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_comments_and_strings(src):
    """Source with comments, string and char literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            i = j
            continue
        if src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * src.count("\n", i, j))
            i = j
            continue
        m = re.match(r'(b|c)?r(#*)"', src[i:i + 12])
        if m and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            hashes = m.group(2)
            end = src.find('"' + hashes, i + m.end())
            end = n if end < 0 else end + 1 + len(hashes)
            out.append('""' + "\n" * src.count("\n", i, end))
            i = end
            continue
        if c == '"' or (c == "b" and src.startswith('b"', i)):
            j = i + (2 if c == "b" else 1)
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append('""' + "\n" * src.count("\n", i, j))
            i = j + 1
            continue
        if c == "'":
            # A char literal ('a', '\n', '\u{..}'), not a lifetime ('a).
            m = re.match(r"'(\\[^']*|[^\\'])'", src[i:i + 12])
            if m:
                out.append("' '")
                i += m.end()
                continue
        out.append(c)
        i += 1
    return "".join(out)


def matching_brace(src, open_at):
    depth = 0
    for j in range(open_at, len(src)):
        if src[j] == "{":
            depth += 1
        elif src[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(src) - 1


def drop_test_modules(src):
    """Removes `#[cfg(test)]` / `#[cfg(all(test, ..))]` inline modules and items."""
    pat = re.compile(r"#\[cfg\((?:all\()?test\b[^\]]*\]\s*(?:#\[[^\]]*\]\s*)*"
                     r"(?:pub(?:\([^)]*\))?\s+)?mod\s+" + IDENT + r"\s*\{")
    while True:
        m = pat.search(src)
        if not m:
            return src
        end = matching_brace(src, m.end() - 1)
        src = src[:m.start()] + "\n" * src.count("\n", m.start(), end + 1) + src[end + 1:]


class Module:
    def __init__(self, path, file):
        self.path = path  # tuple of names, () for the crate root
        self.file = file
        self.children = {}  # name -> Module
        self.code = ""
        self.reexports = {}  # item name -> absolute path tuple (from `pub use`)
        self.uses = []  # raw use paths (lists of segments)

    @property
    def name(self):
        return "crate" if not self.path else "::".join(self.path)


def child_file(parent_file, parent_is_dir_owner, name):
    base = os.path.dirname(parent_file)
    if not parent_is_dir_owner:
        stem = os.path.splitext(os.path.basename(parent_file))[0]
        base = os.path.join(base, stem)
    for cand in (os.path.join(base, name + ".rs"), os.path.join(base, name, "mod.rs")):
        if os.path.isfile(cand):
            return cand
    return None


def load_tree(src_dir):
    root_file = None
    for r in ("lib.rs", "main.rs"):
        if os.path.isfile(os.path.join(src_dir, r)):
            root_file = os.path.join(src_dir, r)
            break
    if root_file is None:
        raise SystemExit(f"{src_dir}: no lib.rs or main.rs")
    modules = {}

    def load(path, file):
        m = Module(path, file)
        modules[path] = m
        with open(file, encoding="utf-8") as f:
            code = drop_test_modules(strip_comments_and_strings(f.read()))
        owner = os.path.basename(file) in ("lib.rs", "main.rs", "mod.rs")
        decl = r"(#\[cfg\((?:all\()?test\b[^\]]*\]\s*)?(?:pub(?:\([^)]*\))?\s+)?mod\s+("
        for d in re.finditer(r"(?:^|[;}\]\s])" + decl + IDENT + r")\s*;", code):
            if d.group(1):
                continue  # a test-only module file
            cf = child_file(file, owner, d.group(2))
            if cf:
                m.children[d.group(2)] = load(path + (d.group(2),), cf)
        m.code = code
        return m

    load((), root_file)
    return modules


def expand_use_tree(tree):
    """`a::{b, c::{d, self}}` -> [[a,b],[a,c,d],[a,c]] (renames dropped)."""
    tree = re.sub(r"\s+", "", tree)
    tree = re.sub(r"\bas" + IDENT, "", tree)

    def split_top(s):
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
                continue
            depth += ch == "{"
            depth -= ch == "}"
            cur += ch
        if cur:
            parts.append(cur)
        return parts

    def go(prefix, s):
        if "{" in s:
            head, rest = s.split("{", 1)
            inner = rest[: rest.rfind("}")]
            head_segs = [x for x in head.split("::") if x]
            res = []
            for part in split_top(inner):
                res.extend(go(prefix + head_segs, part))
            return res
        segs = [x for x in s.split("::") if x]
        if segs and segs[-1] == "self":
            segs = segs[:-1]
        return [prefix + segs]

    return go([], tree)


USE_RE = re.compile(r"(?:^|[;{}\s])(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);")


def collect_uses(mods):
    for m in mods.values():
        for u in USE_RE.finditer(m.code):
            public = bool(u.group(1)) and u.group(1).strip() == "pub"
            for segs in expand_use_tree(u.group(2)):
                if not segs or segs[-1] == "*":
                    segs = [s for s in segs if s != "*"]
                m.uses.append(segs)
                if public and segs and segs[0] in ("crate", "super", "self") | m.children.keys():
                    absolute = resolve_prefix(mods, m, segs)
                    if absolute is not None:
                        m.reexports[segs[-1]] = absolute


def resolve_prefix(mods, m, segs):
    """Absolute segment list of a crate-relative path written in module `m`."""
    if not segs:
        return None
    cur = list(m.path)
    i = 0
    if segs[0] == "crate":
        cur, i = [], 1
    elif segs[0] in ("super", "self"):
        while i < len(segs) and segs[i] in ("super", "self"):
            if segs[i] == "super":
                if not cur:
                    return None
                cur = cur[:-1]
            i += 1
    elif segs[0] not in m.children:
        return None
    return tuple(cur) + tuple(segs[i:])


def target_module(mods, absolute, depth=0):
    """The module an absolute path leads to, following re-exports of items."""
    mod = mods[()]
    for k, seg in enumerate(absolute):
        if seg in mod.children:
            mod = mod.children[seg]
            continue
        if seg in mod.reexports and depth < 8:
            re_abs = mod.reexports[seg]
            if tuple(re_abs) != tuple(mod.path) + (seg,):
                return target_module(mods, tuple(re_abs) + tuple(absolute[k + 1:]), depth + 1)
        break
    return mod.path


PATH_RE = re.compile(r"(?<![A-Za-z0-9_:])((?:" + IDENT + r")(?:::" + IDENT + r")+)")


def edges_of(mods):
    edges = defaultdict(set)
    for m in mods.values():
        paths = list(m.uses)
        code_wo_uses = USE_RE.sub(" ", m.code)
        for p in PATH_RE.finditer(code_wo_uses):
            segs = p.group(1).split("::")
            if segs[0] in ("crate", "super", "self") or segs[0] in m.children:
                paths.append(segs)
        for segs in paths:
            absolute = resolve_prefix(mods, m, segs)
            if absolute is None:
                continue
            t = target_module(mods, absolute)
            if t == m.path or is_ancestor(t, m.path) or is_ancestor(m.path, t):
                continue
            edges[m.path].add(t)
    return edges


def is_ancestor(a, b):
    return len(a) < len(b) and b[: len(a)] == a


def find_cycles(nodes, edges):
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def layer_cycles(mods, edges):
    """Cycles among the children of each module, each child with its subtree."""
    found = []
    for parent in mods.values():
        kids = list(parent.children)
        if len(kids) < 2:
            continue
        depth = len(parent.path)
        layer = defaultdict(set)
        for a, targets in edges.items():
            if not is_ancestor(parent.path, a):
                continue
            for b in targets:
                if is_ancestor(parent.path, b) and a[depth] != b[depth]:
                    layer[a[depth]].add(b[depth])
        for comp in find_cycles(kids, layer):
            witnesses = [
                f"{name(a)} -> {name(b)}"
                for a, ts in sorted(edges.items())
                for b in sorted(ts)
                if is_ancestor(parent.path, a) and is_ancestor(parent.path, b)
                and a[depth] in comp and b[depth] in comp and a[depth] != b[depth]
            ]
            found.append((parent.path, comp, witnesses))
    return found


def name(path):
    return "crate" if not path else "::".join(path)


def check(src_dir, list_edges):
    mods = load_tree(src_dir)
    collect_uses(mods)
    edges = edges_of(mods)
    n_edges = sum(len(v) for v in edges.values())
    print(f"{src_dir}: {len(mods)} modules, {n_edges} edges")
    if list_edges:
        for a in sorted(edges):
            for b in sorted(edges[a]):
                print(f"  {name(a)} -> {name(b)}")
    bad = 0
    for comp in find_cycles(list(mods), edges):
        bad += 1
        members = set(comp)
        print(f"  module cycle: {', '.join(name(c) for c in comp)}")
        for a in comp:
            for b in sorted(edges[a]):
                if b in members:
                    print(f"    {name(a)} -> {name(b)}")
    for parent, comp, witnesses in layer_cycles(mods, edges):
        bad += 1
        prefix = "" if not parent else name(parent) + "::"
        print(f"  layer cycle under {name(parent)}: {', '.join(prefix + c for c in comp)}")
        for w in witnesses:
            print(f"    {w}")
    return bad


def main(argv):
    list_edges = "--list" in argv
    argv = [a for a in argv if a != "--list"]
    strict, report = [], []
    i = 0
    while i < len(argv):
        if argv[i] == "--report-only":
            report.append(argv[i + 1])
            i += 2
        else:
            strict.append(argv[i])
            i += 1
    if not strict and not report:
        strict = DEFAULT_STRICT
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    failed = []
    for d in strict + report:
        path = d if os.path.isabs(d) else os.path.join(root, d)
        bad = check(path, list_edges)
        if bad and d in strict:
            failed.append(d)
        elif bad:
            print(f"  ({bad} cycles reported, not failing: --report-only)")
    if failed:
        print(f"import cycles in: {', '.join(failed)}")
        return 1
    print("no import cycles")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
