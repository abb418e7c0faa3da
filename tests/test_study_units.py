"""Study pieces that need no Ray: seed aggregation, samplers, the Pareto front, metric names."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import optuna
import pytest
import yaml

from calibtune.metrics.keys import from_mlflow
from calibtune.readers._results import pareto_mask
from calibtune.record._optuna import FLAT_SAMPLERS, conditional_grid, define_by_run, make_sampler
from calibtune.record._tracking import mlflow_metric_name, resolve_tracking_uri
from calibtune.study import load_study
from calibtune.study._trainable import aggregate, hyperparameters, trial_dict
from calibtune.studyfile._config import SAMPLERS

ROOT = Path(__file__).resolve().parents[1]


def test_aggregate_mean_and_population_std_over_seeds():
    out = aggregate([{"val/ece": 0.1, "x": 1.0}, {"val/ece": 0.3, "x": 3.0}])
    assert out["val/ece"] == pytest.approx(0.2)
    assert out["val/ece_std"] == pytest.approx(0.1)  # sqrt(((0.1)^2 + (0.1)^2) / 2)
    assert aggregate([{"a": 2.0}]) == {"a": 2.0}  # one seed: no _std


def test_pareto_front_hand_example():
    # (ece, error) minimise both: B dominates D; A, B, C trade off; E has NaN
    v = np.array([[0.1, 0.5], [0.2, 0.2], [0.5, 0.1], [0.3, 0.3], [np.nan, 0.0]])
    assert pareto_mask(v, ["min", "min"]).tolist() == [True, True, True, False, False]
    # maximising the second objective: A has the lowest ECE and the highest error -> only A
    assert pareto_mask(v[:4], ["min", "max"]).tolist() == [True, False, False, False]


def _inside(value, dist) -> bool:
    if isinstance(dist, optuna.distributions.CategoricalDistribution):
        return value in dist.choices
    return dist.low <= value <= dist.high


def _unflat(params: dict) -> dict:
    """Optuna's ``a/b`` names nested as Ray's OptunaSearch hands them to the trainable."""
    out: dict = {}
    for name, value in params.items():
        *path, leaf = name.split("/")
        node = out
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_every_sampler_drives_the_conditional_space(tmp_path, sampler):
    raw = yaml.safe_load((ROOT / "studies" / "quickstart.yaml").read_text())
    raw["search"]["sampler"] = sampler
    if sampler == "grid":
        raw["losses"] = [
            "cross_entropy",
            {"name": "focal", "params": {"gamma": {"type": "categorical", "choices": [1.0, 2.0]}}},
        ]
        raw["search"]["num_samples"] = 3
    else:
        raw["losses"] = [
            {**item, "space": str(ROOT / "search_spaces" / Path(item["space"]).name)}
            if isinstance(item, dict) and "space" in item
            else item
            for item in raw["losses"]
        ]
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    study = load_study(path)
    space = define_by_run(study)
    ostudy = optuna.create_study(sampler=make_sampler(study))
    if sampler == "grid":
        points = conditional_grid(study)
        assert points == [
            {"loss": "cross_entropy"},
            {"loss": "focal", "focal/gamma": 1.0},
            {"loss": "focal", "focal/gamma": 2.0},
        ]
        for p in points:
            ostudy.enqueue_trial(p)
    seen = []
    # past TPE's and GP's 10 random start-up trials, so their model-based suggestions are checked
    for i in range(14 if sampler != "grid" else 3):
        t = ostudy.ask()
        space(t)
        seen.append(t.params)
        label = t.params["loss"]
        # exactly the sampled loss's parameters (every loss's for CMA-ES and GP, whose models
        # need a fixed space), each inside its declared distribution
        suggested = [c.label for c in study.losses] if sampler in FLAT_SAMPLERS else [label]
        dists = {
            f"{s}/{n}": d for s in suggested for n, d in study.loss(s).loss.space.dists.items()
        }
        assert set(t.params) == {"loss", *dists}, t.params
        assert all(_inside(t.params[k], d) for k, d in dists.items()), t.params
        # the trial (and its MLflow run) takes its own loss's parameters only
        own = {k: v for k, v in t.params.items() if k == "loss" or k.startswith(f"{label}/")}
        hp = hyperparameters(study, _unflat(t.params))
        assert hp == hyperparameters(study, _unflat(own)), (hp, t.params)
        assert trial_dict(study, _unflat(t.params), 1, "t") == trial_dict(
            study, _unflat(own), 1, "t"
        )
        assert all(hp[f"loss.{k[len(label) + 1 :]}"] == v for k, v in own.items() if k != "loss")
        ostudy.tell(t, float(i % 3))
    if sampler == "grid":
        assert seen == conditional_grid(study)
    else:
        assert len({p["loss"] for p in seen}) >= 2  # the loss itself is searched


# Do the model-based samplers use their model? A cheap objective with a planted optimum over a
# loss with two continuous parameters (fcl: gamma on [1, 5], lam on [0.1, 3] log), measured in the
# unit square of the sampler's own coordinates. Uniform points lie ≈0.45 from the optimum on
# average; a sampler that models the objective puts its last suggestions much closer.
FCL = {
    "name": "fcl",
    "params": {
        "gamma": {"type": "float", "low": 1.0, "high": 5.0},
        "lam": {"type": "float", "low": 0.1, "high": 3.0, "log": True},
    },
}


def _unit(params: dict) -> np.ndarray:
    return np.array(
        [(params["fcl/gamma"] - 1.0) / 4.0, math.log(params["fcl/lam"] / 0.1) / math.log(30.0)]
    )


OPTIMUM = _unit({"fcl/gamma": 4.0, "fcl/lam": 1.5})


def _drive(tmp_path: Path, sampler: str, losses: list, n_trials: int) -> list[float | None]:
    """Ask the study's own sampler ``n_trials`` times over its define-by-run space, telling the
    squared distance to OPTIMUM (other losses: 2, worse than any fcl point); returns each
    trial's distance (None for another loss)."""
    raw = yaml.safe_load((ROOT / "studies" / "quickstart.yaml").read_text())
    raw["search"].update(sampler=sampler, sampler_seed=0)
    raw["losses"] = losses
    path = tmp_path / f"{sampler}.yaml"
    path.write_text(yaml.safe_dump(raw))
    study = load_study(path)
    space = define_by_run(study)
    ostudy = optuna.create_study(sampler=make_sampler(study))
    out: list[float | None] = []
    for _ in range(n_trials):
        t = ostudy.ask()
        space(t)
        if t.params["loss"] != "fcl":
            out.append(None)
            ostudy.tell(t, 2.0)
            continue
        out.append(float(np.linalg.norm(_unit(t.params) - OPTIMUM)))
        ostudy.tell(t, out[-1] ** 2)
    return out


# (sampler, trials, the last k scored, bound on their mean distance; None: the random control,
# which must stay above 0.3): TPE and GP start with 10 random trials, CMA-ES with 1 plus
# generations of 6, NSGA-II with a random population of 50 and evolves slowly; GP fits a Gaussian
# process per suggestion (≈1 s each on this machine)
@pytest.mark.parametrize(
    ("sampler", "n_trials", "last", "bound"),
    [
        ("tpe", 30, 10, 0.3),
        ("cmaes", 30, 10, 0.3),
        ("gp", 14, 4, 0.3),
        ("nsga2", 200, 20, 0.4),
        ("random", 30, 10, None),
    ],
)
def test_model_based_samplers_concentrate_near_a_planted_optimum(
    tmp_path, sampler, n_trials, last, bound
):
    distances = _drive(tmp_path, sampler, [FCL], n_trials)
    late = float(np.mean(distances[-last:]))
    if bound is not None:
        assert late < bound, f"{sampler} did not leave random search: mean distance {late:.3f}"
    else:  # the control: the same measure on random search stays far
        assert late > 0.3


def _conditional(tmp_path: Path, sampler: str, n_trials: int, last: int) -> tuple[float, float]:
    """Share of fcl among the last suggestions and their mean distance to OPTIMUM, in a
    two-loss study where cross-entropy scores worse than any fcl point."""
    tail = _drive(tmp_path, sampler, ["cross_entropy", FCL], n_trials)[-last:]
    fcl = [d for d in tail if d is not None]
    return len(fcl) / last, float(np.mean(fcl)) if fcl else math.inf


def test_tpe_learns_the_loss_and_its_parameters_in_a_conditional_space(tmp_path):
    share, late = _conditional(tmp_path, "tpe", 50, 10)
    assert share >= 0.7 and late < 0.3, (share, late)
    share, late = _conditional(tmp_path, "random", 50, 10)  # the control
    assert share < 0.7 and late > 0.3, (share, late)


@pytest.mark.parametrize(("sampler", "n_trials"), [("cmaes", 50), ("gp", 20)])
def test_cmaes_and_gp_learn_loss_parameters_in_a_conditional_space(tmp_path, sampler, n_trials):
    share, late = _conditional(tmp_path, sampler, n_trials, 10)
    assert share >= 0.7 and late < 0.3, (share, late)


def test_metric_names_round_trip_through_mlflow():
    for name in ("test/ece@ts", "val/ece@focal_ts", "ood/svhn/auroc_msp@ts", "test/ece@ts_std"):
        mapped = mlflow_metric_name(name)
        assert "@" not in mapped
        assert from_mlflow(mapped) == name
    for name in ("test/ece", "posthoc/ts/T", "adaptive/gammas/bin_03", "val/ece_std"):
        assert from_mlflow(mlflow_metric_name(name)) == name


def test_tracking_uri_is_made_absolute(tmp_path):
    assert resolve_tracking_uri(None, tmp_path) == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert resolve_tracking_uri("sqlite:///x.db", tmp_path) == f"sqlite:///{tmp_path / 'x.db'}"
    assert resolve_tracking_uri("http://127.0.0.1:5000", tmp_path) == "http://127.0.0.1:5000"
