"""A bucket trial's artifacts: the local stage is dropped once its files are uploaded and
logged, and a finished trial reused on another machine (no stage there) gets a local copy of
its artifacts from the bucket, so its reusing twin logs them too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _s3 import start_s3

from calibtune.storage import open_storage
from calibtune.trial._artifacts import drop_stage, local_stage, staged_copy
from calibtune.trial._driver import _artifacts_here


@pytest.fixture(scope="module")
def s3():
    server = start_s3()
    server.bucket("art")
    yield server
    server.stop()


@pytest.fixture
def bucket_env(s3, monkeypatch, tmp_path):
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return s3


def test_a_bucket_stage_is_dropped_and_fetched_back(bucket_env, tmp_path):
    art = open_storage("s3://art/study/trials/t1/artifacts")
    with local_stage(art) as local:
        (local / "metrics.json").write_text(json.dumps({"val/ece": 0.1}))
        (local / "figures").mkdir()
        (local / "figures" / "r.txt").write_text("fig")
    assert local.is_dir() and (art / "figures" / "r.txt").read_text() == "fig"
    drop_stage(art)
    assert not local.exists()  # nothing left in the cache
    back = staged_copy(art)
    assert back == local
    assert json.loads((back / "metrics.json").read_text()) == {"val/ece": 0.1}
    assert (back / "figures" / "r.txt").read_text() == "fig"


def test_a_reused_trial_finds_its_artifacts_on_another_machine(bucket_env, tmp_path):
    trial = open_storage("s3://art/study/trials/t2")
    (trial / "artifacts" / "config.yaml").write_text("name: t2\n")
    recorded = str(tmp_path / "elsewhere" / "stage")  # the other node's stage folder
    here = _artifacts_here(trial, recorded)
    assert (here / "config.yaml").read_text() == "name: t2\n"
    local = open_storage(tmp_path / "disk" / "t3")
    assert _artifacts_here(local, "/x/y") == Path("/x/y")  # a disk: as recorded
