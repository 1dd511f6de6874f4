"""No import cycles between any two modules of engine, app and ui: import-linter's acyclic_siblings
contract (pyproject.toml) checks the modules and subpackages of each package, not a cycle through a
package's __init__ or across the top-level packages; this checks every module against every other,
with the same ignored imports as the contract (imports only for annotations, or a cycle left to break)."""
from __future__ import annotations

import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]


def _ignored() -> set[tuple[str, str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    acyclic = [c for c in config["contracts"] if c["type"] == "acyclic_siblings"]
    assert acyclic, "pyproject.toml has no acyclic_siblings contract"
    return {tuple(s.strip() for s in i.split("->")) for c in acyclic for i in c.get("ignore_imports", [])}


def cycles(graph: grimp.ImportGraph, ignored: set[tuple[str, str]]) -> list[list[str]]:
    """The groups of two or more modules that import each other, directly or not (Tarjan's strongly
    connected components, iterative)."""
    edges = {m: sorted(graph.find_modules_directly_imported_by(m) - {b for a, b in ignored if a == m})
             for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = len(index)
                stack.append(v)
                on_stack.add(v)
            if i < len(edges[v]):
                work.append((v, i + 1))
                w = edges[v][i]
                if w not in index:
                    work.append((w, 0))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                group = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    group.append(w)
                    if w == v:
                        break
                if len(group) > 1:
                    out.append(sorted(group))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return out


def test_cycles_finds_a_cycle_and_only_it():
    g = grimp.ImportGraph()
    for a, b in [("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d"), ("p.d", "p.e")]:
        g.add_import(importer=a, imported=b)
    assert cycles(g, set()) == [["p.a", "p.b", "p.c"]]
    assert cycles(g, {("p.c", "p.a")}) == []


def test_no_module_imports_itself_through_others():
    graph = grimp.build_graph("engine", "app", "ui", cache_dir=None)
    ignored = _ignored()
    left = [(a, b) for a, b in ignored if b not in graph.find_modules_directly_imported_by(a)]
    assert not left, f"ignored in pyproject.toml but no longer imported (remove them): {left}"
    found = cycles(graph, ignored)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)
