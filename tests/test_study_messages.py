"""What a study says when something goes wrong (issue 24, item 4), with the real `calibtune`
executable, a real local Ray and MLflow on SQLite: a failed trial's progress line gives its
reason (the one `compare` shows), and a full disk under the MLflow store is one line naming the
store. The one-line refusals of `resume` and of a refused connection are rows of
tests/test_bad_input_cli.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def _study(tmp: Path, name: str, uri: str, **trial: object) -> Path:
    raw = {
        "name": name,
        "trial": {
            "data": {"name": "digits", "ood": []},
            "model": {"name": "mlp"},
            "train": {"epochs": 1, "batch_size": 64},
            "eval": {"posthoc": ["ts"], "figures": False},
            **trial,
        },
        "losses": ["cross_entropy"],
        "search": {"num_samples": 1, "max_concurrent": 1, "objectives": ["val/ece"]},
        "tracking": {"uri": uri, "experiment": name},
        "storage": str(tmp / "studies"),
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "CALIBTUNE_MIN_FREE_MB": "8", **extra}


@pytest.mark.timeout(240)
def test_a_failed_trials_line_gives_its_reason(tmp_path: Path) -> None:
    path = _study(
        tmp_path, "diverge", f"sqlite:///{tmp_path / 'mlflow.db'}", optimizer={"lr": 1e30}
    )
    out = subprocess.run(
        [sys.executable, "-m", "calibtune", "run", str(path)],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    (line,) = [ln for ln in out.stdout.splitlines() if " failed: " in ln]
    assert "failed: non-finite loss at epoch 1" in line, line
    assert "no details" not in out.stdout


@pytest.mark.timeout(240)
@pytest.mark.skipif(
    shutil.which("unshare") is None or os.geteuid() != 0,
    reason="needs root and unshare for a private tmpfs",
)
def test_a_full_disk_under_the_mlflow_store_is_one_line_naming_it(tmp_path: Path) -> None:
    """The store's folder is a 48 KiB tmpfs (a private mount namespace): MLflow's first tables
    fill it. One line naming the store, no traceback, no half-made store left behind."""
    store = tmp_path / "store"
    store.mkdir()
    path = _study(tmp_path, "fullstore", f"sqlite:///{store / 'mlflow.db'}")
    script = f"""
mount -t tmpfs -o size=48k tmpfs {store}
{sys.executable} -m calibtune run {path} > {tmp_path}/out 2> {tmp_path}/err
echo $? > {tmp_path}/rc
ls -A {store} > {tmp_path}/left
"""
    subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        cwd=tmp_path,
        env=_env(CALIBTUNE_MIN_FREE_MB="0"),  # the store's own pre-flight passes
        timeout=220,
        check=True,
    )
    err = (tmp_path / "err").read_text()
    assert (tmp_path / "rc").read_text().strip() == "2", err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[-3000:]
    want = f"MLflow store {store / 'mlflow.db'}: expected room to write, got 'database or disk"
    assert want in lines[0] and f"free on {store}" in lines[0], lines[0]
    assert (tmp_path / "left").read_text().split() == []
