"""Run a study: Ray Tune + Optuna over the trial engine, logging to MLflow.

The search space is define-by-run (Optuna): the loss label is sampled first, then only that
loss's hyperparameters (named ``<label>/<param>``), then any searched trial-config keys
(``trial/<key.path>``), so trials never carry another loss's parameters. Each Tune trial runs the
trial engine once per seed (``search.seeds``) and reports the seed mean (and ``<metric>_std``).

Objectives are validation metrics; every epoch report of the trial engine carries them (post-hoc
objectives such as ``val/ece@ts`` are evaluated each epoch through ``eval.epoch_posthoc``), which
OptunaSearch and ASHA require. A trial stopped early by ASHA reaches Optuna as COMPLETE with the
value of its last epoch (Ray's OptunaSearch does not mark it PRUNED).
"""

from __future__ import annotations

import copy
import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from calibtune.study._config import StudyConfig, load_study
from calibtune.study._spaces import decode
from calibtune.study._tracking import (
    TAG_HASH,
    TAG_LOSS,
    ChildRun,
    MlflowTrialCallback,
    finish_run,
    git_sha,
    open_study_run,
    resolve_tracking_uri,
    versions,
)

# A Tune trial that only drives Ray Train workers holds no CPU (the workers need them) but a
# bundle may not be empty: it asks for 1 MiB of Ray's "memory" resource, which every node has.
DRIVER_RESOURCES = {"cpu": 0.0, "memory": float(1024**2)}
STATE_FILE = "calibtune_study.json"


def default_storage(cwd: str | Path | None = None) -> Path:
    return Path(cwd or os.getcwd()).resolve() / "runs" / "studies"


def study_dir(study: StudyConfig, storage: str | Path | None = None) -> Path:
    base = Path(storage or study.storage or default_storage()).expanduser().resolve()
    return base / study.name


# ------------------------------------------------------------------------- search space


def _suggest(trial: Any, name: str, dist: BaseDistribution) -> Any:
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(name, list(dist.choices))
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
    if isinstance(dist, FloatDistribution):
        return trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)
    raise TypeError(f"unsupported distribution {dist!r}")  # pragma: no cover


class DefineByRun:
    """The Optuna define-by-run space: loss first, then only that loss's parameters.

    A picklable callable (OptunaSearch pickles itself into the study's Tune state for restore).
    """

    def __init__(self, study: StudyConfig) -> None:
        self.labels = [c.label for c in study.losses]
        self.loss_dists = {c.label: sorted(c.loss.space.dists.items()) for c in study.losses}
        self.trial_dists = sorted(study.space.dists.items())

    def __call__(self, trial: Any) -> dict[str, Any] | None:
        label = trial.suggest_categorical("loss", self.labels)
        for name, dist in self.loss_dists[label]:
            _suggest(trial, f"{label}/{name}", dist)
        for key, dist in self.trial_dists:
            _suggest(trial, f"trial/{key}", dist)
        return None


def define_by_run(study: StudyConfig) -> DefineByRun:
    return DefineByRun(study)


def conditional_grid(study: StudyConfig) -> list[dict[str, Any]]:
    """Every point of a conditional grid: for each loss, the product of its categorical choices
    (and of the searched trial keys). Optuna's GridSampler would cross every loss with every other
    loss's parameters; these points are enqueued instead, each evaluated once."""
    import itertools

    extra = sorted(study.space.dists.items())
    points = []
    for c in study.losses:
        own = sorted(c.loss.space.dists.items())
        names = [f"{c.label}/{n}" for n, _ in own] + [f"trial/{k}" for k, _ in extra]
        choices = [list(d.choices) for _, d in own + extra]  # type: ignore[attr-defined]
        for combo in itertools.product(*choices):
            points.append({"loss": c.label, **dict(zip(names, combo, strict=True))})
    return points


def make_sampler(study: StudyConfig) -> Any:
    import optuna

    s = study.search
    seed = s.sampler_seed
    if s.sampler == "tpe":
        # multivariate + group model the conditional (per-loss) sub-spaces jointly
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True)
    if s.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if s.sampler == "grid":  # the points themselves are enqueued (`conditional_grid`)
        return optuna.samplers.RandomSampler(seed=seed)
    if s.sampler == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    if s.sampler == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if s.sampler == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    raise AssertionError(s.sampler)


# ------------------------------------------------------------------------- trial config


def trial_dict(study: StudyConfig, sampled: Mapping[str, Any], seed: int, name: str) -> dict:
    """The trial-config mapping for one sampled point (validated by the trial engine)."""
    from calibtune.trial._config import apply_overrides

    label = sampled["loss"]
    choice = study.loss(label)
    params = {
        **choice.loss.space.fixed,
        **{k: decode(v) for k, v in dict(sampled.get(label) or {}).items()},
    }
    base = copy.deepcopy(dict(study.trial))
    overrides = [f"{k}={json.dumps(v)}" for k, v in sorted((sampled.get("trial") or {}).items())]
    d = apply_overrides(base, overrides)
    d["loss"] = {"name": choice.loss.loss, "params": params}
    d["seed"] = seed
    d["name"] = name
    objectives_posthoc = sorted(
        {o.metric.split("@", 1)[1] for o in study.search.objectives if "@" in o.metric}
    )
    if objectives_posthoc:
        ev = dict(d.get("eval") or {})
        ev["epoch_posthoc"] = sorted(set(ev.get("epoch_posthoc") or []) | set(objectives_posthoc))
        d["eval"] = ev
    return d


def hyperparameters(study: StudyConfig, sampled: Mapping[str, Any]) -> dict[str, Any]:
    """The trial's resolved hyperparameters only: its loss's (defaults filled) and searched keys."""
    from calibtune.losses import LOSSES

    label = sampled["loss"]
    choice = study.loss(label)
    raw = {
        **choice.loss.space.fixed,
        **{k: decode(v) for k, v in dict(sampled.get(label) or {}).items()},
    }
    resolved = LOSSES.get(choice.loss.loss).resolve(**raw)
    out: dict[str, Any] = {"loss": choice.loss.loss, "loss_label": label}
    out.update({f"loss.{k}": v for k, v in resolved.items()})
    out.update(dict(sampled.get("trial") or {}))
    return out


# ------------------------------------------------------------------------- the trainable


@dataclass(frozen=True)
class StudyPayload:
    """Everything a Tune trial needs besides its sampled config (passed by tune.with_parameters)."""

    study: StudyConfig  # validated once by the driver; workers never re-read files
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    trials_dir: str


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
        if len(per_seed) > 1:
            out[f"{k}_std"] = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
    return out


def study_trainable(config: dict[str, Any], payload: StudyPayload) -> None:
    """Tune function trainable: one sampled config, trained once per seed via the trial engine."""
    from ray import tune

    from calibtune import trial as T

    study = payload.study
    trial_id = tune.get_context().get_trial_id()
    label = config["loss"]
    hp = hyperparameters(study, config)
    child = ChildRun(
        payload.tracking_uri,
        payload.experiment_id,
        payload.parent_run_id,
        key=trial_id,
        name=f"{label}-{trial_id}",
    )
    import ray

    node = ray.get_runtime_context().get_node_id()
    child.open(
        params=hp,
        tags={TAG_LOSS: hp["loss"], "calibtune.loss_label": label, "calibtune.node_id": node},
    )
    per_seed = []
    try:
        for seed in study.search.seeds:
            name = f"{trial_id}-seed{seed}"
            run_id = child.run_id
            seed_run = None
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
            cfg = T.config_from_dict(trial_dict(study, config, seed, name))
            res = T.run(
                cfg,
                callbacks=[MlflowTrialCallback(payload.tracking_uri, run_id)],  # type: ignore[arg-type]
                storage_path=payload.trials_dir,
            )
            if seed_run is not None:
                seed_run.close("finished")
            per_seed.append(res.metrics)
        final = aggregate(per_seed)
        if len(per_seed) > 1:
            from calibtune.study._tracking import log_metrics

            log_metrics(payload.tracking_uri, child.run_id, final)  # type: ignore[arg-type]
        child.close("finished")
    except BaseException:
        child.close("failed")
        raise
    tune.report({**final, "calibtune/done": 1.0})


# ------------------------------------------------------------------------- driver


def _objective_args(study: StudyConfig) -> tuple[Any, Any]:
    objs = study.search.objectives
    if len(objs) == 1:
        return objs[0].metric, objs[0].mode
    return [o.metric for o in objs], [o.mode for o in objs]


def _resources(study: StudyConfig) -> dict[str, float]:
    """The Tune trial's own resources: in local mode it trains (1 CPU, or 1 GPU); with Train
    workers it only drives them (`DRIVER_RESOURCES`)."""
    cfg = study.base_config()
    if cfg.scaling.num_workers == 0:
        res = {"cpu": float(cfg.scaling.resources_per_worker.get("CPU", 1.0))}
        if cfg.scaling.use_gpu:
            res["gpu"] = 1.0
        return res
    return dict(DRIVER_RESOURCES)


def _progress(study: StudyConfig) -> Any:
    """A ray.tune Callback printing one line per finished trial and the best so far (the class is
    defined here so that importing this module does not import Ray)."""
    from ray.tune import Callback

    class Progress(Callback):
        def __init__(self) -> None:
            self.done = 0
            self.best: float | None = None

        def on_trial_complete(self, iteration, trials, trial, **info):  # type: ignore[override]
            self.done += 1
            metric, mode = study.search.objectives[0].metric, study.search.objectives[0].mode
            value = (trial.last_result or {}).get(metric)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if self.best is None:
                    self.best = float(value)
                elif mode == "min":
                    self.best = min(self.best, float(value))
                else:
                    self.best = max(self.best, float(value))
            running = sum(1 for t in trials if t.status == "RUNNING" and t is not trial)
            best = "n/a" if self.best is None else f"{self.best:.4f}"
            print(
                f"[calibtune] trial {trial.trial_id} ({trial.config.get('loss')}) done: "
                f"{metric}={value if value is None else f'{value:.4f}'} | finished {self.done}/"
                f"{study.search.num_samples}, running {running} | best {metric} {best}",
                flush=True,
            )

        def on_trial_error(self, iteration, trials, trial, **info):  # type: ignore[override]
            print(f"[calibtune] trial {trial.trial_id} failed: {trial.error_file}", flush=True)

    return Progress()


def client_token_auth() -> None:
    """Ray 2.60 clusters use token auth (~/.ray/auth_token); a client of an explicit address
    must say so with RAY_AUTH_MODE=token, and a process that already imported Ray must also
    refresh Ray's cached config. An explicit RAY_AUTH_MODE from the user is respected."""
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is not None and mode.lower() != "token":
        return
    try:
        from ray._private.authentication.authentication_token_setup import _enable_token_auth

        _enable_token_auth()  # sets the variable and re-reads RayConfig
    except ImportError:  # pragma: no cover - another Ray version
        os.environ["RAY_AUTH_MODE"] = "token"


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Connect to ``address`` or start a local Ray sized for this machine."""
    import ray

    if ray.is_initialized():
        return
    if address:
        client_token_auth()
        ray.init(address=address, log_to_driver=True)
        return
    total = num_cpus or os.cpu_count() or 1
    # The object store default (30% of RAM) is far more than trials on the embedded data need.
    ray.init(
        address="local",  # always a fresh local instance, never some other process's cluster
        num_cpus=total,
        object_store_memory=int(os.environ.get("CALIBTUNE_OBJECT_STORE_BYTES", 256 * 1024**2)),
        include_dashboard=False,
        log_to_driver=True,
    )


@dataclass
class StudyOutcome:
    name: str
    storage: Path
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    results: Any  # ray.tune.ResultGrid


def _payload_and_parent(
    study: StudyConfig, storage: Path, tracking_uri: str | None
) -> tuple[StudyPayload, Any]:
    uri = resolve_tracking_uri(tracking_uri or study.tracking.uri)
    artifacts = [Path(study.path)] if study.path else []
    artifacts += sorted({Path(c.loss.path) for c in study.losses if c.loss.path})
    parent = open_study_run(
        uri,
        study.experiment,
        study.name,
        storage,
        tags={TAG_HASH: study.file_hash, "calibtune.git_sha": git_sha()}
        | {f"version.{k}": v for k, v in versions().items()},
        artifacts=artifacts,
    )
    state = {
        "study_path": str(Path(study.path).resolve()) if study.path else None,
        "tracking_uri": uri,
        "experiment_id": parent.experiment_id,
        "parent_run_id": parent.run_id,
    }
    (storage / STATE_FILE).write_text(json.dumps(state, indent=2))
    (storage / "study.yaml").write_text(study.text)
    payload = StudyPayload(
        study=study,
        tracking_uri=uri,
        experiment_id=parent.experiment_id,
        parent_run_id=parent.run_id,
        trials_dir=str(storage / "trials"),
    )
    return payload, parent


def _trainable(study: StudyConfig, payload: StudyPayload) -> Any:
    from ray import tune

    return tune.with_resources(
        tune.with_parameters(study_trainable, payload=payload), _resources(study)
    )


def run_study(
    study: StudyConfig | str | Path,
    *,
    address: str | None = None,
    tracking_uri: str | None = None,
    storage: str | Path | None = None,
    verbose: int = 1,
) -> StudyOutcome:
    """Run (or, if its storage already holds it, continue) a study and return its results."""
    from ray import tune
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    if not isinstance(study, StudyConfig):
        study = load_study(study)
    sdir = study_dir(study, storage)
    if (sdir / "tuner.pkl").exists():
        return resume_study(sdir, address=address, verbose=verbose)
    _check_files(study)  # bad input stops here, before anything is written or started
    init_ray(address)
    _check_cluster(study)
    sdir.mkdir(parents=True, exist_ok=True)
    payload, parent = _payload_and_parent(study, sdir, tracking_uri)
    metric, mode = _objective_args(study)
    searcher = OptunaSearch(
        space=define_by_run(study),
        metric=metric,
        mode=mode,
        sampler=make_sampler(study),
        points_to_evaluate=conditional_grid(study) if study.search.sampler == "grid" else None,
        study_name=study.name,
        seed=None,
    )
    searcher = ConcurrencyLimiter(searcher, max_concurrent=study.search.max_concurrent)
    scheduler = None
    if study.search.scheduler == "asha":
        from ray.tune.schedulers import ASHAScheduler

        epochs = study.base_config().train.epochs
        scheduler = ASHAScheduler(
            time_attr="training_iteration",
            max_t=epochs,
            grace_period=min(study.search.grace_period, epochs),
        )
    tuner = tune.Tuner(
        _trainable(study, payload),
        tune_config=tune.TuneConfig(
            search_alg=searcher,
            scheduler=scheduler,
            num_samples=study.search.num_samples,
            metric=metric if isinstance(metric, str) else None,
            mode=mode if isinstance(mode, str) else None,
        ),
        run_config=tune.RunConfig(
            name=study.name,
            storage_path=str(sdir.parent),
            failure_config=tune.FailureConfig(max_failures=study.search.max_failures),
            callbacks=[_progress(study)],
            verbose=verbose,
        ),
    )
    return _fit(tuner, study, sdir, payload, parent)


def _fit(
    tuner: Any, study: StudyConfig, sdir: Path, payload: StudyPayload, parent: Any
) -> StudyOutcome:
    t0 = time.time()
    try:
        results = tuner.fit()
    except BaseException:
        finish_run(payload.tracking_uri, payload.parent_run_id, status="KILLED")
        raise
    errors = sum(1 for r in results if r.error is not None)
    finish_run(
        payload.tracking_uri,
        payload.parent_run_id,
        "FAILED" if errors == len(results) else "FINISHED",
    )
    from calibtune.study._tracking import log_metrics

    log_metrics(
        payload.tracking_uri,
        payload.parent_run_id,
        {
            "study/trials_finished": len(results) - errors,
            "study/trials_failed": errors,
            "study/wall_time_s": time.time() - t0,
        },
    )
    return StudyOutcome(
        study.name,
        sdir,
        payload.tracking_uri,
        payload.experiment_id,
        payload.parent_run_id,
        results,
    )


def resume_study(
    path_or_name: str | Path,
    *,
    address: str | None = None,
    storage: str | Path | None = None,
    verbose: int = 1,
) -> StudyOutcome:
    """``Tuner.restore`` a study from its storage directory (or its name under ``storage``),
    finishing unfinished and errored trials, logging to the same MLflow parent run."""
    from ray import tune

    sdir = Path(path_or_name)
    if not (sdir / "tuner.pkl").exists():
        sdir = Path(storage or default_storage()).expanduser().resolve() / str(path_or_name)
    state_file = sdir / STATE_FILE
    if not (sdir / "tuner.pkl").exists() or not state_file.is_file():
        raise FileNotFoundError(
            f"{path_or_name}: expected a study directory with tuner.pkl and {STATE_FILE} "
            f"(or a study name under {Path(storage or default_storage())}), found none"
        )
    state = json.loads(state_file.read_text())
    text = (sdir / "study.yaml").read_text()
    import yaml

    from calibtune.study._config import parse_study

    study = parse_study(yaml.safe_load(text), state["study_path"], text)
    init_ray(address)
    payload, parent = _payload_and_parent(study, sdir, state["tracking_uri"])
    tuner = tune.Tuner.restore(
        str(sdir),
        trainable=_trainable(study, payload),
        resume_unfinished=True,
        resume_errored=True,
    )
    return _fit(tuner, study, sdir, payload, parent)


def _check_files(study: StudyConfig) -> None:
    """Fail before any trial starts when the dataset's or an OOD set's files are missing."""
    from calibtune.trial import check_data_files

    check_data_files(study.base_config(), True)


def _check_cluster(study: StudyConfig) -> None:
    import ray

    from calibtune.trial import check_resources

    cfg = study.base_config()
    check_resources(cfg, ray.cluster_resources())
