"""The tables in tests/conftest.py that share the suite out to `make test`'s xdist workers
name files and tests that exist (a renamed test would silently leave the `serial` part)."""

from __future__ import annotations

import re
from pathlib import Path

import conftest

ROOT = Path(__file__).resolve().parents[1]


def test_every_file_and_serial_test_named_exists() -> None:
    for path in [*conftest.GROUPS, *conftest.SPREAD]:
        assert (ROOT / path).is_file(), path
    for nodeid in conftest.SERIAL:
        path, name = nodeid.split("::")
        assert re.search(rf"^def {name}\(", (ROOT / path).read_text(), re.M), nodeid


def test_units() -> None:
    unit = conftest._unit
    # the two cluster modules one unit; the in-process Ray's users two units, one per worker
    assert unit("tests/test_cluster.py::a") == unit("tests/test_cluster_ddp.py::b") == "cluster"
    assert unit("tests/test_study_e2e.py::a") == unit("tests/test_results_studies.py::b")
    assert unit("tests/test_constraints.py::a") == unit("tests/test_ui_browser.py::b")
    assert {unit("tests/test_study_e2e.py::a"), unit("tests/test_ui_browser.py::b")} == (
        conftest.RAY_SESSION_UNITS
    )
    assert conftest.FIRST[: len(conftest.RAY_SESSION_UNITS)] == sorted(conftest.RAY_SESSION_UNITS)
    # a fault test alone; any other file one unit
    assert unit("tests/test_faults.py::a[x]") == "tests/test_faults.py::a[x]"
    assert unit("tests/test_keys.py::a") == unit("tests/test_keys.py::b") == "tests/test_keys.py"
