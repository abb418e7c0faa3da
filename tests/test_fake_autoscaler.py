"""A cluster that grows through Ray's own autoscaler (issue 29 item 3), with Ray's fake one.

``ray.cluster_utils.AutoscalingCluster`` starts a head without the resource a trial needs and an
autoscaler (Ray's v1, and its v2 as KubeRay and the cluster launcher may run it; both over
`FakeMultiNodeProvider`) whose one worker type (``min_workers: 0``) has it: a logical
``trainer_slot``, standing in for a GPU node. `calibtune run --address` is then run as a user
runs it, without ``--wait-for-resources``: calibtune must see the autoscaler
(`autoscaler_limits`: Ray 2.60's v1 autoscaler publishes its node types only in its status, its
v2 none, only a flag in the GCS), wait with a status line while the autoscaler launches the
node, and train the trial there.

Two things of Ray 2.60's wheel shape the test. The wheel lacks the base config that
`AutoscalingCluster._generate_config` reads (``fake_multi_node/example.yaml``), so
`FakeAutoscalingCluster` supplies it (`BASE_CONFIG`; the v2 autoscaler reads it once more for a
``fake_multinode`` provider, so there the same provider class is named as an ``external`` one).
And ``start``/``shutdown`` run
``ray stop --force``, which stops every Ray process of this user on the machine: the test runs
in the serial phase of ``make test`` (alone), and outside CI it is skipped while another Ray
runs (another test's cluster, a study).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from calibtune.cluster._raycluster import runs_node_types
from tests.test_autoscale import _study

# ------------------------------------------------------------------ the autoscaler's status


def test_a_v1_autoscaler_with_node_types_is_one_that_grows():
    # what `ray start --head` publishes (read-only) and what a fake autoscaling cluster does
    # (the statuses of real runs, trimmed), in the GCS under `__autoscaling_status`
    head = "fffffffffffffffffffffffffffffffffffffffffffffffffff00000"
    readonly = {"node_type_mapping": {head: f"node_{head}"}, "active_nodes": {f"node_{head}": 1}}
    assert not runs_node_types({"autoscaler_report": readonly})
    config = {"node_type_mapping": {head: "ray.head.default"}, "pending_launches": {"slot": 1}}
    assert runs_node_types({"autoscaler_report": config})
    assert not runs_node_types({})  # no autoscaler status (yet): none known
    assert not runs_node_types({"autoscaler_report": None})


# ------------------------------------------------------------------ the fake autoscaler

#: The base config of Ray's fake multi-node provider: the keys of ``example.yaml`` in
#: python/ray/autoscaler/_private/fake_multi_node/ of ray-project/ray (read at commit 0f9191e),
#: which the ray 2.60.0 wheel does not ship. `_generate_config` replaces its node types with
#: the test's; the idle timeout is longer than the example's (6 s) so that the node launched for
#: the trial stays up while the study starts it.
BASE_CONFIG = {
    "cluster_name": "fake_multinode",
    "max_workers": 8,
    "provider": {
        "type": "fake_multinode",
        "use_node_id_as_ip": True,
        "disable_node_updaters": True,
        "disable_launch_config_check": True,
    },
    "available_node_types": {},
    "head_node_type": "ray.head.default",
    "auth": {},
    "upscaling_speed": 1.0,
    "idle_timeout_minutes": 5,
    "docker": {},
    "initialization_commands": [],
    "setup_commands": [],
    "head_setup_commands": [],
    "worker_setup_commands": [],
    "head_start_ray_commands": [],
    "worker_start_ray_commands": [],
    "file_mounts": {},
    "cluster_synced_files": [],
    "file_mounts_sync_continuously": False,
    "rsync_exclude": [],
    "rsync_filter": [],
}
MIB = 1024**2
FAKE_PROVIDER = "ray.autoscaler._private.fake_multi_node.node_provider.FakeMultiNodeProvider"


def _fake_cluster_class():
    from ray.cluster_utils import AutoscalingCluster

    class FakeAutoscalingCluster(AutoscalingCluster):
        """Ray's `AutoscalingCluster`, given the base config its wheel lacks."""

        def _generate_config(
            self, head_resources, worker_node_types, autoscaler_v2=False, **kwargs
        ):
            import copy

            config = copy.deepcopy(BASE_CONFIG)
            if autoscaler_v2:  # v2 reads a `fake_multinode` provider's defaults from the
                # missing example.yaml; an `external` provider of the same class reads none
                config["provider"] |= {"type": "external", "module": FAKE_PROVIDER}
            config["available_node_types"] = {
                **worker_node_types,
                "ray.head.default": {
                    "resources": head_resources,
                    "node_config": {},
                    "max_workers": 0,
                },
            }
            config.update(kwargs)
            return config

    return FakeAutoscalingCluster


def _other_ray_processes() -> list[str]:
    """This user's GCS servers and raylets (of any Ray on this machine), as ``pid name``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != os.getuid():
                continue
            argv0 = (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if argv0.endswith(("/gcs_server", "/raylet")):
            found.append(f"{entry.name} {Path(argv0).name}")
    return found


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.mark.slow
@pytest.mark.serial  # `ray stop --force` (AutoscalingCluster) stops every Ray of this user
@pytest.mark.parametrize(
    "v2",
    # `long`: a study waiting for its cluster to grow stays in `make test` as test_autoscale.py's
    # tests (nodes added by hand; calibtune telling a v2 autoscaler from Ray's read-only one);
    # Ray's own fake autoscaler adding the node runs in `make test-long`
    [pytest.param(False, marks=pytest.mark.long), pytest.param(True, marks=pytest.mark.long)],
    ids=["v1", "v2"],
)
def test_a_study_waits_for_the_fake_autoscaler_to_add_a_node(tmp_path, monkeypatch, v2):
    if os.environ.get("PYTEST_XDIST_WORKER"):  # its `ray stop` would kill the other worker's Ray
        pytest.fail(
            "expected to run alone (`-m serial`, no xdist: it runs `ray stop --force`), "
            f"found xdist worker {os.environ['PYTEST_XDIST_WORKER']}"
        )
    others = _other_ray_processes()
    if others and not _in_ci():
        pytest.skip(f"AutoscalingCluster runs `ray stop --force`, other Ray runs: {others[:4]}")
    from ray._private.services import get_node_ip_address

    token = secrets.token_hex(32)  # the cluster's own: nothing read from or written to ~/.ray
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "RAY_USAGE_STATS_ENABLED": "0"}
    for key, value in auth.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    # the cluster's sessions under the test's own root, not the machine's /tmp/ray
    root = tempfile.mkdtemp(prefix="fa", dir="/tmp")  # short: socket paths are limited
    monkeypatch.setenv("RAY_TMPDIR", root)
    monkeypatch.setattr(tempfile, "tempdir", root)  # where `start` writes the config it passes
    cluster = _fake_cluster_class()(
        head_resources={"CPU": 1, "object_store_memory": 150 * MIB},
        worker_node_types={
            "slot": {
                "resources": {"CPU": 1, "trainer_slot": 1, "object_store_memory": 150 * MIB},
                "node_config": {},
                "min_workers": 0,
                "max_workers": 1,
            }
        },
        autoscaler_v2=v2,  # v2: what KubeRay's and the launcher's autoscaler can be
    )
    # the fake provider starts its nodes against <this machine's address>:6379 (Ray's default)
    address = f"{get_node_ip_address()}:6379"
    path = _study(tmp_path, "fake_autoscaler")
    try:
        cluster.start(override_env=auth)
        deadline = time.time() + 120
        # the autoscaler is up once `ray status` shows the head's node type (v1) or the status
        # of Ray's v2 autoscaler, which names the head after the node (not from the provider)
        ready = "Autoscaler status" if v2 else "ray.head.default"
        while True:
            status = subprocess.run(
                ["ray", "status", "--address", address], capture_output=True, text=True
            )
            if ready in status.stdout:
                break
            assert time.time() < deadline, status.stdout[-2000:] + status.stderr[-2000:]
            time.sleep(1)
        assert "trainer_slot" not in status.stdout  # the head lacks it; no worker node yet

        out = subprocess.run(
            [sys.executable, "-m", "calibtune", "run", str(path), "--address", address],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
        lines = out.stderr.splitlines()
        assert "[calibtune] waiting for 1 trainer_slot: 0:00 of 10:00" in lines, out.stderr[-3000:]
        assert "1 finished, 0 failed" in out.stdout

        alive = _alive_nodes(address)
        added = [n for n in alive if n["Resources"].get("trainer_slot") == 1.0]
        assert len(alive) == 2 and len(added) == 1, alive  # the head and the node it launched
        _check_trained(tmp_path, path)
    finally:
        cluster.shutdown()
        import shutil

        shutil.rmtree(root, ignore_errors=True)


def _alive_nodes(address: str) -> list[dict]:
    """The cluster's alive nodes (`ray.nodes`), read by a client process of its own: a second
    `ray.init` in this process would present the first cluster's cached auth token."""
    code = (
        "import json, ray\n"
        "from calibtune.cluster._raycluster import client_token_auth\n"
        "client_token_auth()\n"
        f"ray.init(address={address!r}, log_to_driver=False)\n"
        "print(json.dumps([n for n in ray.nodes() if n['Alive']], default=str))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _check_trained(tmp: Path, path: Path) -> None:
    """One COMPLETE trial in Optuna, its MLflow runs finished with its test metrics."""
    import optuna
    from mlflow.tracking import MlflowClient

    from calibtune.record._tracking import TAG_KIND

    raw = yaml.safe_load(path.read_text())
    client = MlflowClient(raw["tracking"]["uri"])
    exp = client.get_experiment_by_name(raw["tracking"]["experiment"])
    runs = client.search_runs([exp.experiment_id])
    assert all(r.info.status == "FINISHED" for r in runs), [r.info.status for r in runs]
    (trial,) = [r for r in runs if r.data.tags.get(TAG_KIND) == "trial"]
    assert trial.data.tags["calibtune.status"] == "finished"
    assert "test/ece" in trial.data.metrics
    db = next((tmp / "studies").rglob("optuna.db"))
    (summary,) = optuna.get_all_study_summaries(f"sqlite:///{db}")
    trials = optuna.load_study(study_name=summary.study_name, storage=f"sqlite:///{db}").trials
    assert [t.state.name for t in trials] == ["COMPLETE"]
