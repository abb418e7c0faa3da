"""The import graph of calibtune/ (read by bench/architecture.py, which also draws it) has no
circle, no arrow up the layers and at most 15 function-local imports of calibtune modules, each
with a comment line saying why it is deferred.

Layers, top to bottom (docs/architecture.md): entry points (cli, commands) → study (the driver) →
cluster, readers → record → studyfile → trial → training → losses, posthoc, data, models, plots →
metrics → ``_io`` → storage → shared helpers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("architecture", ROOT / "bench" / "architecture.py")
A = importlib.util.module_from_spec(_spec)
sys.modules["architecture"] = A
_spec.loader.exec_module(A)

GRAPH = {m: A.imports(m) for m in A.MODULES}


def test_no_import_circle_in_calibtune():
    assert A.circles(GRAPH) == []


def test_the_circle_finder_finds_one():
    assert A.circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_runs_up_the_layers():
    up = [f"{m} -> {d}" for m, ds in GRAPH.items() for d in ds if A.layer(d) > A.layer(m)]
    assert up == []


def test_function_local_imports_are_few_and_say_why():
    local = A.function_local_imports()
    assert len(local) <= 15, local
    assert [f"{f}:{n}" for f, n, why in local if not why] == []


def test_function_local_imports_are_found(tmp_path, monkeypatch):
    """The counter sees an import inside a function (and one with a reason above it)."""
    pkg = tmp_path / "calibtune"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "def f():\n    from calibtune import x\n\n\ndef g():\n    # why\n    import calibtune.y\n"
    )
    monkeypatch.setattr(A, "ROOT", tmp_path)
    monkeypatch.setattr(A, "MODULES", {"calibtune.m": pkg / "m.py"})
    assert A.function_local_imports() == [
        ("calibtune/m.py", 2, ""),
        ("calibtune/m.py", 7, "# why"),
    ]


def test_every_room_has_a_layer():
    """A new package under calibtune/ gets its place in the layers (else it would pass as a
    shared helper, free to be imported by anything)."""
    rooms = {A.room(m) for m in A.MODULES} - {"entry", "shared", "_io"}
    assert sorted(r for r in rooms if f"calibtune.{r}" not in A.LAYERS) == []
