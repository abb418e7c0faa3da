"""The load study's small version: `bench/bench_load.py --trials 6` runs and finds every trial
finished once in MLflow (the 200-trial run is `make load`, numbers in bench/README.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# `long`: `make load` runs the same load study at 200 trials (bench/README.md)
@pytest.mark.long
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_load_study_small_version(tmp_path):
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "bench_load.py"),
            "--trials",
            "6",
            "--root",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    row = res.stdout.strip().splitlines()[-1]
    assert row.startswith("| 6 |") and row.endswith("| 6 (6, 6) |"), row
    store = row.strip(" |").split("|")[-2]  # "<sqlite> MiB + <artifacts> MiB artifacts"
    assert float(store.split()[0]) > 0, row  # the SQLite file is measured, not skipped
