"""The readers of a study's trial runs (compare, report, export, the parent-run summary) on a
real MLflow SQLite store: the same runs as MLflow's search, read by a number of queries that does
not grow with the runs (MLflow's search built an ORM object per logged value: ≈ 10 s at 1,000
trials, bench/README.md)."""

from __future__ import annotations

import math

import sqlalchemy as sa
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, RunTag
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
from mlflow.tracking import MlflowClient

from calibtune.readers._results import StudyRef, trials_frame
from calibtune.record._lineage import data_columns
from calibtune.record._tracking import (
    PARENT,
    TAG_KIND,
    TAG_STATUS,
    TAG_TRIAL,
    _client,
    _values,
    experiment_id,
    find_run_values,
    find_runs,
)


def _store(tmp_path, trials: int) -> tuple[str, str, str]:
    """A parent run with ``trials`` trial runs (metrics, one NaN, params, dataset inputs) and
    one seed run and one run of another parent, which the readers must leave out."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client, exp = MlflowClient(uri), experiment_id(uri, "scale")
    parent = client.create_run(exp, tags={TAG_KIND: "study"}).info.run_id
    other = client.create_run(exp).info.run_id
    for i in range(trials):
        kind = "trial" if i < trials - 2 else ("seed" if i == trials - 2 else "trial")
        owner = other if i == trials - 1 else parent
        run = client.create_run(exp, start_time=1000 + i // 2, run_name=f"t{i}")
        rid = run.info.run_id
        tags = {PARENT: owner, TAG_KIND: kind, TAG_TRIAL: f"t{i}", TAG_STATUS: "finished"}
        client.log_batch(
            rid,
            metrics=[
                Metric("val/ece", 0.1 * i, 0, 1),
                Metric("val/ece", 0.2 + i, 1, 2),  # the latest step is the run's value
                Metric("test/ece", float("nan") if i == 1 else 0.5, 0, 1),
            ],
            params=[Param("loss", "focal"), Param("gamma", str(i))],
            tags=[RunTag(k, v) for k, v in tags.items()],
        )
        ds = Dataset("digits", f"d{i % 3}", "code", '{"x": 1}')
        client.log_inputs(rid, [DatasetInput(ds, [InputTag("mlflow.data.context", "train")])])
    return uri, exp, parent


def _comparable(r) -> tuple:
    metrics = {k: "nan" if math.isnan(v) else v for k, v in r.metrics.items()}
    return r.run_id, r.run_name, r.start_time, metrics, r.params, r.tags, data_columns(r)


def test_run_values_are_mlflows_search_results(tmp_path):
    uri, exp, parent = _store(tmp_path, 9)
    query = f"tags.`{PARENT}` = '{parent}' and tags.`{TAG_KIND}` = 'trial'"
    want = [_values(r) for r in find_runs(uri, exp, query)]
    got = find_run_values(uri, exp, {PARENT: parent, TAG_KIND: "trial"})
    assert len(want) == 7 and want[0].metrics["val/ece"] == 0.2 + 6  # the latest step
    assert [_comparable(r) for r in got] == [_comparable(r) for r in want]  # order too
    assert any(math.isnan(r.metrics["test/ece"]) for r in got)
    assert {c for r in got for c in data_columns(r).values()} == {
        "digits=d0",
        "digits=d1",
        "digits=d2",
    }


def _queries(ref: StudyRef) -> int:
    """SQL statements run by one `trials_frame` of ``ref``."""
    engine = _client(ref.tracking_uri)._tracking_client.store.engine
    seen = []

    def count(*args):
        seen.append(args[2])

    sa.event.listen(engine, "before_cursor_execute", count)
    try:
        trials_frame(ref)
    finally:
        sa.event.remove(engine, "before_cursor_execute", count)
    return len(seen)


def _ref(uri: str, exp: str, parent: str) -> StudyRef:
    return StudyRef("scale", uri, exp, parent, (("val/ece", "min"),))


def test_trials_frame_reads_a_constant_number_of_queries(tmp_path, monkeypatch):
    counts = []
    for n in (4, 24):
        uri, exp, parent = _store(tmp_path / str(n), n)
        df = trials_frame(_ref(uri, exp, parent), include_unfinished=True)
        assert len(df) == n - 2
        counts.append(_queries(_ref(uri, exp, parent)))
    assert counts[0] == counts[1]

    def orm_search(*args, **kwargs):
        raise AssertionError("MLflow's ORM search (an object per logged value) was used")

    monkeypatch.setattr(SqlAlchemyStore, "_search_runs", orm_search)
    assert len(trials_frame(_ref(uri, exp, parent))) == 22


def test_run_values_of_a_folder_store_fall_back_to_search(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3's folder stores: opt-in
    uri = str(tmp_path / "mlruns")
    client, exp = MlflowClient(uri), experiment_id(uri, "scale")
    rid = client.create_run(exp, tags={PARENT: "p", TAG_KIND: "trial"}).info.run_id
    client.create_run(exp, tags={PARENT: "q", TAG_KIND: "trial"})
    found = find_run_values(uri, exp, {PARENT: "p", TAG_KIND: "trial"})
    assert [r.run_id for r in found] == [rid]
