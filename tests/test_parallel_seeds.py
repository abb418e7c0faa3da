"""Seeds of a trial train at the same time (issue 29 item 1), and ``search.max_concurrent: auto``
follows the cluster's resources (item 2): a real study on the shared in-process Ray (2 CPUs).

On the previous code the seeds of a trial trained one after another inside the Tune trial and
Tune saw every seed's epochs in turn (seeds × epochs reports).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from calibtune.record._tracking import PARENT, TAG_KIND
from calibtune.study import load_study, run_study

pytestmark = pytest.mark.slow


def _study(tmp: Path) -> Path:
    raw = {
        "name": "parallel_seeds",
        "trial": {
            "data": {"name": "digits"},
            "model": {"name": "mlp"},
            "optimizer": {"lr": 0.05},
            "train": {"epochs": 2, "batch_size": 64, "checkpoint_every": 1},
            "eval": {"posthoc": ["ts"]},
        },
        "losses": ["cross_entropy"],
        "search": {  # max_concurrent: auto by default
            "sampler": "grid",
            "num_samples": 1,
            "seeds": [1, 2],
            "objectives": [{"metric": "val/ece@ts", "mode": "min"}],
        },
        "tracking": {"uri": f"sqlite:///{tmp / 'mlflow.db'}", "experiment": "parallel-seeds"},
        "storage": str(tmp / "studies"),
    }
    path = tmp / "parallel_seeds.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def outcome(tmp_path_factory, ray_session):
    path = _study(tmp_path_factory.mktemp("parallel_seeds"))
    study = load_study(path)
    assert study.search.max_concurrent == "auto"
    outcome = run_study(study, verbose=0)
    outcome.study = study
    return outcome


def _seed_runs(outcome):
    client = MlflowClient(outcome.tracking_uri)
    (trial,) = client.search_runs(
        [outcome.experiment_id], f"tags.`{PARENT}` = '{outcome.parent_run_id}'"
    )
    seeds = client.search_runs([outcome.experiment_id], f"tags.`{PARENT}` = '{trial.info.run_id}'")
    return client, trial, seeds


def test_the_seeds_of_a_trial_train_at_the_same_time(outcome):
    client, _, seeds = _seed_runs(outcome)
    assert outcome.counts["finished"] == 1
    assert sorted(r.data.params["seed"] for r in seeds) == ["1", "2"]
    assert all(r.data.tags[TAG_KIND] == "seed" and r.info.status == "FINISHED" for r in seeds)
    # the two seed runs overlap in time: the later start comes before the earlier end
    assert max(r.info.start_time for r in seeds) < min(r.info.end_time for r in seeds)
    for r in seeds:  # every epoch logged once per seed run, as before
        steps = [m.step for m in client.get_metric_history(r.info.run_id, "epoch")]
        assert sorted(steps) == [1, 2]


def test_tune_sees_one_report_per_epoch_the_seed_mean(outcome):
    _, trial, seeds = _seed_runs(outcome)
    (result,) = list(outcome.results)
    df = result.metrics_dataframe
    per_epoch = df[df["calibtune/done"].isna()] if "calibtune/done" in df else df.iloc[:-1]
    assert list(per_epoch["epoch"]) == [1.0, 2.0]  # not seeds × epochs
    histories = [  # each seed's own epochs, as its trial folder saved them
        json.loads(p.read_text())["history"]
        for p in sorted(Path(outcome.storage).rglob("result.json"))
        if "-seed" in p.parent.name
    ]
    assert len(histories) == 2
    for epoch, value in zip(per_epoch["epoch"], per_epoch["val/ece@ts"], strict=True):
        per_seed = [
            next(h["val/ece@ts"] for h in hist if h["epoch"] == epoch) for hist in histories
        ]
        assert value == pytest.approx(sum(per_seed) / 2)
    # the trial's own run keeps the aggregate over seeds (objective unchanged)
    final = [r.data.metrics["test/ece"] for r in seeds]
    assert trial.data.metrics["test/ece"] == pytest.approx(sum(final) / 2)


def test_auto_concurrency_reads_the_cluster(ray_session):
    import ray
    from ray.tune.search import Searcher

    from calibtune.cluster._concurrency import AutoConcurrency, slot_usage
    from calibtune.studyfile._config import study_from_text

    cpus = int(ray.cluster_resources()["CPU"])  # 2 here
    limiter = AutoConcurrency(Searcher(), {"CPU": 1.0}, 1)
    assert limiter.max_concurrent == cpus + 1  # every slot, and one trial queued
    study = study_from_text("name: s\nlosses: [cross_entropy]\nsearch: {seeds: [1, 2]}", "s")
    assert slot_usage(study) == (0, cpus)


# `long`: a training process killed mid-trial and retried from its checkpoint stays in `make test`
# as test_cluster_ddp.py::test_study_trials_span_two_nodes_and_survive_a_worker_sigkill
@pytest.mark.long
def test_a_seed_whose_process_dies_is_retried_with_its_trial(tmp_path):
    """SIGKILL one seed's process mid-training: the trial is retried (``max_failures``, default
    3), the other seed's finished result is kept, the killed one resumes from its checkpoint,
    and every record counts once: one trial run and two seed runs, all finished, every epoch
    logged once per seed run, the Optuna trial COMPLETE (no FAIL)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import optuna

    path = _study(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["trial"]["train"]["epochs"] = 3
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    env = {
        **os.environ,
        "CALIBTUNE_FAILPOINT": "epoch_end:2",  # the first seed to finish epoch 2 pauses there
        "CALIBTUNE_FAILPOINT_DIR": str(tmp_path),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "calibtune", "run", str(path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        hit = tmp_path / "epoch_end.hit"
        deadline = time.time() + 600
        while not (hit.is_file() and hit.read_text().strip()):
            assert proc.poll() is None and time.time() < deadline, proc.stdout.read()[-3000:]
            time.sleep(0.5)
        os.kill(int(hit.read_text()), signal.SIGKILL)  # the seed's process, mid-trial
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out[-3000:]
    assert "1 finished, 0 failed" in out
    outcome_uri = raw["tracking"]["uri"]
    client = MlflowClient(outcome_uri)
    exp = client.get_experiment_by_name(raw["tracking"]["experiment"])
    runs = client.search_runs([exp.experiment_id])
    kinds = sorted(r.data.tags.get(TAG_KIND, "") for r in runs)
    assert kinds == ["seed", "seed", "study", "trial"]
    assert all(r.info.status == "FINISHED" for r in runs)
    for r in runs:
        if r.data.tags[TAG_KIND] == "seed":
            steps = [m.step for m in client.get_metric_history(r.info.run_id, "epoch")]
            assert sorted(steps) == [1, 2, 3], steps
    db = next((tmp_path / "studies").rglob("optuna.db"))
    (study,) = optuna.get_all_study_summaries(f"sqlite:///{db}")
    trials = optuna.load_study(study_name=study.study_name, storage=f"sqlite:///{db}").trials
    assert [t.state.name for t in trials] == ["COMPLETE"]


SEED_PROCESSES = """
import os
import ray
from calibtune.studyfile._config import study_from_text
from calibtune.study._trainable import seed_remote, seed_task_options

ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
TEXT = "name: s\\nlosses: [cross_entropy]\\nsearch: {seeds: [1, 2, 3]}\\n"


def probe():
    return os.getpid(), os.environ.get("CUDA_VISIBLE_DEVICES")


for label, extra in (("cpu", ""), ("gpu", "trial: {scaling: {resources_per_worker: {GPU: 1}}}\\n")):
    task = seed_remote(seed_task_options(study_from_text(TEXT + extra, "s")), probe)
    seen = [ray.get(task.remote()) for _ in range(3)]
    print(label, len({pid for pid, _ in seen}), sorted({str(dev) for _, dev in seen}))
ray.shutdown()
"""


def test_a_seed_on_a_gpu_gets_a_process_of_its_own(tmp_path):
    """Seed tasks declared as `_parallel_seeds` declares them (`seed_remote`), three in a row
    on a Ray with one (logical) GPU: on CPUs they share one process (its imports done once);
    with a GPU each gets a fresh one (CUDA keeps the first device a process saw, so a reused
    process would train on its previous seed's GPU)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", SEED_PROCESSES],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()[-2:]
    assert lines == ["cpu 1 ['None']", "gpu 3 ['0']"], out.stdout


TRIAL_PROCESS = """
import pickle
import sys

payload, config = pickle.loads(open(sys.argv[1], "rb").read())
from calibtune.study._trainable import open_trial, seed_remote

hp, child = open_trial(payload, config, "0a1b_00000", "node-a")
seed_remote(payload.seed_options)
heavy = [m for m in ("torch", "calibtune.trial", "calibtune.losses") if m in sys.modules]
print(heavy, hp["loss.gamma"], hp["loss.lam"], child.run_id)
"""


def test_a_trial_process_opens_its_run_and_declares_its_seeds_without_torch(tmp_path):
    """A trial process of a several-seed study only coordinates: everything it does before its
    seed tasks start (`open_trial`: the hyperparameters with defaults, its MLflow run; the seed
    task's declaration) runs without torch or the trial engine, whose imports (≈ 2 s of CPU)
    would be taken from the seeds training beside it. On the previous code the hyperparameters
    imported the loss registry (torch) and the seed options the trial engine."""
    import pickle
    import subprocess
    import sys

    from calibtune.study._trainable import StudyPayload
    from calibtune.studyfile._config import study_from_text

    text = "name: s\nlosses: [{name: fcl, params: {gamma: 2.5}}]\nsearch: {seeds: [1, 2]}\n"
    study = study_from_text(text, "s")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("s")
    parent = client.create_run(exp).info.run_id
    payload = StudyPayload(study, uri, exp, parent, str(tmp_path / "trials"))
    (tmp_path / "payload.pkl").write_bytes(pickle.dumps((payload, {"loss": "fcl"})))
    out = subprocess.run(
        [sys.executable, "-c", TRIAL_PROCESS, str(tmp_path / "payload.pkl")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    heavy, gamma, lam, run_id = out.stdout.strip().splitlines()[-1].rsplit(" ", 3)
    assert heavy == "[]" and (float(gamma), float(lam)) == (2.5, 1.5)  # lam: its default
    trial_run = client.get_run(run_id)
    assert trial_run.data.params["loss.gamma"] == "2.5"
    assert trial_run.data.tags["calibtune.node_id"] == "node-a"


def test_a_seed_reporting_its_epochs_keeps_its_slot(ray_session, tmp_path):
    """A seed's epoch reports (`_EpochRelay`) never wait for the relay queue's answer: a Ray task
    blocked in ``ray.get`` lends its CPUs to other tasks, so another seed would start in its slot
    (on the 2-core bench, a fifth seed process importing torch beside four training). Here the
    queue's actor takes 1 s per report, and a task asking for all the CPUs waits until the seed
    has ended; on the previous code (``Queue.put``: ``ray.get``) it ran while the seed waited."""
    import time

    import ray

    from calibtune.study._trainable import _EpochRelay

    @ray.remote(num_cpus=0)
    class SlowQueue:  # stands in for the relay queue's actor on a busy node
        def __init__(self):
            self.items = []

        def put_nowait(self, item):
            time.sleep(1.0)
            self.items.append(item)

        def received(self):
            return self.items

    cpus = int(ray.cluster_resources()["CPU"])
    marker = tmp_path / "seed-started"

    @ray.remote(num_cpus=cpus)
    def seed(queue):
        start = time.time()
        marker.write_text("")
        relay = _EpochRelay(queue, "trial", 1)
        for epoch in (1, 2):
            relay.on_epoch(epoch, {"epoch": epoch, "val/ece": 0.25, "note": "x"})
        time.sleep(0.5)
        return start, time.time()

    @ray.remote(num_cpus=cpus)
    def other():
        return time.time()

    queue = SlowQueue.remote()
    ray.get(queue.__ray_ready__.remote())
    first = seed.remote(queue)
    deadline = time.time() + 60
    while not marker.exists() and time.time() < deadline:
        time.sleep(0.05)
    second = other.remote()
    (start, end), began = ray.get(first), ray.get(second)
    assert began >= end, (start, began, end)
    deadline = time.time() + 30
    while len(got := ray.get(queue.received.remote())) < 2 and time.time() < deadline:
        time.sleep(0.2)
    assert sorted(got) == [("trial", 1, e, {"epoch": float(e), "val/ece": 0.25}) for e in (1, 2)]
