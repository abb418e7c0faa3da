"""The Tune trainable of a study: one sampled point, trained once per seed by the trial engine,
recorded in one MLflow child run (one nested run per seed when there are several).

The seeds of a trial train at the same time (`_parallel_seeds`): each is a Ray task with its own
resources (`seed_task_options`: the seed's CPU/GPU in local mode; in workers mode the task only
drives its own Ray Train run, whose workers take theirs), scheduled outside the Tune trial's
placement group, so a trial of three seeds uses three slots of the cluster and an autoscaler
sees each seed's demand. The trial reports to Tune, per epoch, the seed mean once every seed
has that epoch, and at the end the aggregate over seeds (`aggregate`). A seed that fails fails
the trial after the other seeds have ended (their results are kept): Tune retries the trial
(``search.max_failures``), whose finished seeds return their saved results at once.

A trial that fails is a result too: its run is marked failed with the reason (tag
``calibtune.error`` and ``error.txt``) before the error reaches Tune, which tells Optuna (FAIL).
A trial restored after an interruption reopens the same run (found by its Tune trial id) and the
trial engine resumes from the trial's checkpoint; a trial that had already finished returns its
saved result without training or evaluating again.

No configuration is trained twice in a study: a seed run whose resolved trial config and seed
equal a finished one's (`finished_twin`; e.g. the sampler proposed ``cross_entropy``, which has
no hyperparameters, again) reuses that result. Its run gets the twin's epochs, metrics and
artifacts and the tag ``calibtune.reused_from``, and Tune (so Optuna) gets the same values.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calibtune._failpoints import failpoint
from calibtune._io import atomic_write
from calibtune.cluster import check_this_node, node_versions
from calibtune.metrics import keys as K
from calibtune.record import (
    TAG_LOSS,
    TAG_REUSED,
    ChildRun,
    MlflowTrialCallback,
    log_data_inputs,
    log_missing,
    set_tag,
    trial_inputs,
    watch_retries,
)
from calibtune.storage import open_storage
from calibtune.studyfile import STATE_FILE, StudyConfig, decode


def _trial() -> Any:
    """The trial engine (`calibtune.trial`), for the functions that build, run or read a trial."""
    # deferred: torch; neither a trial process that only coordinates its seeds nor the driver's
    # planning imports it
    from calibtune import trial

    return trial


__all__ = [
    "StudyPayload",
    "aggregate",
    "config_key",
    "failure_reason",
    "finished_twin",
    "hyperparameters",
    "open_trial",
    "remember_config",
    "seed_remote",
    "seed_task_options",
    "trial_dict",
]

#: in a trial's last report to Tune: the trial whose result it reused (`finished_twin`)
REUSED_KEY = "calibtune/reused_from"

# A Tune trial that only drives Ray Train workers holds no CPU (the workers need them) but a
# bundle may not be empty: it asks for 1 MiB of Ray's "memory" resource, which every node has.
DRIVER_RESOURCES = {"cpu": 0.0, "memory": float(1024**2)}


@dataclass(frozen=True)
class StudyPayload:
    """Everything a Tune trial needs besides its sampled config (passed by tune.with_parameters).
    ``seed_options`` (`seed_task_options`, filled in by the driver when not given): so that a
    trial process, which only coordinates its seeds, never loads the trial engine (torch)."""

    study: StudyConfig  # validated once by the driver; workers never re-read files
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    trials_dir: str
    seed_options: Mapping[str, Any] = field(default_factory=dict)
    #: the driver's versions and Ray node: a trial on another node checks it first
    #: (`calibtune.cluster._nodes.check_this_node`)
    driver_versions: Mapping[str, str] = field(default_factory=dict)
    driver_node: str | None = None

    def __post_init__(self) -> None:
        if not self.seed_options:
            object.__setattr__(self, "seed_options", seed_task_options(self.study))
        if not self.driver_versions:
            object.__setattr__(self, "driver_versions", node_versions())
        if self.driver_node is None:
            object.__setattr__(self, "driver_node", _this_node())


def _this_node() -> str | None:
    """The Ray node this process runs on (None before Ray starts)."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def trial_dict(study: StudyConfig, sampled: Mapping[str, Any], seed: int, name: str) -> dict:
    """The trial-config mapping for one sampled point (validated by the trial engine)."""
    apply_overrides = _trial().apply_overrides

    label = sampled["loss"]
    choice = study.loss(label)
    params = {
        **choice.loss.space.fixed,
        **{k: decode(v) for k, v in dict(sampled.get(label) or {}).items()},
    }
    base = copy.deepcopy(dict(study.trial))
    overrides = [f"{k}={json.dumps(v)}" for k, v in sorted((sampled.get("trial") or {}).items())]
    d = apply_overrides(base, overrides)
    d["loss"] = {
        "name": choice.loss.loss,
        "params": params,
        "reduction": choice.reduction,
        "compile": choice.compile,
    }
    if choice.epochs is not None:  # the arm trains as long as its authors trained it
        d["train"] = {**dict(d.get("train") or {}), "epochs": choice.epochs}
    d["seed"] = seed
    d["name"] = name
    objectives_posthoc = sorted(
        {
            m
            for o in (*study.search.objectives, *study.search.constraints)
            if (m := K.parse(o.metric).method)
        }
    )
    ev = dict(d.get("eval") or {})
    if objectives_posthoc:
        ev["epoch_posthoc"] = sorted(set(ev.get("epoch_posthoc") or []) | set(objectives_posthoc))
    if any(K.parse(o.metric).split == "val_shift" for o in study.search.objectives):
        ev["epoch_shift"] = True  # every report (Optuna's, ASHA's) must carry the objective
    if any(
        K.is_final_only(o.metric) for o in (*study.search.objectives, *study.search.constraints)
    ):
        ev["epoch_selective"] = True
    d["eval"] = ev
    return d


def hyperparameters(study: StudyConfig, sampled: Mapping[str, Any]) -> dict[str, Any]:
    """The trial's resolved hyperparameters only: its loss's (defaults filled) and searched keys.
    Without torch: the loss's declaration travels with the study (`LossSpace.resolve`)."""
    label = sampled["loss"]
    choice = study.loss(label)
    raw = {
        **choice.loss.space.fixed,
        **{k: decode(v) for k, v in dict(sampled.get(label) or {}).items()},
    }
    resolved = choice.loss.resolve(**raw)
    out: dict[str, Any] = {"loss": choice.loss.loss, "loss_label": label}
    out.update({f"loss.{k}": v for k, v in resolved.items()})
    out.update(dict(sampled.get("trial") or {}))
    return out


def aggregate(per_seed: list[Mapping[str, float]]) -> dict[str, float]:
    """Seed mean of every metric; with several seeds also ``<metric>_std`` (population std)."""
    keys = sorted(set().union(*per_seed))
    out: dict[str, float] = {}
    for k in keys:
        vals = [float(m[k]) for m in per_seed if k in m and isinstance(m[k], (int, float))]
        if not vals:
            continue
        mean = sum(vals) / len(vals)
        out[k] = mean
        if len(per_seed) > 1 and not K.is_statistic(k):  # no std of a CI bound
            out[K.std_key(k)] = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
    return out


def failure_reason(exc: BaseException) -> str:
    """One readable line: the trial engine's reason, else the innermost exception's."""
    TrialFailedError = _trial().TrialFailedError

    if isinstance(exc, TrialFailedError):
        return str(exc).strip().splitlines()[0][:300]
    inner: BaseException = exc
    while inner.__cause__ is not None:
        inner = inner.__cause__
    text = str(inner).strip().splitlines()
    return f"{type(inner).__name__}: {text[-1] if text else ''}"[:300]


def _seed_run(
    payload: StudyPayload,
    config: Mapping[str, Any],
    hp: dict,
    child: ChildRun,
    trial_id: str,
    seed: int,
    extra: list[Any] | None = None,
) -> Any:
    T = _trial()

    study = payload.study
    name = f"{trial_id}-seed{seed}"
    run_id, seed_run = child.run_id, None
    if len(study.search.seeds) > 1:
        seed_run = ChildRun(
            payload.tracking_uri,
            payload.experiment_id,
            child.run_id,  # type: ignore[arg-type]
            key=name,
            name=f"seed {seed}",
            kind="seed",
        )
        run_id = seed_run.open(params={**hp, "seed": seed}, tags={TAG_LOSS: hp["loss"]})
    try:
        cfg = T.config_from_dict(trial_dict(study, config, seed, name))
        inputs = trial_inputs(cfg)  # data lineage: every split and OOD/shift set, digested
        if seed_run is not None:  # the trial's run holds every seed's data
            log_data_inputs(payload.tracking_uri, child.run_id, inputs)  # type: ignore[arg-type]
        draws = study.base_config().eval.figures
        logger = MlflowTrialCallback(
            payload.tracking_uri,
            run_id,  # type: ignore[arg-type]
            cfg.eval.log_adaptive_bins,
            background=True,
            # the driver draws them after Tune has the result (`render_deferred_figures`;
            # it looks for them when the study's own trial config draws figures)
            figures_for=study.name if cfg.eval.figures and draws else None,
            retries_to=_local_study_folder(payload),
            inputs=inputs,
        )
        twin = finished_twin(payload.trials_dir, cfg, name)
        if twin is not None:
            res = _reuse(payload, run_id, logger, *twin)  # type: ignore[arg-type]
        else:
            callbacks = [logger, *(extra or [])]
            res = T.run(cfg, callbacks=callbacks, storage_path=payload.trials_dir)
            remember_config(payload.trials_dir, cfg, name)
    except SystemExit:  # Tune ending the trial's actor (a graceful stop): resumable, not failed
        raise
    except BaseException as exc:
        if seed_run is not None:
            seed_run.fail(failure_reason(exc), traceback.format_exc())
        raise
    if seed_run is not None:
        seed_run.close("finished")
    return res


# ----------------------------------------------------------------------------- reuse

#: ``<trials>/.configs/<config key>`` names the trial folder that trained that config first
CONFIGS_DIR = ".configs"


def config_key(cfg: Any) -> str:
    """What makes two seed runs of a study the same training: the resolved trial config, seed
    included, its name left out (sha256 of its canonical JSON)."""
    config_to_dict = _trial().config_to_dict

    d = config_to_dict(cfg)
    d.pop("name", None)
    text = json.dumps(d, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def finished_twin(trials_dir: str, cfg: Any, name: str) -> tuple[str, Any] | None:
    """Another finished seed run of the study that trained exactly ``cfg`` (the trial folder's
    name and its saved `TrialResult`), else None (also for ``name`` itself: a restored trial's
    own result is the trial engine's to return)."""
    saved_result = _trial().saved_result

    try:
        twin = (open_storage(trials_dir) / CONFIGS_DIR / config_key(cfg)).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    if twin == name or not twin:
        return None
    result = saved_result(cfg, trials_dir, twin)  # checks the saved config, not just the key
    return None if result is None else (twin, result)


def remember_config(trials_dir: str, cfg: Any, name: str) -> None:
    """Record that seed run ``name`` finished training ``cfg`` (the first to do so stays)."""
    marker = open_storage(trials_dir) / CONFIGS_DIR / config_key(cfg)
    if not marker.exists():
        atomic_write(marker, name)


def _reuse(payload: StudyPayload, run_id: str, logger: Any, twin: str, result: Any) -> Any:
    """Log a finished twin's epochs, final metrics and artifacts to this trial's run, tagged
    `TAG_REUSED` with the twin's Tune trial id, instead of training the same config again."""
    set_tag(payload.tracking_uri, run_id, TAG_REUSED, twin.rsplit("-seed", 1)[0])
    logger.on_start(result.history)
    logger.on_trial_end(result.metrics, result.artifacts_dir)
    return result


def _local_study_folder(payload: StudyPayload) -> str | None:
    """The study folder when it is on a disk (where trial processes record their retried MLflow
    requests for the driver: `watch_retries`); None for a bucket, which has no appendable file."""
    trials = open_storage(payload.trials_dir)
    return str(trials.parent.local_path()) if trials.is_local else None


def open_trial(
    payload: StudyPayload, config: Mapping[str, Any], trial_id: str, node: str
) -> tuple[dict[str, Any], ChildRun]:
    """The trial's resolved hyperparameters and its MLflow run, opened (or reopened: keyed by
    the Tune trial id) on ``node``: all a trial process does before its seeds start, with
    neither torch nor the trial engine loaded (tests/test_parallel_seeds.py)."""
    hp = hyperparameters(payload.study, config)
    label = config["loss"]
    child = ChildRun(
        payload.tracking_uri,
        payload.experiment_id,
        payload.parent_run_id,
        key=trial_id,
        name=_run_name(label, hp, payload.study.search.seeds),
    )
    child.open(
        params=hp,
        tags={
            TAG_LOSS: hp["loss"],
            "calibtune.loss_label": label,
            "calibtune.node_id": node,
            TAG_PRECISION: trial_precision(payload.study.trial, hp),
        },
    )
    return hp, child


#: the trial's ``train.precision`` (``fp32`` is float32 with TF32 off; ``tf32`` turns it on)
TAG_PRECISION = "calibtune.precision"


def trial_precision(trial: Mapping[str, Any], hp: Mapping[str, Any]) -> str:
    """The ``train.precision`` a trial trains at: its searched value, else the study's trial
    section's, else ``fp32``.

    >>> trial_precision({"train": {"precision": "bf16"}}, {}), trial_precision({}, {})
    ('bf16', 'fp32')
    >>> trial_precision({"train": {"precision": "bf16"}}, {"train.precision": "tf32"})
    'tf32'
    """
    train = trial.get("train") or {}
    return str(hp.get("train.precision", train.get("precision", "fp32")))


def study_trainable(config: dict[str, Any], payload: StudyPayload) -> None:
    """Tune function trainable: one sampled config, trained once per seed via the trial engine."""
    import ray
    from ray import tune

    failpoint("trial_start")
    if (folder := _local_study_folder(payload)) is not None:
        watch_retries(folder)  # the study folder: the driver tells of them
    study = payload.study
    trial_id = tune.get_context().get_trial_id()
    node = ray.get_runtime_context().get_node_id()
    if node != payload.driver_node:  # a node that joined after the start: checked once
        study_dir = open_storage(payload.trials_dir).parent
        check_this_node(study_dir.uri, STATE_FILE, payload.driver_versions, node)
    hp, child = open_trial(payload, config, trial_id, node)
    try:
        if len(study.search.seeds) == 1:
            results = [_seed_run(payload, config, hp, child, trial_id, study.search.seeds[0])]
        else:
            results = _parallel_seeds(payload, config, hp, child, trial_id)
    except SystemExit:  # (see `_seed_run`)
        raise
    except BaseException as exc:
        child.fail(failure_reason(exc), traceback.format_exc())
        raise
    final = aggregate([r.metrics for r in results])
    # the last epoch's values too: an objective may be an epoch metric (val/ece)
    last = aggregate([{k: v for k, v in r.history[-1].items() if _scalar(v)} for r in results])
    if len(results) > 1:  # the trial's run holds the seed means (the seed runs the series)
        epochs = int(results[0].history[-1]["epoch"])
        log_missing(payload.tracking_uri, child.run_id, last, step=epochs)  # type: ignore[arg-type]
        log_missing(payload.tracking_uri, child.run_id, final)  # type: ignore[arg-type]
    twin = _reused_from(results, trial_id)
    if twin is not None and len(results) > 1:  # every seed's: the trial's run says so too
        set_tag(payload.tracking_uri, child.run_id, TAG_REUSED, twin)  # type: ignore[arg-type]
    child.close("finished")
    tune.report({**last, **final, "calibtune/done": 1.0, **({REUSED_KEY: twin} if twin else {})})


# ----------------------------------------------------------------------------- seeds in parallel

#: seconds between two looks at the seed tasks and their epoch reports
_POLL_S = 0.5


def seed_task_options(study: StudyConfig) -> dict[str, Any]:
    """Ray options of one seed's task: in local mode it trains (the seed's CPU, GPU and custom
    resources, as `trial_resources` would give a one-seed trial); with Train workers it only
    drives them (no CPU: the workers hold the resources). ``DEFAULT`` scheduling: outside the
    Tune trial's placement group. ``max_retries=0``: Tune's ``max_failures`` is the one retry.
    A seed that trains on a GPU gets a process of its own (``max_calls=1``: CUDA keeps the
    device a process first saw, so a reused process would train on its previous seed's GPU;
    Ray sets this default only for a function declared with GPUs, ray-project/ray#29624);
    on CPUs the processes, their imports done, are reused.

    >>> from calibtune.studyfile._config import study_from_text
    >>> s = study_from_text("name: s\\nlosses: [cross_entropy]\\nsearch: {seeds: [1, 2]}", "s")
    >>> [seed_task_options(s)[k] for k in ("num_cpus", "max_calls")]
    [1.0, 0]
    """
    cfg = study.base_config()
    opts: dict[str, Any] = {"max_retries": 0, "scheduling_strategy": "DEFAULT", "max_calls": 0}
    if cfg.scaling.num_workers:
        return {**opts, "num_cpus": 0, "memory": DRIVER_RESOURCES["memory"]}
    worker_bundle = _trial().worker_bundle

    bundle = worker_bundle(cfg.scaling)
    custom = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}
    gpus = bundle.get("GPU", 0.0)
    opts |= {"num_cpus": bundle.get("CPU", 1.0), "num_gpus": gpus, "max_calls": int(gpus > 0)}
    return opts | ({"resources": custom} if custom else {})


@dataclass(frozen=True)
class _EpochRelay:
    """`TrialCallback` of one seed: each epoch's scalars to the trial's relay queue, tagged with
    the Tune trial id and the seed (a reused trial process keeps its queue across trials).
    Sent without waiting for the queue's answer: a task blocked in ``ray.get`` lends its CPUs
    to other tasks meanwhile, so waiting would let another seed start in this seed's slot (a
    fresh process importing torch beside the seeds training). A lost report costs nothing: the
    trial takes every epoch from the seed's result at its end."""

    queue: Any  # the relay queue's actor (`ray.util.queue.Queue.actor`)
    trial_id: str
    seed: int

    def on_start(self, history: list[Mapping[str, Any]]) -> None:
        for metrics in history:
            self.on_epoch(int(metrics["epoch"]), metrics)

    def on_epoch(self, epoch: int, metrics: Mapping[str, Any]) -> None:
        row = {k: float(v) for k, v in metrics.items() if _scalar(v)}
        self.queue.put_nowait.remote((self.trial_id, self.seed, epoch, row))

    def on_trial_end(self, metrics: Mapping[str, float], artifacts_dir: Path) -> None:
        pass


def _seed_task(
    payload: StudyPayload,
    config: Mapping[str, Any],
    hp: dict,
    child: ChildRun,
    trial_id: str,
    seed: int,
    queue: Any,
) -> Any:
    """One seed of a trial, in its own Ray task (`seed_task_options`)."""
    if (folder := _local_study_folder(payload)) is not None:
        watch_retries(folder)
    relay = _EpochRelay(queue.actor, trial_id, seed)
    return _seed_run(payload, config, hp, child, trial_id, seed, extra=[relay])


def seed_remote(options: Mapping[str, Any], fn: Any = _seed_task) -> Any:
    """``fn`` (a seed's task) as a Ray remote function declared with ``options``
    (`seed_task_options`): in the declaration, because Ray refuses ``max_calls`` in
    ``.options()`` and gives a GPU task a process of its own only when it is declared with its
    GPUs (ray-project/ray#29624)."""
    import ray

    return ray.remote(**options)(fn)


_RELAY: list[Any] = []  # this trial process's relay queue (made on first use)


def _relay_queue() -> Any:
    from ray.util.queue import Queue

    if not _RELAY:  # an actor without CPU, outside the trial's placement group
        _RELAY.append(Queue(actor_options={"num_cpus": 0, "scheduling_strategy": "DEFAULT"}))
    return _RELAY[0]


def _parallel_seeds(
    payload: StudyPayload, config: Mapping[str, Any], hp: dict, child: ChildRun, trial_id: str
) -> list[Any]:
    """Train every seed at once (`_seed_task`), report the seed mean of each epoch to Tune as
    soon as all seeds have it, and return the seeds' results in the study's seed order. A seed
    that fails raises once the others have ended; a stop (Tune's, ASHA's) cancels them."""
    import ray

    seeds = payload.study.search.seeds
    queue = _relay_queue()
    task = seed_remote(payload.seed_options)
    pending = {task.remote(payload, config, hp, child, trial_id, s, queue): s for s in seeds}
    epochs: dict[int, dict[int, dict[str, float]]] = {s: {} for s in seeds}
    results: dict[int, Any] = {}
    errors: list[BaseException] = []
    reported = 0
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=_POLL_S)
            _drain(queue, trial_id, epochs)
            for ref in done:
                seed = pending.pop(ref)
                try:
                    results[seed] = ray.get(ref)
                except Exception as exc:  # the seed's own error (Ray keeps its type)
                    errors.append(exc)
                    continue
                for row in results[seed].history:
                    epochs[seed][int(row["epoch"])] = {
                        k: float(v) for k, v in row.items() if _scalar(v)
                    }
            if not errors:
                reported = _report_epochs(epochs, reported)
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    if errors:
        raise errors[0]
    return [results[s] for s in seeds]


def _drain(queue: Any, trial_id: str, epochs: dict[int, dict[int, dict[str, float]]]) -> None:
    """Move the epoch reports waiting in ``queue`` into ``epochs`` (seed -> epoch -> scalars)."""
    n = queue.size()
    if not n:
        return
    for tid, seed, epoch, row in queue.get_nowait_batch(n):
        if tid == trial_id and seed in epochs:
            epochs[seed][int(epoch)] = row


def _report_epochs(epochs: Mapping[int, Mapping[int, Mapping[str, float]]], reported: int) -> int:
    """Report to Tune, in order, every epoch after ``reported`` that all seeds have (their mean,
    `aggregate`); return the last epoch reported."""
    from ray import tune

    common = set.intersection(*(set(e) for e in epochs.values()))
    for epoch in sorted(e for e in common if e > reported):
        if epoch != reported + 1:
            break
        tune.report(aggregate([epochs[s][epoch] for s in epochs]))
        reported = epoch
    return reported


def _reused_from(results: list[Any], trial_id: str) -> str | None:
    """The one other trial whose results these all are (`finished_twin`), else None."""
    sources = {r.trial_dir.name.rsplit("-seed", 1)[0] for r in results}
    return sources.pop() if len(sources) == 1 and trial_id not in sources else None


def _scalar(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _run_name(label: str, hp: Mapping[str, Any], seeds: tuple[int, ...]) -> str:
    """``focal γ=2.41`` style: the loss label and its searched values, short."""
    params = [
        f"{k.split('.', 1)[1]}={v:.3g}" if isinstance(v, float) else f"{k.split('.', 1)[1]}={v}"
        for k, v in sorted(hp.items())
        if k.startswith("loss.")
    ]
    seed = f" seeds={len(seeds)}" if len(seeds) > 1 else ""
    return " ".join([label, *params[:4]]) + seed


def trial_resources(study: StudyConfig) -> dict[str, float]:
    """The Tune trial's own resources: in local mode with one seed it trains
    (``resources_per_worker``'s CPU, default 1, and with ``use_gpu`` its GPU, default 1 — a
    fraction such as 0.25 packs four trials on one GPU through Tune's fractional resources);
    with Train workers, or with several seeds (each a Ray task with its own resources,
    `seed_task_options`), it only drives them (`DRIVER_RESOURCES`)."""
    cfg = study.base_config()
    if cfg.scaling.num_workers == 0 and len(study.search.seeds) == 1:
        per = cfg.scaling.resources_per_worker
        res = {"cpu": float(per.get("CPU", 1.0))}
        if cfg.scaling.use_gpu:
            res["gpu"] = float(per.get("GPU", 1.0))
        return res | {k: float(v) for k, v in per.items() if k not in ("CPU", "GPU")}
    return dict(DRIVER_RESOURCES)


def make_trainable(study: StudyConfig, payload: StudyPayload) -> Any:
    from ray import tune

    return tune.with_resources(
        tune.with_parameters(study_trainable, payload=payload), trial_resources(study)
    )
