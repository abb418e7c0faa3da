"""The import graph of calibtune/ has no circle and no arrow up the layers, counting every
import a reader could miss: function-local ones and those under ``if TYPE_CHECKING``.

Layers, top to bottom (docs/architecture.md): entry points (cli, commands) → study (the driver) →
cluster, readers → record → studyfile → trial → training → losses, posthoc, data, models, plots →
metrics → ``_io`` → storage → shared helpers."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "calibtune"

#: a module's layer: the longest prefix listed wins; a module may import its own layer or lower
LAYERS = {
    "calibtune.cli": 13,
    "calibtune.__main__": 14,
    "calibtune.commands": 12,
    "calibtune._data_cli": 12,
    "calibtune.demo": 12,
    "calibtune.study": 11,
    "calibtune.cluster": 10,
    "calibtune.readers": 10,
    "calibtune.record": 9,
    "calibtune.studyfile": 8,
    "calibtune.trial": 6,
    "calibtune.training": 5,
    "calibtune.losses": 4,
    "calibtune.posthoc": 4,
    "calibtune.data": 4,
    "calibtune.models": 4,
    "calibtune.plots": 4,
    "calibtune.metrics": 3,
    "calibtune._io": 3,
    "calibtune.storage": 2,
}
SHARED = 1  # _commands, _failpoints, _lazy, _names, _provenance, _raysettings, _registry, ...


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in PACKAGE.rglob("*.py")}


def _target(mod: str, node: ast.ImportFrom, is_package: bool) -> str | None:
    if not node.level:
        return node.module
    base = mod.split(".") if is_package else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(mod: str) -> set[str]:
    """Every calibtune module ``mod`` imports, anywhere in the file."""
    path = MODULES[mod]
    deps: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            target = _target(mod, node, path.name == "__init__.py")
            if target and target.startswith("calibtune"):
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    deps.add(sub if sub in MODULES else target)
        elif isinstance(node, ast.Import):
            deps |= {a.name for a in node.names if a.name.startswith("calibtune")}
    return {d for d in deps if d in MODULES and d != mod}


def layer(mod: str) -> int:
    found = [k for k in LAYERS if mod == k or mod.startswith(k + ".")]
    return LAYERS[max(found, key=len)] if found else SHARED


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
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
    return out


GRAPH = {m: imports(m) for m in MODULES}


def test_no_import_circle_in_calibtune():
    assert circles(GRAPH) == []


def test_the_circle_finder_finds_one():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_runs_up_the_layers():
    up = [f"{m} -> {d}" for m, ds in GRAPH.items() for d in ds if layer(d) > layer(m)]
    assert up == []
