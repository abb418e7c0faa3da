"""The study file: a frozen, validated description of one hyperparameter study.

A study is a base trial config (the ``calibtune train`` format, see docs/trial.md) without a loss,
the losses to compare (each with a search space), optional searched trial-config keys, search
settings and tracking. Every error names the file, the key path and what was expected, e.g.
``studies/x.yaml: search.num_samples: expected an integer >= 1, got 'ten'``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import re
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optuna.distributions import CategoricalDistribution

from calibtune._names import check_experiment, check_name
from calibtune._validate import (
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_keys,
    check_mapping,
)
from calibtune._yaml import YamlError, cut, excerpt, load_text, read_text
from calibtune.metrics import keys as K
from calibtune.studyfile._constraints import Constraint, parse_constraints
from calibtune.studyfile._spaces import (
    LossSpace,
    Space,
    SpaceError,
    build_distribution,
    extremes,
    load_yaml,
    parse_loss_space,
)


def _engine() -> types.SimpleNamespace:
    """The trial engine and the loss and post-hoc registries (``.trial``, ``.losses``,
    ``.posthoc``), for the checks that build a trial config from the study."""
    # deferred: they import torch, and compare/report/export read a study's head without it
    from calibtune import losses, posthoc, trial

    return types.SimpleNamespace(trial=trial, losses=losses, posthoc=posthoc)


SAMPLERS = ("tpe", "random", "grid", "cmaes", "nsga2", "gp")
SCHEDULERS = ("none", "asha")
MODES = ("min", "max")
STUDY_KEYS = ("name", "description", "trial", "losses", "space", "search", "tracking", "storage")
SEARCH_KEYS = (
    "sampler",
    "sampler_seed",
    "num_samples",
    "max_concurrent",
    "objectives",
    "scheduler",
    "grace_period",
    "seeds",
    "max_failures",
    "reuse_actors",
    "optuna_storage",
    "constraints",
    "time_budget",
)
#: samplers that read Optuna's trial constraints (random, grid and CMA-ES ignore them)
CONSTRAINED_SAMPLERS = ("tpe", "nsga2", "gp")
TRACKING_KEYS = ("uri", "experiment")
LOSS_KEYS = ("name", "label", "space", "params", "reduction", "compile", "epochs")


class StudyError(ValueError):
    """A malformed study; the message is one line: ``file: key.path: expected X, got Y``."""


@dataclass(frozen=True)
class Objective:
    metric: str
    mode: str = "min"


@dataclass(frozen=True)
class LossChoice:
    """One arm of the study: a registered loss with its search space (``label`` is unique),
    the trial's ``loss.reduction`` for it (``sum`` to train the arm as its authors' code did),
    its ``loss.compile`` (``auto``: through ``torch.compile`` on CUDA only) and its
    ``train.epochs`` where the authors trained this arm longer or shorter (``None``: the trial's;
    e.g. Mukhoti et al.'s Wide-ResNet Brier arm, 550 epochs)."""

    label: str
    loss: LossSpace
    reduction: str = "mean"
    compile: str = "auto"
    epochs: int | None = None


@dataclass(frozen=True)
class SearchConfig:
    sampler: str = "tpe"
    sampler_seed: int = 0
    num_samples: int = 8
    max_concurrent: int | str = "auto"  # auto: what the cluster holds (cluster/_concurrency.py)
    objectives: tuple[Objective, ...] = (Objective("val/ece@ts", "min"),)
    scheduler: str = "none"
    grace_period: int = 1
    seeds: tuple[int, ...] = (1,)
    max_failures: int = 3  # retries of a lost process or node; a trial's own error: none
    reuse_actors: bool = True  # a Tune trial process trains trial after trial (imports paid once)
    optuna_storage: str | None = None  # SQLAlchemy URL; None: sqlite <study folder>/optuna.db
    constraints: tuple[Constraint, ...] = ()  # feasible trials meet all (studyfile/_constraints.py)
    time_budget: float | None = None  # seconds per run/resume; None: no limit (study/_budget.py)


@dataclass(frozen=True)
class TrackingConfig:
    """``uri=None``: a local SQLite store ``sqlite:///<cwd>/mlflow.db``."""

    uri: str | None = None
    experiment: str | None = None


@dataclass(frozen=True)
class StudyConfig:
    name: str
    path: str | None
    text: str
    trial: Mapping[str, Any]
    losses: tuple[LossChoice, ...]
    space: Space
    search: SearchConfig = field(default_factory=SearchConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    storage: str | None = None
    description: str = ""

    @property
    def file_hash(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:16]

    @property
    def experiment(self) -> str:
        return self.tracking.experiment or f"calibtune/{self.name}"

    def base_config(self) -> Any:
        """The validated base trial config (`calibtune.trial.TrialConfig`, placeholder loss):
        what every trial shares — data, model, schedule, evaluation, scaling."""
        return _engine().trial.config_from_dict({**self.trial, "loss": {"name": "cross_entropy"}})

    def scaling_configs(self) -> list[tuple[str, Any]]:
        """The base trial config at every corner of the searched ``scaling.*`` keys (each
        choice of a categorical, both ends of a range), as ``(which corner, config)``: the
        most a trial of this study may ask of Ray (``("", base_config())`` when none is
        searched). Used to refuse, before a trial starts, a study some trial cannot run in."""
        engine = _engine().trial
        apply_overrides, config_from_dict = engine.apply_overrides, engine.config_from_dict
        keys = sorted(k for k in self.space.dists if k.startswith("scaling."))
        base = {**self.trial, "loss": {"name": "cross_entropy"}}
        out = []
        for combo in itertools.product(*(extremes(self.space.dists[k]) for k in keys)):
            sets = [f"{k}={json.dumps(v)}" for k, v in zip(keys, combo, strict=True)]
            label = f"space {', '.join(sets)}" if sets else ""
            out.append((label, config_from_dict(apply_overrides(base, sets))))
        return out

    def loss(self, label: str) -> LossChoice:
        for c in self.losses:
            if c.label == label:
                return c
        raise KeyError(label)


# ------------------------------------------------------------------------------- parsing


def _mapping(v: Any, path: str, keys: Sequence[str] | None = None) -> Mapping[str, Any]:
    """A mapping (``None``: empty) whose keys, if ``keys`` is given, are among them."""
    d = check_mapping(v, path)
    if keys is not None:
        check_keys(d, keys, path)
    return d


def _objectives(raw: Any) -> tuple[Objective, ...]:
    path = "search.objectives"
    if raw is None:
        return SearchConfig().objectives
    if isinstance(raw, (str, Mapping)):
        raw = [raw]
    if not isinstance(raw, Sequence) or not raw:
        raise StudyError(
            f"{path}: expected a non-empty list of {{metric, mode}}, got {excerpt(raw)}"
        )
    out = []
    for i, item in enumerate(raw):
        where = f"{path}[{i}]"
        if isinstance(item, str):
            item = {"metric": item}
        item = _mapping(item, where, ("metric", "mode"))
        metric = item.get("metric")
        if not isinstance(metric, str) or not metric:
            raise StudyError(
                f"{where}.metric: expected a metric name such as val/ece, got {excerpt(metric)}"
            )
        if _split(metric) is not None and (why := K.selection_refusal(metric)):
            raise StudyError(f"{where}.metric: {why}, got {excerpt(metric)}")
        mode = item.get("mode", "min")
        if mode not in MODES:
            raise StudyError(f"{where}.mode: expected 'min' or 'max', got {excerpt(mode)}")
        out.append(Objective(metric, mode))
    if len({o.metric for o in out}) != len(out):
        raise StudyError(
            f"{path}: expected distinct metrics, got {excerpt([o.metric for o in out])}"
        )
    return tuple(out)


def _split(metric: str) -> str | None:
    try:
        return K.parse(metric).split
    except ValueError:
        return None  # not a key at all: answered by _check_reported


def _check_reported(objectives: Sequence[Any], base: Any, path: str = "objectives") -> None:
    """Every objective (or constraint) must be a key the trials report. A trial reports what
    its config's `TrialConfig.metric_keys` says, with each objective's and constraint's post-hoc
    method added to ``eval.epoch_posthoc`` (``trial_dict`` does that), so any registered method
    counts.
    ``base`` is the validated base trial config (`_base_trial`)."""
    every = dataclasses.replace(
        base.eval,
        epoch_posthoc=tuple(_engine().posthoc.list_posthoc()),
        epoch_shift=True,
        epoch_selective=True,
    )
    cfg = base.replace(eval=every)
    reported = cfg.metric_keys(posthoc_params=False)
    for i, o in enumerate(objectives):
        if o.metric not in reported:
            examples = [
                k for k in ("val/ece", "val/ece@ts", "val/error", "train/loss") if k in reported
            ]
            raise StudyError(
                f"search.{path}[{i}].metric: expected a metric the trials report "
                f"(e.g. {', '.join(examples)}, …), got {excerpt(o.metric)}"
            )


def _search(raw: Any, labels: Sequence[str]) -> SearchConfig:
    d = _mapping(raw, "search", SEARCH_KEYS)
    s = SearchConfig()
    sampler = d.get("sampler", s.sampler)
    if sampler not in SAMPLERS:
        raise StudyError(
            f"search.sampler: expected one of {', '.join(SAMPLERS)}, got {excerpt(sampler)}"
        )
    scheduler = d.get("scheduler", s.scheduler)
    scheduler = "none" if scheduler is None else scheduler
    if scheduler not in SCHEDULERS:
        raise StudyError(f"search.scheduler: expected 'none' or 'asha', got {excerpt(scheduler)}")
    objectives = _objectives(d.get("objectives"))
    if scheduler == "asha" and len(objectives) > 1:
        raise StudyError(
            "search.scheduler: expected 'none' for a multi-objective study (ASHA stops trials on "
            f"one metric), got 'asha' with {len(objectives)} objectives"
        )
    if sampler == "nsga2" and len(objectives) < 2:
        pass  # NSGA-II also works single-objective
    seeds = d.get("seeds", list(s.seeds))
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        seeds = [seeds]
    if not isinstance(seeds, Sequence) or isinstance(seeds, str) or not seeds:
        raise StudyError(
            f"search.seeds: expected a non-empty list of integers, got {excerpt(seeds)}"
        )
    seeds = tuple(check_int(x, f"search.seeds[{i}]", 0) for i, x in enumerate(seeds))
    constraints = parse_constraints(d.get("constraints"), labels, StudyError)
    if constraints and sampler not in CONSTRAINED_SAMPLERS:
        raise StudyError(
            f"search.sampler: expected {', '.join(CONSTRAINED_SAMPLERS)} for a study with "
            f"search.constraints (the samplers that take them), got {excerpt(sampler)}"
        )
    if len(set(seeds)) != len(seeds):
        raise StudyError(f"search.seeds: expected distinct seeds, got {list(seeds)}")
    return SearchConfig(
        sampler=sampler,
        sampler_seed=check_int(d.get("sampler_seed", s.sampler_seed), "search.sampler_seed", 0),
        num_samples=check_int(d.get("num_samples", s.num_samples), "search.num_samples", 1),
        max_concurrent=_max_concurrent(d.get("max_concurrent", s.max_concurrent)),
        objectives=objectives,
        scheduler=scheduler,
        grace_period=check_int(d.get("grace_period", s.grace_period), "search.grace_period", 1),
        seeds=seeds,
        max_failures=check_int(d.get("max_failures", s.max_failures), "search.max_failures", 0),
        reuse_actors=check_bool(d.get("reuse_actors", s.reuse_actors), "search.reuse_actors"),
        optuna_storage=_optuna_storage(d.get("optuna_storage")),
        constraints=constraints,
        time_budget=_time_budget(d.get("time_budget")),
    )


def _max_concurrent(v: Any) -> int | str:
    """``auto`` (as many trials as the cluster holds, `calibtune.cluster._concurrency`) or a cap
    >= 1."""
    if v == "auto":
        return "auto"
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise StudyError(
            f"search.max_concurrent: expected auto or an integer >= 1, got {excerpt(v)}"
        )
    return v


def _time_budget(v: Any) -> float | None:
    return None if v is None else check_float(v, "search.time_budget", 0.0, low_open=True)


#: SQLAlchemy URL: ``dialect[+driver]://...`` (sqlite:///path, postgresql://user@host/db)
_SQLALCHEMY_URL = re.compile(r"[a-z][a-z0-9]*(\+[a-z0-9_]+)?://\S*")


def _optuna_storage(v: Any) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str) or _SQLALCHEMY_URL.fullmatch(v) is None or len(v) > 2000:
        raise StudyError(
            "search.optuna_storage: expected a SQLAlchemy URL (sqlite:///path.db, "
            f"postgresql://user@host/db) or null, got {excerpt(v)}"
        )
    return v


def _tracking(raw: Any) -> TrackingConfig:
    d = _mapping(raw, "tracking", TRACKING_KEYS)
    uri, exp = d.get("uri"), d.get("experiment")
    if uri is not None and (not isinstance(uri, str) or not uri):
        raise StudyError(
            f"tracking.uri: expected a tracking URI string or null, got {excerpt(uri)}"
        )
    if exp is not None:
        check_experiment(exp, "tracking.experiment")
    return TrackingConfig(uri, exp)


def _losses(raw: Any, base_dir: Path) -> tuple[LossChoice, ...]:
    if not isinstance(raw, Sequence) or isinstance(raw, str) or not raw:
        raise StudyError(f"losses: expected a non-empty list of losses, got {excerpt(raw)}")
    out: list[LossChoice] = []
    for i, item in enumerate(raw):
        where = f"losses[{i}]"
        if isinstance(item, str):
            item = {"name": item}
        item = _mapping(item, where, LOSS_KEYS)
        space_ref = item.get("space")
        if space_ref is not None and "params" in item:
            raise StudyError(
                f"{where}: expected either space (a file) or params (inline), got both"
            )
        try:
            if isinstance(space_ref, str):
                path = (base_dir / space_ref).resolve()
                ls = parse_loss_space(load_yaml(path), f"{where}.space ({space_ref})", str(path))
                if "name" in item and item["name"] != ls.loss:
                    raise StudyError(
                        f"{where}.name: expected {excerpt(ls.loss)} (the loss of {space_ref}), "
                        f"got {excerpt(item['name'])}"
                    )
            elif space_ref is None:
                ls = parse_loss_space(
                    {"loss": item.get("name"), "params": item.get("params")}, where
                )
            else:
                raise StudyError(
                    f"{where}.space: expected a path to a search_spaces/*.yaml file, "
                    f"got {excerpt(space_ref)}"
                )
        except SpaceError as exc:
            raise StudyError(str(exc)) from None
        label = check_name(item.get("label", ls.loss), f"{where}.label")
        if any(c.label == label for c in out):
            raise StudyError(
                f"{where}: expected distinct losses (set label: to compare two spaces of one "
                f"loss), got {excerpt(label)} twice"
            )
        out.append(LossChoice(label, ls, *_arm_options(item, where)))
    return tuple(out)


def _arm_options(item: Mapping[str, Any], where: str) -> tuple[str, str, int | None]:
    """An arm's ``reduction``, ``compile`` and ``epochs``, checked as the trial's
    ``loss.reduction``, ``loss.compile`` and ``train.epochs`` are (`_check_arm_epochs` checks
    the epochs against the rest of the trial)."""
    engine = _engine()
    compile_mode, LOSS_REDUCTIONS = engine.losses.compile_mode, engine.trial.LOSS_REDUCTIONS
    try:
        reduction = check_choice(
            item.get("reduction", "mean"), f"{where}.reduction", LOSS_REDUCTIONS
        )
        mode = compile_mode(item.get("compile", "auto"), f"{where}.compile")
        e = item.get("epochs")
        epochs = None if e is None else check_int(e, f"{where}.epochs", 1)
        return reduction, mode, epochs
    except ValueError as exc:
        raise StudyError(str(exc)) from None


def _check_arm_epochs(
    losses: Sequence[LossChoice], trial: Mapping[str, Any], search: SearchConfig
) -> None:
    """An arm's own ``epochs`` must make a valid trial (schedule milestones, warm-up), and a
    scheduler that stops trials at ``train.epochs`` (ASHA's ``max_t``) cannot serve it."""
    config_from_dict = _engine().trial.config_from_dict

    for i, c in enumerate(losses):
        if c.epochs is None:
            continue
        if search.scheduler != "none":
            raise StudyError(
                f"losses[{i}].epochs: expected no per-arm epochs with search.scheduler "
                f"{search.scheduler!r} (it stops every trial at train.epochs), got {c.epochs}"
            )
        train = {**dict(trial.get("train") or {}), "epochs": c.epochs}
        try:
            config_from_dict({**trial, "train": train, "loss": {"name": "cross_entropy"}})
        except ValueError as exc:
            raise StudyError(f"losses[{i}].epochs: {c.epochs} makes trial.{exc}") from None


def _trial_space(raw: Any, base_trial: Mapping[str, Any]) -> Space:
    """Searched trial-config keys (``optimizer.lr``, ``eval.n_bins``...), checked by building
    a trial config at both ends of each range."""
    engine = _engine().trial
    apply_overrides, config_from_dict = engine.apply_overrides, engine.config_from_dict

    d = _mapping(raw, "space")
    dists = {}
    for key, spec in d.items():
        where = f"space.{key}"
        if not isinstance(key, str) or key.split(".")[0] in ("loss", "name", "seed"):
            raise StudyError(
                f"{where}: expected a trial-config key other than loss/name/seed (loss "
                "hyperparameters belong in losses[].space), got it"
            )
        if not isinstance(spec, Mapping):
            raise StudyError(f"{where}: expected a distribution {{type, ...}}, got {excerpt(spec)}")
        try:
            dist = build_distribution(spec, where)
        except SpaceError as exc:
            raise StudyError(str(exc)) from None
        for v in extremes(dist):
            try:
                config_from_dict(apply_overrides(base_trial, [f"{key}={json.dumps(v)}"]))
            except ValueError as exc:
                raise StudyError(
                    f"{where}: value {excerpt(v)} is not valid here ({cut(str(exc), 200)})"
                ) from None
        dists[key] = dist
    return Space(dists, {})


def _grid_size(losses: Sequence[LossChoice], space: Space) -> int:
    """Points of the conditional grid: per loss, the product of its categorical choices."""
    size = 0
    for c in losses:
        n = 1
        for pname, dist in {**c.loss.space.dists, **space.dists}.items():
            if not isinstance(dist, CategoricalDistribution):
                raise StudyError(
                    "search.sampler: expected categorical distributions only for 'grid', "
                    f"got {type(dist).__name__} for {c.label}.{pname}"
                )
            n *= len(dist.choices)
        size += n
    return size


def _base_trial(raw: Any) -> tuple[dict[str, Any], Any]:
    """The shared trial section and the `TrialConfig` it validates to (placeholder loss):
    validated once here, reused by the checks that need it."""
    config_from_dict = _engine().trial.config_from_dict

    trial = dict(_mapping(raw, "trial"))
    if "loss" in trial:
        raise StudyError("trial.loss: unknown key; the losses to compare go under losses:")
    if "seed" in trial:
        raise StudyError("trial.seed: unknown key; seeds go under search.seeds")
    try:
        cfg = config_from_dict({**trial, "loss": {"name": "cross_entropy"}})
    except ValueError as exc:
        raise StudyError(f"trial.{exc}") from None
    return trial, cfg


def parse_study(raw: Any, path: str | None = None, text: str = "") -> StudyConfig:
    """Validate a study mapping; errors are prefixed with ``path``."""
    prefix = f"{path}: " if path else ""
    base_dir = Path(path).resolve().parent if path else Path.cwd()
    try:
        d = _mapping(raw, "study", STUDY_KEYS)
        name = check_name(d.get("name"), "name")
        trial, base = _base_trial(d.get("trial"))
        losses = _losses(d.get("losses"), base_dir)
        search = _search(d.get("search"), [c.label for c in losses])
        _check_arm_epochs(losses, trial, search)
        _check_reported(search.objectives, base)
        _check_reported(search.constraints, base, "constraints")
        space = _trial_space(d.get("space"), {**trial, "loss": {"name": "cross_entropy"}})
        if search.sampler == "grid" and search.num_samples != (size := _grid_size(losses, space)):
            raise StudyError(
                f"search.num_samples: expected {size} (the size of the grid) for sampler "
                f"'grid', got {search.num_samples}"
            )
        storage = d.get("storage")
        if storage is not None and (not isinstance(storage, str) or not storage):
            raise StudyError(f"storage: expected a directory path or null, got {excerpt(storage)}")
        desc = d.get("description", "")
        if not isinstance(desc, str):
            raise StudyError(f"description: expected a string, got {excerpt(desc)}")
        return StudyConfig(
            name=name,
            path=path,
            text=text,
            trial=trial,
            losses=losses,
            space=space,
            search=search,
            tracking=_tracking(d.get("tracking")),
            storage=storage,
            description=desc,
        )
    except ValueError as exc:  # StudyError, and the shared trial-config validators' errors
        raise StudyError(prefix + " ".join(str(exc).split())) from None


def load_study(path: str | Path) -> StudyConfig:
    """Read and validate a study YAML file (read through `calibtune._yaml.load_file`: at most
    1 MiB of UTF-8 text, no aliases, no duplicate keys)."""
    p = Path(path)
    if not p.exists():
        raise StudyError(f"{p}: expected a study YAML file, found nothing at that path")
    try:
        text = read_text(p, "study file")
        raw = load_text(text, str(p))
    except YamlError as exc:
        raise StudyError(str(exc)) from None
    if raw is None:
        raise StudyError(
            f"{p}: expected a study mapping (name, trial, losses, ...), got an empty file"
        )
    return parse_study(raw, str(path), text)


def head_from_text(
    text: str, label: str
) -> tuple[str, tuple[Objective, ...], tuple[Constraint, ...]]:
    """Only the ``name``, ``search.objectives`` and ``search.constraints`` of a study given as
    YAML text: reading a finished study's results needs no more, and validating its trial
    section would import every registry (torch)."""
    try:
        raw = _mapping(load_text(text, label), "study")
        name = check_name(raw.get("name"), "name")
        search = _mapping(raw.get("search"), "search")
        rules = search.get("constraints")
        # a saved copy was fully validated when its study started: its baselines are its losses
        baselines = [r.get("baseline") for r in rules or () if isinstance(r, Mapping)]
        constraints = parse_constraints(rules, [b for b in baselines if b], StudyError)
        return name, _objectives(search.get("objectives")), constraints
    except (YamlError, ValueError) as exc:
        raise StudyError(f"{label}: {exc}") from None


def study_from_text(text: str, label: str) -> StudyConfig:
    """Validate a study given as YAML text (a submitted job's self-contained copy)."""
    try:
        raw = load_text(text, label)
    except YamlError as exc:
        raise StudyError(str(exc)) from None
    try:
        return parse_study(raw, None, text)
    except StudyError as exc:
        raise StudyError(f"{label}: {exc}") from None
