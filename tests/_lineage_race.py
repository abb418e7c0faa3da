"""A trial process of `test_data_lineage`'s race: logs the same new datasets as its peers, all
released together each round (imported by spawned processes: MLflow and calibtune only)."""

from __future__ import annotations

from typing import Any


def log_rounds(uri: str, run_ids: list[str], barrier: Any, out: Any) -> None:
    from types import SimpleNamespace as DataInput  # `calibtune.data`'s fields, without torch

    from mlflow.tracking import MlflowClient

    from calibtune.record._lineage import log_data_inputs

    MlflowClient(uri).get_run(run_ids[0])  # the store opened before the race
    for rnd, run_id in enumerate(run_ids):
        inputs = [
            DataInput(name=f"set{i}", context="training", digest=f"d{rnd}", num_samples=1)
            for i in range(6)
        ]
        barrier.wait()
        try:
            log_data_inputs(uri, run_id, inputs)
            out.put("ok")
        except Exception as exc:  # the test shows it
            out.put(f"{type(exc).__name__}: {exc}"[:300])
