"""`scaling.placement_strategy` and the record of where a trial's ranks ran (fast: no Ray).

The real thing — two ranks of one trial on two nodes — is in tests/test_cluster_ddp.py.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from calibtune.record._tracking import MlflowTrialCallback
from calibtune.trial import config_from_dict, config_to_dict
from calibtune.trial._placement import (
    TAG_WORKER_NODES,
    WORKERS_FILE,
    check_placement,
    record_placement,
    worker_nodes_tag,
    write_workers,
)


def test_placement_strategy_defaults_to_pack_and_round_trips() -> None:
    assert config_from_dict({}).scaling.placement_strategy == "PACK"
    for strategy in ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"):
        cfg = config_from_dict({"scaling": {"num_workers": 2, "placement_strategy": strategy}})
        assert cfg.scaling.placement_strategy == strategy
        assert config_from_dict(config_to_dict(cfg)) == cfg


@pytest.mark.parametrize("bad", ["spread", "EVERYWHERE", 2, None])
def test_unknown_placement_strategy_is_one_line(bad: object) -> None:
    expected = "one of 'PACK', 'SPREAD', 'STRICT_PACK', 'STRICT_SPREAD'"
    with pytest.raises(
        ValueError, match=rf"^scaling\.placement_strategy: expected {expected}, got"
    ):
        config_from_dict({"scaling": {"placement_strategy": bad}})


def test_one_rank_records_its_process(tmp_path: Path) -> None:
    import ray

    # None outside Ray (another test of this session may have started it)
    node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    ranks = record_placement(tmp_path / "artifacts", rank=0, world=1, start_epoch=3)
    assert ranks == [
        {"rank": 0, "node_id": node, "hostname": socket.gethostname(), "pid": os.getpid()}
    ]
    written = json.loads((tmp_path / "artifacts" / WORKERS_FILE).read_text())
    assert written["ranks"] == ranks and written["start_epoch"] == 3
    assert worker_nodes_tag(tmp_path / "artifacts") == node
    assert worker_nodes_tag(tmp_path / "nowhere") is None


def test_trial_run_is_tagged_with_its_ranks_nodes(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("placement")).info.run_id
    ranks = [
        {"rank": 0, "node_id": "a" * 56, "hostname": "h0", "pid": 10},
        {"rank": 1, "node_id": "b" * 56, "hostname": "h1", "pid": 11},
    ]
    art = tmp_path / "artifacts"
    write_workers(art, ranks, start_epoch=0)
    MlflowTrialCallback(uri, run_id).on_trial_end({"test/ece": 0.1}, art)
    run = client.get_run(run_id)
    assert run.data.tags[TAG_WORKER_NODES] == f"{'a' * 56},{'b' * 56}"
    assert WORKERS_FILE in [f.path for f in client.list_artifacts(run_id)]


TWO_CPU, ONE_CPU = {"CPU": 2.0, "memory": 1e9}, {"CPU": 1.0}


@pytest.mark.parametrize(
    ("strategy", "workers", "nodes", "error"),
    [
        ("STRICT_SPREAD", 2, [TWO_CPU, ONE_CPU], None),
        ("STRICT_SPREAD", 2, [TWO_CPU], r"STRICT_SPREAD expected 2 nodes with CPU 1 each, got 1"),
        ("STRICT_SPREAD", 3, [TWO_CPU, {"GPU": 1.0}], r"expected 3 nodes .* got 1 in the Ray"),
        ("STRICT_PACK", 2, [ONE_CPU, TWO_CPU], None),
        ("STRICT_PACK", 2, [ONE_CPU, ONE_CPU], r"STRICT_PACK expected a node with 2 × \(CPU 1\)"),
        ("SPREAD", 4, [ONE_CPU], None),  # soft: Ray packs what it cannot spread
        ("PACK", 4, [ONE_CPU], None),  # totals are check_resources' job
    ],
)
def test_strict_strategies_need_fitting_nodes(strategy, workers, nodes, error) -> None:
    if error is None:
        check_placement(strategy, workers, {"CPU": 1.0}, nodes)
    else:
        with pytest.raises(ValueError, match=rf"^scaling\.placement_strategy: .*{error}"):
            check_placement(strategy, workers, {"CPU": 1.0}, nodes)


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_run_refuses_strict_spread_on_one_node_before_starting(tmp_path: Path) -> None:
    """One 2-CPU node: Ray would retry the worker-group start every 60 s forever."""
    from calibtune.trial import run

    cfg = config_from_dict(
        {
            "storage_path": str(tmp_path),
            "scaling": {"num_workers": 2, "placement_strategy": "STRICT_SPREAD"},
        }
    )
    with pytest.raises(ValueError, match=r"STRICT_SPREAD expected 2 nodes with CPU 1 each, got 1"):
        run(cfg)
    assert not (tmp_path / "trial").exists()  # nothing written


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_a_study_too_big_for_the_connected_cluster_writes_nothing(tmp_path: Path) -> None:
    """With an address the cluster is asked once connected (here: the session's 2-CPU Ray, which
    `init_ray` reuses); the refusal leaves no storage folder, study folder or MLflow store."""
    import yaml

    from calibtune.study import load_study, run_study

    raw = {
        "name": "too_big",
        "trial": {"data": {"name": "digits", "ood": []}, "train": {"epochs": 1}},
        "losses": ["cross_entropy"],
        "space": {"scaling.num_workers": {"type": "int", "low": 0, "high": 64}},
        "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}"},
        "storage": str(tmp_path / "runs" / "studies"),
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match=r"needs 64 CPU .*space scaling\.num_workers=64"):
        run_study(load_study(tmp_path / "s.yaml"), address="auto", verbose=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]
