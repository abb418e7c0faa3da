"""calibtune's import graph, read from the code with Python's `ast`, and its drawing
(`make architecture` writes docs/img/architecture.png).

Every ``import`` of ``calibtune/`` counts — function-local ones and those under
``if TYPE_CHECKING`` included — so that what `tests/test_architecture.py` checks (no circle, no
arrow up the layers, few function-local imports) is what a reader of the code would see.

    python bench/architecture.py             # draw docs/img/architecture.png, print the rooms
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "calibtune"

#: a module's layer: the longest prefix listed wins; a module may import its own layer or lower
LAYERS = {
    "calibtune.cli": 13,
    "calibtune.__main__": 14,
    "calibtune.commands": 12,
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
SHARED = 1  # _argtypes, _commands, _failpoints, _lazy, _names, _provenance, _raysettings, ...


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _target(mod: str, node: ast.ImportFrom, is_package: bool) -> str | None:
    if not node.level:
        return node.module
    base = mod.split(".") if is_package else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(mod: str) -> set[str]:
    """Every calibtune module ``mod`` imports, anywhere in the file.

    >>> "calibtune._lazy" in imports("calibtune.record")
    True
    """
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


def function_local_imports() -> list[tuple[str, int, str]]:
    """``(file, line, the comment line above it)`` of every import of a calibtune module made
    inside a function (the comment is ``""`` when the line above is not one)."""
    out = []
    for path in MODULES.values():
        lines = path.read_text().splitlines()
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for n in ast.walk(fn):
                local = isinstance(n, ast.ImportFrom) and (
                    n.level or (n.module or "").startswith("calibtune")
                )
                local |= isinstance(n, ast.Import) and any(
                    a.name.startswith("calibtune") for a in n.names
                )
                if local:
                    above = lines[n.lineno - 2].strip()
                    rel = path.relative_to(ROOT).as_posix()
                    out.append((rel, n.lineno, above if above.startswith("#") else ""))
    return sorted(set(out))


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative).

    >>> circles({"a": {"b"}, "b": {"a"}, "c": {"a"}})
    [['a', 'b']]
    """
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


def room(mod: str) -> str:
    """The room a module lives in: its package under calibtune/, ``entry`` for the command
    line's top modules, ``shared`` for the other top-level helpers.

    >>> room("calibtune.study._search"), room("calibtune.cli"), room("calibtune._lazy")
    ('study', 'entry', 'shared')
    """
    parts = mod.split(".")
    if len(parts) > 1 and (PACKAGE / parts[1]).is_dir():
        return parts[1]
    if len(parts) > 1 and parts[1] in ("cli", "__main__", "demo"):
        return "entry"
    return "_io" if mod == "calibtune._io" else "shared"


def room_graph() -> tuple[dict[str, int], dict[str, int], Counter[tuple[str, str]]]:
    """Lines per room, layer per room and the number of module imports between two rooms."""
    lines: Counter[str] = Counter()
    layers: dict[str, int] = {}
    arrows: Counter[tuple[str, str]] = Counter()
    for mod, path in MODULES.items():
        r = room(mod)
        lines[r] += len(path.read_text().splitlines())
        layers[r] = max(layers.get(r, 0), layer(mod))
        for dep in imports(mod):
            if room(dep) != r:
                arrows[r, room(dep)] += 1
    return dict(lines), layers, arrows


def draw(out: Path) -> None:
    """The rooms as boxes in their layers (top: the entry points), the imports between rooms as
    arrows (thicker for more module imports); an arrow that runs up would be drawn red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines, layers, arrows = room_graph()
    rows = sorted(set(layers.values()), reverse=True)
    pos = {}
    for y, lay in enumerate(rows):
        names = sorted(r for r in layers if layers[r] == lay)
        for i, r in enumerate(names):
            pos[r] = ((i + 1) / (len(names) + 1), 1 - (y + 0.5) / len(rows))
    fig, ax = plt.subplots(figsize=(12, 11))
    ax.set_axis_off()
    for (a, b), n in arrows.items():
        up = layers[b] > layers[a]
        ax.annotate(
            "",
            pos[b],
            pos[a],
            arrowprops={
                "arrowstyle": "->",
                "lw": 0.4 + 0.15 * n**0.5,
                "color": "red" if up else "0.55",
                "shrinkA": 14,
                "shrinkB": 14,
            },
        )
    for r, (x, y) in pos.items():
        ax.text(
            x,
            y,
            f"{r}\n{lines[r]:,} lines",
            ha="center",
            va="center",
            fontsize=9,
            bbox={"boxstyle": "round", "fc": "#eef3fb", "ec": "#3a5f9f"},
        )
    ax.set_title("calibtune: rooms (packages) by layer; arrows = imports between rooms")
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main() -> int:
    out = ROOT / "docs" / "img" / "architecture.png"
    draw(out)
    graph = {m: imports(m) for m in MODULES}
    up = [f"{m} -> {d}" for m, ds in graph.items() for d in ds if layer(d) > layer(m)]
    print(
        f"{out.relative_to(ROOT)}: {len(MODULES)} modules, {sum(map(len, graph.values()))} "
        f"imports, {len(circles(graph))} circles, {len(up)} upward, "
        f"{len(function_local_imports())} function-local imports"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
