"""Uncertainty on every number (issue 14): AURC/AUGRC on hand-derived cases and against a plain
loop, refinement NLL, bootstrap CIs (deterministic case, equality with a loop over the same
resample indices, coverage), the CI keys, and what a trial reports and saves."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from calibtune import metrics as M
from calibtune.metrics import keys as K
from calibtune.posthoc import refinement_nll

# ----------------------------------------------------------------------------- selective


def _probs(conf: list[float], correct: list[bool]) -> tuple[torch.Tensor, torch.Tensor]:
    """Two-class probabilities with top-label confidence ``conf`` (≥ 0.5) and labels making the
    prediction (class 0) correct or not."""
    c = torch.tensor(conf, dtype=torch.float64)
    return torch.stack([c, 1 - c], 1), torch.tensor([0 if ok else 1 for ok in correct])


def _loop_curve(conf: np.ndarray, correct: np.ndarray) -> tuple[float, float]:
    """Plain reference: average E_k/k and E_k/N over every ordering of the tied samples
    (brute force over permutations within tie groups is the definition of the tie rule)."""
    import itertools

    n = len(conf)
    groups = [np.flatnonzero(conf == v) for v in sorted(set(conf), reverse=True)]
    perms = [list(itertools.permutations(g)) for g in groups]
    aurcs, augrcs = [], []
    for choice in itertools.product(*perms):
        order = [i for g in choice for i in g]
        errs, a, g_ = 0, 0.0, 0.0
        for k, i in enumerate(order, start=1):
            errs += not correct[i]
            a += errs / k / n
            g_ += errs / n / n
        aurcs.append(a)
        augrcs.append(g_)
    return float(np.mean(aurcs)), float(np.mean(augrcs))


def test_aurc_augrc_of_a_hand_derived_case() -> None:
    # sorted by confidence: ok, wrong, ok, wrong -> E_k = 0, 1, 1, 2
    # AURC = (0/1 + 1/2 + 1/3 + 2/4) / 4 = (4/3) / 4 = 1/3; AUGRC = (0 + 1 + 1 + 2) / 16 = 1/4
    p, y = _probs([0.9, 0.8, 0.7, 0.6], [True, False, True, False])
    assert M.aurc(p, y) == pytest.approx(1 / 3, abs=1e-15)
    assert M.augrc(p, y) == pytest.approx(1 / 4, abs=1e-15)
    # the input order does not matter
    perm = torch.tensor([2, 0, 3, 1])
    assert M.selective_report(p[perm], y[perm]) == M.selective_report(p, y)


def test_ties_take_the_expectation_over_orderings() -> None:
    # two samples tied at 0.9 (one wrong), then a correct one: E_1 = 1/2, E_2 = 1, E_3 = 1
    # AURC = (1/2 + 1/2 + 1/3) / 3 = 4/9; AUGRC = (1/2 + 1 + 1) / 9 = 5/18
    p, y = _probs([0.9, 0.9, 0.5], [True, False, True])
    assert M.aurc(p, y) == pytest.approx(4 / 9, abs=1e-15)
    assert M.augrc(p, y) == pytest.approx(5 / 18, abs=1e-15)


def test_perfect_ranking_gives_the_optimal_augrc() -> None:
    # m = 3 errors ranked last among N = 10: AUGRC = m(m+1)/(2N²) = 12/200
    p, y = _probs([0.99 - 0.01 * i for i in range(10)], [True] * 7 + [False] * 3)
    assert M.augrc(p, y) == pytest.approx(12 / 200, abs=1e-15)
    curve = M.risk_coverage(p, y)
    assert curve["coverage"][-1] == 1.0 and curve["risk"][-1] == pytest.approx(0.3)


def test_selective_metrics_equal_the_plain_loop_with_ties() -> None:
    g = torch.Generator().manual_seed(3)
    for _ in range(5):
        conf = (torch.randint(5, 10, (7,), generator=g) / 10).tolist()  # many ties
        correct = (torch.rand(7, generator=g) < 0.6).tolist()
        p, y = _probs(conf, correct)
        a, gr = _loop_curve(np.asarray(conf), np.asarray(correct))
        assert M.aurc(p, y) == pytest.approx(a, abs=1e-12)
        assert M.augrc(p, y) == pytest.approx(gr, abs=1e-12)


def test_refinement_nll_is_the_nll_after_nll_optimal_temperature() -> None:
    g = torch.Generator().manual_seed(0)
    z = torch.randn(400, 5, generator=g, dtype=torch.float64)
    y = torch.distributions.Categorical(logits=z).sample()  # calibrated at T = 1 ...
    hot = 3 * z  # ... so these logits are over-confident by T = 3
    ref = refinement_nll(hot, y)
    assert ref <= M.nll(torch.softmax(hot, 1), y)
    grid = [M.nll(torch.softmax(hot / t, 1), y) for t in np.linspace(2, 4.5, 251)]
    assert ref == pytest.approx(min(grid), abs=1e-6)
    assert refinement_nll(hot, y) == pytest.approx(refinement_nll(z, y), abs=1e-8)


# ----------------------------------------------------------------------------- bootstrap


def _problem(n: int = 300, k: int = 7, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    z = 2 * torch.randn(n, k, generator=g)
    y = torch.randint(0, k, (n,), generator=g)
    z[torch.arange(n)[: n // 2], y[: n // 2]] += 3
    return z, y


@pytest.mark.parametrize("given", ["logits", "probs", "tied_probs"])
def test_bootstrap_equals_a_plain_loop_over_the_same_indices(given: str) -> None:
    z, y = _problem()
    if given == "tied_probs":  # coarse logits: many tied confidences across equal-mass groups
        z = torch.round(z)
    idx = M.bootstrap_indices(len(y), 6, seed=4)
    arg = {"logits": z} if given == "logits" else {"probs": torch.softmax(z.double(), 1)}
    values = M.bootstrap_values(**arg, labels=y, indices=idx)
    assert set(values) == set(M.REPORT_KEYS)
    for b in range(idx.shape[0]):
        one = {k: v[idx[b]] for k, v in arg.items()}
        ref = M.calibration_report(**one, labels=y[idx[b]])
        for m in M.REPORT_KEYS:
            assert float(values[m][b]) == pytest.approx(ref[m], rel=1e-10, abs=1e-12), (m, b)


def test_bootstrap_top_label_equals_a_loop_when_the_sweep_runs_many_chunks() -> None:
    # calibrated labels: the monotone sweep goes on past its first chunk of bin counts for
    # some resamples (here one of six: the resamples still monotone are revisited alone)
    g = torch.Generator().manual_seed(1)
    n = 3000
    conf = 0.5 + 0.5 * torch.rand(n, generator=g, dtype=torch.float64)
    correct = torch.rand(n, generator=g, dtype=torch.float64) < conf
    p = torch.stack([conf, 1 - conf], 1)
    y = torch.where(correct, 0, 1)
    idx = M.bootstrap_indices(n, 6, seed=3)
    idx[0] = idx[0].clamp_max(n // 2)  # samples never drawn, and many copies of one
    values = M.bootstrap_top_label(conf, correct, idx, 15)
    for b in range(idx.shape[0]):
        ref = M.calibration_report(probs=p[idx[b]], labels=y[idx[b]])
        for m, v in values.items():
            assert float(v[b]) == pytest.approx(ref[m], rel=1e-10, abs=1e-12), (m, b)


def test_bootstrap_ci_of_a_deterministic_case_is_a_point() -> None:
    # every sample has confidence 0.8 and is correct: every resample has ECE 0.2, error 0, …
    p = torch.tensor([[0.8, 0.2]] * 50, dtype=torch.float64)
    y = torch.zeros(50, dtype=torch.long)
    ci = M.bootstrap_report(probs=p, labels=y, n_resamples=30, seed=1)
    assert ci["ece"] == pytest.approx((0.2, 0.2), abs=1e-12)
    assert ci["error"] == (0.0, 0.0)
    assert ci["nll"] == pytest.approx((-np.log(0.8),) * 2, abs=1e-12)
    assert M.bootstrap_report(probs=p, labels=y, n_resamples=30, seed=1) == ci  # seeded


def test_bootstrap_error_ci_covers_the_true_error_about_95_percent() -> None:
    # error of a model that is right with probability 0.7 on fresh samples: true error 0.3
    n, trials, hits = 200, 60, 0
    g = torch.Generator().manual_seed(11)
    for t in range(trials):
        correct = torch.rand(n, generator=g) < 0.7
        p, y = _probs([0.75] * n, correct.tolist())
        lo, hi = M.bootstrap_report(probs=p, labels=y, n_resamples=300, seed=t, metrics=["error"])[
            "error"
        ]
        hits += lo <= 0.3 <= hi
    assert 0.85 <= hits / trials <= 1.0  # 95% nominal; binomial spread over 60 trials


def test_bootstrap_rejects_bad_arguments() -> None:
    p, y = _probs([0.9, 0.8], [True, False])
    with pytest.raises(ValueError, match=r"n_resamples: expected an integer >= 1, got 0"):
        M.bootstrap_report(probs=p, labels=y, n_resamples=0)
    with pytest.raises(ValueError, match=r"level: expected a float in \(0, 1\), got 95"):
        M.bootstrap_report(probs=p, labels=y, level=95)
    with pytest.raises(ValueError, match=r"metrics: expected names from ece, .*got \['aurc'\]"):
        M.bootstrap_report(probs=p, labels=y, metrics=["aurc"])
    with pytest.raises(ValueError, match=r"indices: expected shape \(B, 2\), got \(3, 5\)"):
        M.bootstrap_values(probs=p, labels=y, indices=torch.zeros(3, 5, dtype=torch.long))


# ----------------------------------------------------------------------------- keys


def test_ci_keys_build_parse_round_trip_and_are_never_objectives() -> None:
    low, high = K.ci_keys("test/ece@ts")
    assert (low, high) == ("test/ece@ts_ci_low", "test/ece@ts_ci_high")
    k = K.parse(low)
    assert (k.split, k.name, k.method, k.stat) == ("test", "ece", "ts", "ci_low")
    assert K.from_mlflow(K.to_mlflow(high)) == high == str(K.parse(high))
    assert K.direction(low) == "min" and K.direction("val/aurc") == "min"
    assert not K.is_selectable(K.ci_keys("val/ece")[0])
    assert K.is_selectable("val/refinement_nll") and K.is_selectable("val/augrc@ts")
    assert K.is_statistic(high) and not K.is_statistic("test/ece")
    with pytest.raises(ValueError, match=r"ci_keys: expected a metric, got the statistic"):
        K.ci_keys(low)
    with pytest.raises(ValueError, match=r"_ci_low or _ci_high ending"):
        K.key("test", "ece_ci_low")
    keys = K.final_keys(posthoc=["ts"], bootstrap=True)
    assert {"test/ece_ci_low", "test/nll@ts_ci_high", "val/refinement_nll@ts"} <= keys
    assert "test/smece_ci_low" not in keys  # smECE is not bootstrapped in trials
    assert not any(k.endswith("_ci_low") for k in K.final_keys(posthoc=["ts"]))


def test_seed_aggregation_keeps_ci_bounds_without_a_std() -> None:
    from calibtune.study._trainable import aggregate

    out = aggregate([{"test/ece": 0.1, "test/ece_ci_low": 0.05}, {"test/ece": 0.3}])
    assert out["test/ece_ci_low"] == 0.05 and "test/ece_std" in out
    assert not any(k.startswith("test/ece_ci_low_") for k in out)


# ----------------------------------------------------------------------------- trial


@pytest.mark.timeout(300)
def test_trial_reports_cis_selective_metrics_and_saves_predictions(tmp_path: Path) -> None:
    from calibtune.trial import config_from_dict, run

    cfg = config_from_dict(
        {
            "name": "unc",
            "storage_path": str(tmp_path),
            "data": {"name": "digits", "ood": []},
            "train": {"epochs": 1, "batch_size": 128},
            "eval": {"posthoc": ["ts"], "bootstrap": 50},
        }
    )
    res = run(cfg)
    m = res.metrics
    for name in ("test/ece", "test/adaece@ts", "test/error"):
        low, high = K.ci_keys(name)
        assert m[low] <= m[high], name
    assert set(res.metrics) | {k for h in res.history for k in h} == cfg.metric_keys()
    art = res.artifacts_dir
    with np.load(art / "test_predictions.npz") as z:
        assert sorted(z.files) == ["conf", "conf@ts", "correct", "correct@ts"]
        conf, correct = z["conf@ts"], z["correct@ts"]
    assert conf.dtype == np.float64 and correct.dtype == bool
    # any 10-class probs with this top-label confidence (≥ 1/10): class 0 on top
    probs = np.concatenate([conf[:, None], np.repeat((1 - conf[:, None]) / 9, 9, 1)], 1)
    labels = np.where(correct, 0, 1)
    assert M.ece(probs, labels) == pytest.approx(m["test/ece@ts"], abs=1e-12)
    assert M.aurc(probs, labels) == pytest.approx(m["test/aurc@ts"], abs=1e-12)
    curves = json.loads((art / "risk_coverage.json").read_text())
    assert set(curves) == {"uncalibrated", "ts"}
    assert (art / "figures" / "risk_coverage.png").is_file()
    with pytest.raises(
        ValueError, match=r"eval.bootstrap: expected an integer in \[0, 100000\], got -1"
    ):
        config_from_dict({"eval": {"bootstrap": -1}})


def test_studies_may_select_on_refinement_and_aurc_but_not_on_a_ci_bound(tmp_path: Path) -> None:
    import yaml

    from calibtune.study import load_study

    def study(metric: str) -> Path:
        raw = {
            "name": "sel",
            "trial": {"data": {"name": "digits"}, "eval": {"posthoc": ["ts"]}},
            "losses": ["cross_entropy"],
            "search": {"num_samples": 1, "objectives": [{"metric": metric, "mode": "min"}]},
            "storage": str(tmp_path / "studies"),
        }
        path = tmp_path / "sel.yaml"
        path.write_text(yaml.safe_dump(raw))
        return path

    from calibtune.study._trainable import trial_dict
    from calibtune.trial import config_from_dict

    for metric in ("val/refinement_nll", "val/aurc@ts", "val/augrc"):
        s = load_study(study(metric))
        assert s.search.objectives[0].metric == metric
        # named: computed every epoch (Optuna and ASHA read every report)
        cfg = config_from_dict(trial_dict(s, {"loss": "cross_entropy"}, 1, "t"))
        assert cfg.eval.epoch_selective
        assert metric in K.epoch_keys(epoch_posthoc=cfg.eval.epoch_posthoc, selective=True)
    # not named: the final evaluation only
    cfg = config_from_dict(
        trial_dict(load_study(study("val/ece@ts")), {"loss": "cross_entropy"}, 1, "t")
    )
    assert not cfg.eval.epoch_selective
    assert "val/aurc" not in K.epoch_keys(epoch_posthoc=cfg.eval.epoch_posthoc)
    assert {"val/aurc", "val/refinement_nll@ts"} <= cfg.metric_keys(posthoc_params=False)
    with pytest.raises(ValueError, match=r"not a bootstrap CI bound .*got 'val/ece_ci_low'"):
        load_study(study("val/ece_ci_low"))


@pytest.mark.parametrize(
    "shift, tables, tied", [(6.0, True, False), (0.5, False, False), (6.0, True, True)]
)
def test_bootstrap_sweep_equals_a_loop_with_and_without_the_position_tables(
    shift: float, tables: bool, tied: bool
) -> None:
    # an accurate model keeps most resamples monotone up to large bin counts: the sweep then
    # reads its sums from the every-position tables; a poor one stops early and searches
    from calibtune.metrics import _bootstrap as B

    g = torch.Generator().manual_seed(2)
    n, k = 240, 5
    y = torch.randint(0, k, (n,), generator=g)
    z = torch.randn(n, k, generator=g, dtype=torch.float64)
    z[torch.arange(n), y] += shift
    if tied:  # coarse logits: runs of tied confidences straddle the equal-mass boundaries
        z = torch.round(z)
    p = torch.softmax(z, 1)
    conf, pred = p.max(1)
    correct = pred == y
    idx = M.bootstrap_indices(n, 16, seed=5)
    order, w = B._in_order(conf, correct, idx)
    s = B._Sorted(conf[order], correct[order], w)
    sweep = B._ece_sweep(s)
    assert (s._every is not None) is tables
    for b in range(idx.shape[0]):
        ref = M.calibration_report(probs=p[idx[b]], labels=y[idx[b]])["ece_sweep"]
        assert float(sweep[b]) == pytest.approx(ref, rel=1e-10, abs=1e-12), b
