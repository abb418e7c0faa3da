"""Data lineage in MLflow: each split and each OOD/shift set a trial used is an MLflow dataset
input of its run (name, content digest from `calibtune.data._digest`, context tag
``mlflow.data.context``: training/validation/test/ood/shift), and the tables say when the trials
they compare saw different data.

A trial's data per context is one string, ``name=digest`` pairs sorted (`data_columns`), in
`calibtune.readers._results.trials_frame`'s ``data:<context>`` columns: two trials used the same
data of a context exactly when the strings are equal. `data_note` is the line `compare` and
`report` print when they differ; `check_same_data` refuses a paired comparison across them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from calibtune import data as D

__all__ = ["check_same_data", "data_columns", "data_note", "log_data_inputs", "trial_inputs"]

CONTEXT_TAG = "mlflow.data.context"  # MLflow's own tag for a dataset input's role
PREFIX = "data:"
#: MLflow's store looks a dataset up, then inserts it: two trials of a study starting together
#: both insert it and one fails on the (experiment, name, digest) key. Logging again finds the
#: other's row and only links it (idempotent), so the loser retries.
_RACE_WORDS = ("unique", "duplicate")
_ATTEMPTS = 5


def trial_inputs(cfg: Any) -> tuple[Any, ...]:
    """The `calibtune.data._digest.DataInput` of every split, OOD and shift set the trial
    config ``cfg`` trains and evaluates on (digests cached per process)."""
    d = cfg.data
    # the splits the trial trains on are drawn with data.split_seed, not the trial's seed
    return D.data_inputs(d.name, d.root, d.split_seed, d.val_fraction, d.ood, d.shift)


def log_data_inputs(uri: str, run_id: str, inputs: Iterable[Any]) -> None:
    """Log ``inputs`` as the run's dataset inputs (MLflow keeps one input per dataset name and
    digest: logging again after a restore adds nothing). Safe when several processes log the
    same new dataset at once (the trials of a study starting together)."""
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.tracking import MlflowClient

    datasets = [
        DatasetInput(
            Dataset(
                name=i.name,
                digest=i.digest,
                source_type="calibtune",
                source=json.dumps({"dataset": i.name}),
                profile=json.dumps({"num_samples": i.num_samples}),
            ),
            tags=[InputTag(CONTEXT_TAG, i.context)],
        )
        for i in inputs
    ]
    if datasets:
        # a plain client: ``log_inputs`` is not a call the tracking module's client resends
        _log_inputs_retrying(MlflowClient(tracking_uri=uri), run_id, datasets)


def _log_inputs_retrying(client: Any, run_id: str, datasets: list[Any]) -> None:
    from mlflow.exceptions import MlflowException

    for attempt in range(_ATTEMPTS):
        try:
            client.log_inputs(run_id, datasets=datasets)
            return
        except MlflowException as exc:
            lost_race = any(w in str(exc).lower() for w in _RACE_WORDS)
            if not lost_race or attempt == _ATTEMPTS - 1:
                raise
            time.sleep(0.05 * (attempt + 1))


def data_columns(run: Any) -> dict[str, str]:
    """``{"data:<context>": "name=digest;..."}`` of an MLflow run's dataset inputs (sorted; a
    name with several digests — one per seed — lists each)."""
    by_context: dict[str, set[str]] = {}
    for d in getattr(getattr(run, "inputs", None), "dataset_inputs", None) or []:
        context = next((t.value for t in d.tags if t.key == CONTEXT_TAG), "other")
        by_context.setdefault(context, set()).add(f"{d.dataset.name}={d.dataset.digest}")
    return {f"{PREFIX}{c}": ";".join(sorted(v)) for c, v in sorted(by_context.items())}


def _differing(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, dict[str, list[str]]]]:
    """``(context, {data string: trial ids})`` for each context whose data differs among
    ``rows`` (trials without lineage, logged before it existed, are left out)."""
    rows = [dict(r) for r in rows]  # a pandas row iterates its values, a dict its keys
    contexts = sorted({k for r in rows for k in r if str(k).startswith(PREFIX)})
    out = []
    for col in contexts:
        groups: dict[str, list[str]] = {}
        for r in rows:
            value = r.get(col)
            if isinstance(value, str) and value:
                groups.setdefault(value, []).append(str(r.get("trial_id")))
        if len(groups) > 1:  # listed by trial id, so that the line reads the same every time
            ordered = sorted((sorted(ids), value) for value, ids in groups.items())
            out.append((col[len(PREFIX) :], {value: ids for ids, value in ordered}))
    return out


def data_note(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """One line when ``rows`` (trials, as `trials_frame` rows) were trained or evaluated on
    different data, naming each context and which trials share each version; else None.

    >>> a = {"trial_id": "a", "data:test": "d/test=1f"}
    >>> b = {"trial_id": "b", "data:test": "d/test=2e"}
    >>> data_note([a, b])  # doctest: +ELLIPSIS
    'note: these trials were trained or evaluated on different data ...: test: 2 versions (a | b)'
    >>> data_note([a, a]) is None
    True
    """
    diffs = _differing(rows)
    if not diffs:
        return None
    parts = [
        f"{context}: {len(groups)} versions ({' | '.join(', '.join(t) for t in groups.values())})"
        for context, groups in diffs
    ]
    return (
        "note: these trials were trained or evaluated on different data (digests differ): "
        + "; ".join(parts)
    )


def check_same_data(label: str, trial: Mapping[str, Any], base: Mapping[str, Any]) -> None:
    """Refuse (one-line ValueError) a paired comparison of loss ``label``'s best trial with the
    baseline's best ``base`` when they were trained or evaluated on different data."""
    diffs = _differing([trial, base])
    if diffs:
        context = diffs[0][0]
        raise ValueError(
            f"--baseline: expected {label}'s best trial {trial.get('trial_id')} and the "
            f"baseline's {base.get('trial_id')} trained and evaluated on the same data, got "
            f"different {context} data (digests differ); compare trials of one data version"
        )
