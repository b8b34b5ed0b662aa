#!/usr/bin/env python3
"""Circles in the module graph of the library (src/, the CLI in src/bin/ left out), and references from
src/ to files outside it (`include_str!`, `include_bytes!`, wasm-bindgen snippets).

A module is a file (`a/b.rs` and `a/b/mod.rs` are `a::b`). An edge is a path in its code: `crate::a::b`,
`super::x`, `self::x` (and the names inside a `{...}` list after one), resolved to the longest existing
module. `#[cfg(doc)]` imports do not count. Rooms are the top-level modules. A circle is a strongly
connected set of more than one module: between rooms (the rooms' graph) or inside one room.

Usage: python3 scripts/ci/module_circles.py [SRC]   (exit status 1 when there is a circle or a reference
out of src/; scripts/test.sh runs it). Cargo forbids cycles between crates; this keeps the one crate's
modules acyclic the same way.
"""
import os
import re
import sys
from collections import defaultdict

PATH = re.compile(r"\b(crate|super|self)((?:::\w+)+)(::\{([^}]*)\})?")
INCLUDE = re.compile(r'(?:include_str!|include_bytes!)\("([^"]+)"\)|module\s*=\s*"(/[^"]+)"')


def modules(src):
    """{module path tuple: file} for every .rs file under src/ except the binaries."""
    out = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            p = os.path.join(root, f)
            rel = os.path.relpath(p, src)[:-3].split(os.sep)
            if rel[0] == "bin":
                continue
            if rel[-1] == "mod":
                rel = rel[:-1]
            if rel == ["lib"]:
                rel = []
            out[tuple(rel)] = p
    return out


def code(text):
    """The text without comments and doc-only imports."""
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r"#\[cfg\(doc\)\]\s*use[^;]*;", "", text)


def edges_of(m, text, mods):
    """The modules `m` refers to."""
    out = set()
    for hit in PATH.finditer(text):
        kind, path, names = hit.group(1), hit.group(2).strip(":").split("::"), hit.group(4)
        base = [] if kind == "crate" else list(m) if kind == "self" else list(m[:-1])
        candidates = [base + path]
        for name in (names or "").split(","):
            name = name.strip().split("::")[0].split(" ")[0]
            if name and name != "self":
                candidates.append(base + path + [name])
        for c in candidates:
            for k in range(len(c), 0, -1):
                t = tuple(c[:k])
                if t in mods:
                    if t != m:
                        out.add(t)
                    break
    return out


def circles(nodes, adj):
    """Strongly connected sets of more than one node (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(n):
        index[n] = low[n] = counter[0]
        counter[0] += 1
        stack.append(n)
        on.add(n)
        for w in adj.get(n, ()):
            if w not in nodes:
                continue
            if w not in index:
                visit(w)
                low[n] = min(low[n], low[w])
            elif w in on:
                low[n] = min(low[n], index[w])
        if low[n] == index[n]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == n:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for n in sorted(nodes):
        if n not in index:
            visit(n)
    return found


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "src"
    mods = modules(src)
    edges, outside = defaultdict(set), []
    for m, p in mods.items():
        text = code(open(p, encoding="utf-8").read())
        edges[m] = edges_of(m, text, mods)
        for hit in INCLUDE.finditer(text):
            rel, root = hit.group(1), hit.group(2)
            full = os.path.normpath(os.path.join(os.path.dirname(p), rel) if rel else "." + root)
            if not full.startswith(os.path.normpath(src)) and not full.startswith("shaders"):
                outside.append((p, rel or root))
    room = lambda m: m[0] if m else "(lib)"
    rooms_adj = defaultdict(set)
    for a, bs in edges.items():
        rooms_adj[room(a)].update(room(b) for b in bs if room(b) != room(a))
    between = circles({room(m) for m in mods}, rooms_adj)
    inside = []
    for r in sorted({room(m) for m in mods}):
        nodes = {m for m in mods if room(m) == r}
        inside += circles(nodes, {a: {b for b in edges[a] if b in nodes} for a in nodes})
    name = lambda m: "::".join(m) if isinstance(m, tuple) else m
    print(f"{len(mods)} modules; circles between top-level modules: {len(between)}; "
          f"inside one: {len(inside)}; references out of {src}/: {len(outside)}")
    for c in between + inside:
        print("  circle:", " -> ".join(name(m) for m in c))
    for p, rel in outside:
        print(f"  {p} reaches out of {src}/: {rel}")
    return 1 if between or inside or outside else 0


if __name__ == "__main__":
    sys.exit(main())
