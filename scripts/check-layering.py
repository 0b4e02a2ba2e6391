#!/usr/bin/env python3
"""check-layering.py: module layering rules for the crates under crates/*/src.

Run from the repository root. For each crate it builds the graph of module ->
module references made with `use crate::...`, `crate::a::b::...`, `super::...`
and `self::...` paths (a module is a file; lib.rs, main.rs and mod.rs stand for
their directory's module; inline `mod x { }` blocks belong to their file) and
reports, one line each:

  (a) in ferry-engine, any reference between a module under `capture` and one
      under `restore` (in either direction): the two sides share code through
      modules that import neither;
  (b) every import cycle: a strongly connected component of more than one
      module, after dropping the edges between a module and its own ancestors
      or descendants (a parent declaring and calling its children, and the
      children using their parent's types, is containment, not a cycle).

Comments (doc links included) and string literals are not references.
Exit status 1 when anything is reported, else 0.
"""
import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip(text):
    """The text with comments, strings and char literals blanked out (newlines kept)."""
    out = []
    i, n = 0, len(text)

    def blank(s):
        return "".join("\n" if c == "\n" else " " for c in s)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(blank(text[i:j]))
            i = j
        elif re.match(r'b?r#*"', text[i : i + 8]) and (i == 0 or not re.match(r"\w", text[i - 1])):
            m = re.match(r'b?r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append(blank(text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(blank(text[i : j + 1]))
            i = j + 1
        elif c == "'":
            m = re.match(r"'(\\(x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^'\\\n])'", text[i:])
            if m:
                out.append(blank(m.group(0)))
                i += m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def inline_mods(code):
    """(start, end, name) of every inline `mod name { ... }` block."""
    spans = []
    for m in re.finditer(r"\bmod\s+(" + IDENT + r")\s*\{", code):
        depth, j = 1, m.end()
        while j < len(code) and depth:
            if code[j] == "{":
                depth += 1
            elif code[j] == "}":
                depth -= 1
            j += 1
        spans.append((m.end(), j, m.group(1)))
    return spans


def expand_use(tree):
    """The paths (lists of segments) a `use` tree names: `a::{b, c::{d, self}}`."""
    toks = re.findall(r"::|\{|\}|,|\*|" + IDENT, tree)
    pos = 0

    def parse(prefix):
        nonlocal pos
        paths = []
        seg = list(prefix)
        while pos < len(toks):
            t = toks[pos]
            if t == "::":
                pos += 1
            elif t == "{":
                pos += 1
                while pos < len(toks) and toks[pos] != "}":
                    if toks[pos] == ",":
                        pos += 1
                        continue
                    paths += parse(seg)
                pos += 1
                return paths
            elif t in ("}", ","):
                break
            elif t == "as":
                pos += 2
            elif t == "self":
                pos += 1
            else:
                seg.append(t)
                pos += 1
        paths.append(seg)
        return paths

    return parse([])


def module_of(path, src):
    rel = os.path.relpath(path, src)[: -len(".rs")].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)


def resolve(base, segs, modules):
    """The file module a path from `base` (a module path, maybe inside inline
    mods) names: the longest known prefix, or None for paths outside the crate."""
    if not segs or segs[0] not in ("crate", "super", "self"):
        return None
    cur = list(base)
    rest = list(segs)
    if rest[0] == "crate":
        cur, rest = [], rest[1:]
    while rest and rest[0] in ("super", "self"):
        if rest[0] == "super":
            cur = cur[:-1]
        rest = rest[1:]
    full = cur + [s for s in rest if s != "*"]
    for k in range(len(full), -1, -1):
        if tuple(full[:k]) in modules:
            return tuple(full[:k])
    return None


def crate_graph(src):
    files = {}
    for root, dirs, names in os.walk(src):
        dirs[:] = [d for d in dirs if not (root == src and d == "bin")]
        for f in names:
            if f.endswith(".rs"):
                p = os.path.join(root, f)
                files[module_of(p, src)] = p
    modules = set(files)
    edges = {}  # (from, to) -> first "file:line" making it
    for mod, path in sorted(files.items()):
        code = strip(open(path, errors="replace").read())
        spans = inline_mods(code)

        def base_at(p):
            return mod + tuple(name for (s, e, name) in spans if s <= p < e)

        def add(p, segs):
            to = resolve(base_at(p), segs, modules)
            if to is not None and to != mod:
                line = code.count("\n", 0, p) + 1
                where = "%s:%d" % (os.path.relpath(path, src), line)
                edges.setdefault((mod, to), where)

        uses = list(re.finditer(r"\buse\s+([^;]*);", code))
        for m in uses:
            for segs in expand_use(m.group(1)):
                add(m.start(), segs)
        in_use = [(m.start(), m.end()) for m in uses]
        path_re = r"\b(crate|super|self)((?:\s*::\s*" + IDENT + r")+)"
        for m in re.finditer(path_re, code):
            if any(s <= m.start() < e for s, e in in_use):
                continue
            segs = [m.group(1)] + re.findall(IDENT, m.group(2))
            add(m.start(), segs)
    return modules, edges


def related(a, b):
    return a[: len(b)] == b or b[: len(a)] == a


def sccs(nodes, succ):
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        # iterative Tarjan: the graphs are small but recursion depth is not bounded
        work = [(v, iter(sorted(succ.get(v, ()))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(succ.get(w, ())))))
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    out.append(comp)

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def shortest_cycle(start, comp, succ):
    """The shortest path start -> ... -> start inside comp."""
    prev = {start: None}
    queue = [start]
    for v in queue:
        for w in sorted(succ.get(v, ())):
            if w not in comp:
                continue
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return None


def name(mod):
    return "::".join(mod) if mod else "crate"


def main():
    problems = []
    for crate in sorted(os.listdir("crates")):
        src = os.path.join("crates", crate, "src")
        if not os.path.isdir(src):
            continue
        modules, edges = crate_graph(src)
        if crate == "ferry-engine":
            for (a, b), where in sorted(edges.items()):
                sides = {a[:1], b[:1]}
                if sides == {("capture",), ("restore",)}:
                    problems.append(
                        "%s: %s references %s (%s); capture and restore may only share "
                        "modules that import neither" % (crate, name(a), name(b), where)
                    )
        succ = {}
        for a, b in edges:
            if not related(a, b):
                succ.setdefault(a, set()).add(b)
        seen = set()
        for comp in sccs(modules, succ):
            if len(comp) < 2:
                continue
            comp = set(comp)
            for start in sorted(comp):
                cyc = shortest_cycle(start, comp, succ)
                if not cyc:
                    continue
                ring = cyc[:-1]
                k = ring.index(min(ring))
                canon = tuple(ring[k:] + ring[:k])
                if canon in seen:
                    continue
                seen.add(canon)
                canon_cyc = list(canon) + [canon[0]]
                sites = ", ".join(
                    edges[(canon_cyc[i], canon_cyc[i + 1])] for i in range(len(canon))
                )
                problems.append(
                    "cycle: %s  [%s: %s]"
                    % (" -> ".join(name(m) for m in canon_cyc), crate, sites)
                )
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
