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

from calibtune.study._tracking import MlflowTrialCallback
from calibtune.trial import config_from_dict, config_to_dict
from calibtune.trial._placement import (
    TAG_WORKER_NODES,
    WORKERS_FILE,
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
