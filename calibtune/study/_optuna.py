"""The Optuna side of a study: the define-by-run space, the conditional grid, the sampler.

The space is define-by-run: the loss label is sampled first, then only that loss's
hyperparameters (named ``<label>/<param>``), then any searched trial-config keys
(``trial/<key.path>``), so trials never carry another loss's parameters.
"""

from __future__ import annotations

import itertools
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from calibtune.study._config import StudyConfig

__all__ = ["DefineByRun", "conditional_grid", "define_by_run", "make_sampler"]


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
    if s.sampler in ("random", "grid"):  # grid: the points themselves are enqueued
        return optuna.samplers.RandomSampler(seed=seed)
    if s.sampler == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    if s.sampler == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if s.sampler == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    raise AssertionError(s.sampler)
