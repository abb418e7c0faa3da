"""Reading many runs' values at once: one SQL query per chunk on a SQLite store (the client's
per-run calls are too slow for a 1,000-trial study), the client's search elsewhere."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from calibtune.record._mlflow_store import _client


def find_runs(uri: str, exp_id: str, filter_string: str) -> list[Any]:
    return list(_client(uri).search_runs([exp_id], filter_string=filter_string, max_results=10000))


@dataclass(frozen=True)
class RunValues:
    """What the study's readers take from a run: ids, start, its values by key (a metric's
    latest value, NaN kept) and its dataset inputs (name, digest and input tags only)."""

    run_id: str
    run_name: str
    start_time: int
    tags: dict[str, str]
    params: dict[str, str]
    metrics: dict[str, float]
    inputs: Any  # mlflow.entities.RunInputs


def find_run_values(uri: str, exp_id: str, tags: Mapping[str, str]) -> list[RunValues]:
    """The active runs of ``exp_id`` whose tags equal ``tags``, as `find_runs` orders them for
    ``tags.`k` = 'v' and ...`` (newest start first, then run id). On a SQL store a constant
    number of plain queries, whatever the number of runs: MLflow's search builds an ORM object
    per logged value and reads each dataset's schema and profile (≈ 10 s for 1,000 runs of 200
    metrics on a 2-core box, bench/README.md)."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    store = getattr(_client(uri)._tracking_client, "store", None)
    if not isinstance(store, SqlAlchemyStore):
        query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
        return [_values(r) for r in find_runs(uri, exp_id, query)]
    with store.ManagedSessionMaker() as session:
        return _sql_run_values(session, int(exp_id), tags)


def _values(run: Any) -> RunValues:
    i, d = run.info, run.data
    name, start = i.run_name or "", i.start_time
    return RunValues(i.run_id, name, start, d.tags, d.params, d.metrics, run.inputs)


def _sql_run_values(session: Any, exp_id: int, tags: Mapping[str, str]) -> list[RunValues]:
    import sqlalchemy as sa
    from mlflow.store.tracking.dbmodels import models as M

    stmt = sa.select(M.SqlRun.run_uuid, M.SqlRun.name, M.SqlRun.start_time).where(
        M.SqlRun.experiment_id == exp_id, M.SqlRun.lifecycle_stage == "active"
    )
    for k, v in tags.items():
        tagged = sa.select(M.SqlTag.run_uuid).where(M.SqlTag.key == k, M.SqlTag.value == v)
        stmt = stmt.where(M.SqlRun.run_uuid.in_(tagged))
    runs = session.execute(stmt.order_by(M.SqlRun.start_time.desc(), M.SqlRun.run_uuid)).all()
    ids = [r[0] for r in runs]
    values: dict[str, tuple[dict, dict, dict, dict]] = {i: ({}, {}, {}, {}) for i in ids}
    for chunk in (ids[i : i + 500] for i in range(0, len(ids), 500)):  # SQLite's variables
        m = M.SqlLatestMetric
        q = sa.select(m.run_uuid, m.key, m.value, m.is_nan).where(m.run_uuid.in_(chunk))
        for run, key, value, nan in session.execute(q):
            values[run][0][key] = float("nan") if nan else value
        for n, table in ((1, M.SqlParam), (2, M.SqlTag)):
            q = sa.select(table.run_uuid, table.key, table.value).where(table.run_uuid.in_(chunk))
            for run, key, value in session.execute(q):
                values[run][n][key] = value
        for run, *dataset in session.execute(_inputs_query(M, chunk)):
            values[run][3].setdefault(dataset[0], (dataset[1:5], []))[1].extend(dataset[5:])
    out = []
    for run_id, name, start in runs:
        metrics, params, run_tags, inputs = values[run_id]
        out.append(RunValues(run_id, name or "", start, run_tags, params, metrics, _inputs(inputs)))
    return out


def _inputs_query(M: Any, chunk: list[str]) -> Any:
    """(run, dataset id, name, digest, source type, source, tag name, tag value) of the runs'
    dataset inputs, one row per input tag (none: a row with a NULL tag); a dataset given twice
    is one input with both inputs' tags, as MLflow's search gives it."""
    import sqlalchemy as sa

    i, d, t = M.SqlInput, M.SqlDataset, M.SqlInputTag
    cols = (i.destination_id, d.dataset_uuid, d.name, d.digest, d.dataset_source_type)
    return (
        sa.select(*cols, d.dataset_source, t.name, t.value)
        .select_from(i)
        .join(d, i.source_id == d.dataset_uuid)
        .outerjoin(t, t.input_uuid == i.input_uuid)
        .where(i.destination_type == "RUN", i.source_type == "DATASET", i.destination_id.in_(chunk))
    )


def _inputs(found: Mapping[str, tuple[Sequence[Any], list[Any]]]) -> Any:
    from mlflow.entities import Dataset, DatasetInput, InputTag, RunInputs

    datasets = []
    for (name, digest, source_type, source), tags in found.values():
        pairs = [(k, v) for k, v in zip(tags[::2], tags[1::2], strict=True) if k is not None]
        datasets.append(
            DatasetInput(Dataset(name, digest, source_type, source), [InputTag(*p) for p in pairs])
        )
    return RunInputs(dataset_inputs=datasets)
