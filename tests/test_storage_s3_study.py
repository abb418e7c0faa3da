"""A study whose storage is a bucket on an S3-compatible server (moto on 127.0.0.1), run as
users run it (`calibtune run` with ``storage: s3://…`` and the standard AWS environment
variables), SIGKILLed mid-trial with its local Ray, and resumed from the bucket: every trial and
epoch exactly once in MLflow, checkpoints and artifacts in the bucket, nothing written locally
but caches and the stores the study names (its MLflow and Optuna SQLite files)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from _s3 import bucket_study, start_s3
from test_faults import _assert_nothing_lost, _kill_group, _start, _wait

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def s3():
    server = start_s3()
    server.bucket("calib")
    yield server
    server.stop()


def _study(tmp: Path, name: str) -> Path:
    raw = bucket_study(name, tmp)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.timeout(900)
def test_study_in_a_bucket_is_killed_and_resumed_exactly_once(s3, tmp_path: Path) -> None:
    """Today's code wrote everything to a local folder ``./s3:/calib/studies`` and nothing to
    the bucket."""
    name = "kills3"
    env = {**s3.env(), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    path = _study(tmp_path, name)
    proc = _start(
        tmp_path,
        ["run", str(path), "--quiet"],
        "run.log",
        CALIBTUNE_FAILPOINT="epoch_end:2",
        TUNE_GLOBAL_CHECKPOINT_S="100000",
        **env,
    )
    _wait((tmp_path / "epoch_end.hit").exists, proc, "epoch_end:2")
    keys = s3.keys("calib", f"studies/{name}/")
    assert any(k.endswith("checkpoints/epoch_000001/state.pt") for k in keys), keys
    assert not any(k.endswith("result.json") and "/trials/" in k for k in keys)
    _kill_group(proc)

    res = _start(tmp_path, ["resume", f"s3://calib/studies/{name}", "--quiet"], "resume.log", **env)
    assert res.wait(timeout=600) == 0, (tmp_path / "resume.log").read_text()[-3000:]
    _assert_nothing_lost(f"sqlite:///{tmp_path / 'mlflow.db'}", name, 2, 2)

    keys = s3.keys("calib", f"studies/{name}/")
    trials = {k.split("/")[3] for k in keys if k.split("/")[2] == "trials" and "-seed" in k}
    assert 1 <= len(trials) <= 2, keys  # one when both trials drew the same config (reused)
    for t in trials:
        for f in ("result.json", "artifacts/logits.pt", "checkpoints/epoch_000002/state.pt"):
            assert f"studies/{name}/trials/{t}/{f}" in keys, (t, f)
    assert f"studies/{name}/tuner.pkl" in keys and f"studies/{name}/calibtune_study.json" in keys
    assert f"studies/{name}/.calibtune.lock" not in keys  # released by the resume
    out = {}
    for args in (["compare", "--format", "csv"], ["export", "--top", "1", "--out", "best"]):
        out[args[0]] = shown = subprocess.run(
            [sys.executable, "-m", "calibtune", args[0], f"s3://calib/studies/{name}", *args[1:]],
            cwd=tmp_path,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert shown.returncode == 0, shown.stderr[-2000:]
    assert len(out["compare"].stdout.strip().splitlines()) == 3  # the header and two trials
    assert len(list((tmp_path / "best").glob("*.yaml"))) == 1
    local = {p.name for p in tmp_path.iterdir()}
    stores = {"mlflow.db", "optuna.db", "mlruns"}  # the tracking and Optuna stores it names
    ours = {"cache", f"{name}.yaml", "run.log", "resume.log", "epoch_end.hit", "best"}
    assert local <= ours | stores
    assert not any("s3:" in str(p) for p in tmp_path.rglob("*")), sorted(os.listdir(tmp_path))
