"""``search.max_concurrent: auto`` (issue 29 item 2) and clusters that grow (item 3).

The unit tests need no Ray. The cluster test starts a real one-node cluster the way users do
(`tests/_cluster.py`, head without the resource a trial needs), then `calibtune run --address`:
with ``--wait-for-resources`` the study waits with a status line, refuses in one line when the
wait expires, and trains once a node that holds the trial joins (the cluster grew). Without it
(no autoscaler) it refuses at once, as before.

Here a node joins during the wait by hand, as an autoscaler would add it. Ray's own autoscaler
(its fake one, ``ray.cluster_utils.AutoscalingCluster``, no ``--wait-for-resources``) is tested
in tests/test_fake_autoscaler.py, in the serial phase of ``make test``: its ``start`` and
``shutdown`` run ``ray stop --force``, which stops every Ray of this user on the machine (and
ray 2.60.0's wheel lacks the base config it reads, which that test supplies). An autoscaler
whose node types cannot hold a trial: `test_an_autoscaler_that_cannot_grow_refuses_at_once`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from calibtune._argtypes import parse_duration
from calibtune.cluster._concurrency import auto_limit, cluster_slots, seed_footprint
from calibtune.cluster._raycluster import trial_demand, wait_for_nodes
from calibtune.study import load_study
from calibtune.studyfile._config import StudyError, study_from_text

ROOT = Path(__file__).resolve().parents[1]
PAPER_STUDIES = sorted(  # the papers' studies: a year in the name, and FCL's (fcl_gamma_lambda: a
    # search); a set: fcl_20newsgroups has both
    {p for p in (ROOT / "studies").glob("*.yaml") if "20" in p.stem}
    | {p for p in (ROOT / "studies").glob("fcl_*.yaml") if p.stem != "fcl_gamma_lambda"}
)


def _text(search: str = "", scaling: str = "{num_workers: 0}") -> str:
    return f"name: s\ntrial: {{scaling: {scaling}}}\nlosses: [cross_entropy]\nsearch: {{{search}}}"


def test_auto_is_the_default_and_a_number_still_caps():
    assert study_from_text(_text(), "s").search.max_concurrent == "auto"
    assert study_from_text(_text("max_concurrent: auto"), "s").search.max_concurrent == "auto"
    assert study_from_text(_text("max_concurrent: 3"), "s").search.max_concurrent == 3
    for bad in ("0", "many", "1.5", "true"):
        with pytest.raises(StudyError) as e:
            study_from_text(_text(f"max_concurrent: {bad}"), "s")
        assert "search.max_concurrent: expected auto or an integer >= 1, got " in str(e.value)
        assert "\n" not in str(e.value)


def test_the_shipped_paper_studies_use_the_whole_cluster():
    # docs/papers.md: 9 on CIFAR-10, 22 on CIFAR-100/Tiny-ImageNet, ImageNet, SST, 20 Newsgroups (4)
    assert len(PAPER_STUDIES) == 37
    for path in PAPER_STUDIES:
        s = load_study(path).search
        assert s.max_concurrent == "auto", path.name
        assert len(s.seeds) > 1, path.name  # several seeds: they train in parallel


def test_slots_count_seeds_and_workers():
    # Mukhoti's study on 8 GPUs: 1 GPU per seed, 3 seeds a trial -> 8 slots, 3 trials at once
    # and one queued
    gpu = study_from_text(_text(scaling="{num_workers: 1, use_gpu: true}"), "s")
    assert seed_footprint(gpu) == {"CPU": 1.0, "GPU": 1.0}
    assert cluster_slots({"CPU": 64.0, "GPU": 8.0}, seed_footprint(gpu)) == 8
    assert auto_limit(8, 3) == 4  # ceil: no slot idles; + 1 queued: none between two trials
    two = study_from_text(_text(scaling="{num_workers: 2, resources_per_worker: {CPU: 2}}"), "s")
    assert seed_footprint(two) == {"CPU": 4.0}
    assert cluster_slots({"CPU": 9.0}, seed_footprint(two)) == 2
    assert auto_limit(0, 3) == 1  # a cluster without the resource yet: one trial asks for it


def test_an_autoscaler_that_cannot_grow_refuses_at_once():
    study = study_from_text(_text(scaling="{num_workers: 0, use_gpu: true}"), "s")
    assert trial_demand(study) == [{"CPU": 1.0, "GPU": 1.0}]
    refusal = ValueError("trial.scaling.use_gpu: expected a visible GPU on the Ray cluster")
    t0 = time.monotonic()
    with pytest.raises(ValueError) as e:  # its node types hold CPUs only: no wait
        wait_for_nodes(study, refusal, 600, {"CPU": 64.0})
    assert time.monotonic() - t0 < 5
    assert str(e.value) == f"{refusal}; the cluster's autoscaler cannot add 1 more GPU"


def test_bad_wait_duration_is_refused_in_one_line(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "calibtune", "run", "x.yaml", "--wait-for-resources", "soon"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 2
    want = "--wait-for-resources: expected a duration such as 600, 90s, 10m, 1.5h, 1h30m or 10:00"
    assert want in out.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("600", 600), ("0", 0), ("90s", 90), ("10m", 600), ("1.5h", 5400), (".5h", 1800),
        ("1h30m", 5400), ("1h 30m 15s", 5415), ("10 min", 600), ("2 Minutes", 120),
        ("3 hrs", 10800), ("1 day", 86400), (" 5M ", 300),
        ("10:00", 600), ("0:42", 42), ("1:02:03", 3723),  # the status line's own clock
    ],
)  # fmt: skip
def test_wait_durations_in_the_forms_users_write(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    ["", "soon", "-5", "nan", "inf", "1e3", "10x", "m", "1h30", "10:60", "5:", "1h-30m", "1..5h"],
)
def test_a_duration_without_a_known_unit_or_clock_is_refused(text):
    with pytest.raises(ValueError, match=r"expected a duration such as 600, .* got "):
        parse_duration(text)


# ------------------------------------------------------------------ a cluster that grows


def _study(tmp: Path, name: str = "grows") -> Path:
    """A one-trial study (in its own experiment ``name``) whose trial needs the custom resource
    ``trainer_slot`` that only a node added later holds."""
    raw = {
        "name": name,
        "trial": {
            "data": {"name": "digits"},
            "model": {"name": "mlp"},
            "train": {"epochs": 1, "batch_size": 64},
            "eval": {"posthoc": []},
            # what only a node added later holds (a GPU node's GPU, faked by a resource)
            "scaling": {"num_workers": 0, "resources_per_worker": {"CPU": 1, "trainer_slot": 1}},
        },
        "losses": ["cross_entropy"],
        "search": {"sampler": "grid", "num_samples": 1, "objectives": [{"metric": "val/ece"}]},
        "tracking": {"uri": f"sqlite:///{tmp / 'mlflow.db'}", "experiment": name},
        "storage": str(tmp / "studies"),
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.slow
def test_a_study_waits_for_the_cluster_to_grow(tmp_path):
    from _cluster import start_cluster

    cluster = start_cluster(tmp_path, nodes=1, num_cpus=1)
    path = _study(tmp_path)
    cmd = [sys.executable, "-m", "calibtune", "run", str(path), "--address", cluster.gcs]

    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*cmd, *extra], env=cluster.client_env(), capture_output=True, text=True, timeout=600
        )

    proc = None
    try:
        now = run()  # a fixed cluster: refused at once, as before
        assert now.returncode == 2, now.stderr[-2000:]
        assert "waiting for" not in now.stderr
        assert "trainer_slot" in now.stderr.strip().splitlines()[-1]

        expired = run("--wait-for-resources", "3s")
        assert expired.returncode == 2, expired.stderr[-2000:]
        lines = expired.stderr.strip().splitlines()
        assert "[calibtune] waiting for 1 trainer_slot: 0:00 of 0:03" in lines
        assert lines[-1].endswith("(waited 0:03 for the cluster to grow)")
        assert "trainer_slot" in lines[-1]

        proc = subprocess.Popen(
            [*cmd, "--wait-for-resources", "5m"],
            env=cluster.client_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        seen = []
        while not any("waiting for 1 trainer_slot" in line for line in seen):
            seen.append(proc.stderr.readline())  # until the study waits: then the cluster grows
            assert seen[-1], "".join(seen)[-3000:]
        cluster._start(
            ["--address", cluster.gcs, "--resources", json.dumps({"trainer_slot": 1})], "rg"
        )
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, (out + err)[-3000:]
        assert "1 finished, 0 failed" in out
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.communicate()
        cluster.stop()


@pytest.mark.slow
def test_a_fixed_cluster_under_the_v2_autoscaler_refuses_once_it_says_so(tmp_path):
    # A head started with Ray's v2 autoscaler (as KubeRay's and the launcher's are) but no node
    # types of its own: its read-only autoscaler. calibtune sees a v2 autoscaler (which publishes
    # no node types), asks it for the trial and refuses in one line as soon as it answers that
    # no node type holds the trial - not after the 10-minute wait, and before anything starts.
    from _cluster import start_cluster

    cluster = start_cluster(tmp_path, nodes=1, num_cpus=1, env={"RAY_enable_autoscaler_v2": "1"})
    path = _study(tmp_path)
    env = cluster.client_env()
    env.pop("RAY_enable_autoscaler_v2")  # a user's driver does not set it
    try:
        t0 = time.monotonic()
        out = subprocess.run(
            [sys.executable, "-m", "calibtune", "run", str(path), "--address", cluster.gcs],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        took = time.monotonic() - t0
    finally:
        cluster.stop()
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert "[calibtune] waiting for 1 trainer_slot: 0:00 of 10:00" in lines, lines[-5:]
    assert lines[-1].endswith(
        "; the cluster's autoscaler has no node type for 1 CPU, 1 trainer_slot"
    ), lines[-1]
    assert "trainer_slot" in lines[-1].split(";")[0]  # the refusal itself names what is missing
    assert took < 120, took  # one autoscaler round, not the wait
    assert not (tmp_path / "studies").exists()
