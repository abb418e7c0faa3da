"""Post-hoc calibration: contract tests over the registry, temperature scaling, ETS, spline.

Focal calibration / focal temperature scaling are tested in ``test_posthoc_focal.py``.
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch
from scipy.interpolate import CubicSpline

from calibtune import metrics as M
from calibtune.posthoc import (
    DEFAULT_TEMPERATURES,
    POSTHOC,
    EnsembleTemperatureScaling,
    PosthocCalibrator,
    SplineCalibration,
    TemperatureScaling,
    build_posthoc,
    list_posthoc,
)
from calibtune.posthoc._grid import adaece_grid, ece_grid, first_minimum
from calibtune.posthoc._spline import (
    fit_natural_spline,
    natural_spline_derivative,
    rescale_top,
)
from calibtune.posthoc._temperature import ts_probs

# Small grids keep the registry-wide contract tests fast; each entry's defaults are tested in
# the method-specific tests below.
FAST_PARAMS: dict[str, dict] = {
    name: {"temperatures": [0.5, 1.0, 1.5, 2.0, 3.0]} for name in ("focal_ts", "focal_ts_nll")
}


def planted(
    n: int, k: int, t_true: float, seed: int, scale: float = 3.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits z and labels drawn from softmax(z / t_true): softmax(z / t_true) is calibrated."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=torch.float64) * scale
    y = torch.multinomial(torch.softmax(z / t_true, dim=1), 1, generator=g).squeeze(1)
    return z.float(), y


@pytest.fixture(scope="module")
def val_test() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """An over-confident 10-class model (true temperature 2): validation and test splits."""
    zv, yv = planted(3000, 10, 2.0, seed=0)
    zt, yt = planted(3000, 10, 2.0, seed=1)
    return zv, yv, zt, yt


# -- registry --------------------------------------------------------------------------------


def test_registry_names_and_lookup_errors() -> None:
    assert list_posthoc() == [
        "dirichlet",
        "ets",
        "focal_ts",
        "focal_ts_nll",
        "hist_binning",
        "isotonic",
        "matrix_scaling",
        "spline",
        "ts",
        "ts_nll",
        "vector_scaling",
    ]
    assert POSTHOC.names() == list_posthoc()
    with pytest.raises(ValueError, match=r"unknown post-hoc calibration method 'platt'.*ets.*ts"):
        build_posthoc("platt")
    with pytest.raises(ValueError, match=r"ts: unknown parameter 'gamma'"):
        build_posthoc("ts", gamma=1.0)
    with pytest.raises(ValueError, match=r"ts: criterion: expected one of 'ece', 'adaece', 'nll'"):
        build_posthoc("ts", criterion="brier")
    with pytest.raises(ValueError, match=r"ts: n_bins: expected an integer in \[1, inf\), got 0"):
        build_posthoc("ts", n_bins=0)
    with pytest.raises(ValueError, match=r"focal_ts: gammas: expected a float list in \(-1, inf\)"):
        build_posthoc("focal_ts", gammas=[-1.0, 1.0])
    with pytest.raises(ValueError, match=r"spline: n_knots: expected an integer in \[3, 100\]"):
        build_posthoc("spline", n_knots=2)


def test_registry_entries_declare_defaults_matching_the_classes() -> None:
    for entry in POSTHOC:
        obj = entry.factory(**entry.defaults())
        assert isinstance(obj, PosthocCalibrator)
        assert obj.name == entry.name
        # each declared default is the constructor's own default (one source of defaults)
        signature = inspect.signature(type(obj).__init__).parameters
        for p in entry.params:
            assert signature[p.name].default == p.default, (entry.name, p.name)
    assert build_posthoc("ts_nll").criterion == "nll" and not build_posthoc("ts_nll").on_grid
    assert build_posthoc("ts").criterion == "ece"
    assert build_posthoc("ts").temperatures == DEFAULT_TEMPERATURES
    assert build_posthoc("focal_ts").criterion == "adaece"  # the seed's equal-mass ECE
    assert build_posthoc("focal_ts_nll").criterion == "nll"


# -- contract, generated from the registry ---------------------------------------------------


@pytest.mark.parametrize("name", list_posthoc())
def test_contract(name: str, val_test) -> None:
    zv, yv, zt, _ = val_test
    method = build_posthoc(name, **FAST_PARAMS.get(name, {}))
    assert not method.is_fitted
    assert method.fit(zv, yv) is method and method.is_fitted
    params = method.params()
    assert params and all(type(v) is float and math.isfinite(v) for v in params.values())
    for name_, value in params.items():
        if name_ in ("T", "gamma_ev", "w_ts", "w_orig", "w_unif"):
            assert getattr(method, name_) == value
    p = method.calibrate(zt)
    assert isinstance(p, torch.Tensor) and p.shape == zt.shape and p.dtype == torch.float32
    assert p.device == zt.device
    assert torch.isfinite(p).all() and (p >= 0).all() and (p <= 1).all()
    torch.testing.assert_close(p.sum(1), torch.ones(len(zt)), atol=1e-5, rtol=0)
    # methods that claim it keep the prediction (ETS: its TS weight is positive here); the
    # others are shown to change it in test_posthoc_new.py
    if method.preserves_argmax:
        assert torch.equal(p.argmax(1), zt.argmax(1))
    # float64 in, float64 out; numpy in works
    p64 = method.calibrate(zt.double())
    assert p64.dtype == torch.float64
    torch.testing.assert_close(p64, p.double(), atol=1e-5, rtol=0)
    torch.testing.assert_close(method.calibrate(zt.numpy()), p)


@pytest.mark.parametrize("name", list_posthoc())
def test_contract_errors(name: str, val_test) -> None:
    zv, yv, zt, _ = val_test
    method = build_posthoc(name, **FAST_PARAMS.get(name, {}))
    with pytest.raises(ValueError, match=r"calibrate\(\) called before fit\(\)"):
        method.calibrate(zt)
    with pytest.raises(ValueError, match=r"params\(\) called before fit\(\)"):
        method.params()
    bad = zv.clone()
    bad[7, 3] = float("nan")
    with pytest.raises(ValueError, match=r"logits: expected finite values, got NaN/inf .*row 7"):
        method.fit(bad, yv)
    with pytest.raises(ValueError, match=r"labels: expected shape \(3000,\).*got \(2999,\)"):
        method.fit(zv, yv[:-1])
    with pytest.raises(ValueError, match=r"labels: expected values in \[0, 9\]"):
        method.fit(zv, torch.full_like(yv, 10))
    with pytest.raises(ValueError, match=r"logits: expected a 2-D \(N, K\) array, got shape"):
        method.fit(zv[:, 0], yv)
    method.fit(zv, yv)
    with pytest.raises(ValueError, match=r"logits: expected finite values"):
        method.calibrate(bad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", list_posthoc())
def test_calibrate_stays_on_device(name: str, val_test) -> None:
    zv, yv, zt, _ = val_test
    method = build_posthoc(name, **FAST_PARAMS.get(name, {})).fit(zv.cuda(), yv.cuda())
    p = method.calibrate(zt.cuda())
    assert p.is_cuda
    cpu = build_posthoc(name, **FAST_PARAMS.get(name, {})).fit(zv, yv)
    assert method.params() == pytest.approx(cpu.params(), rel=1e-3, abs=1e-3)


# -- batched criteria == calibtune.metrics ----------------------------------------------------


def test_grid_criteria_equal_metrics_with_ties() -> None:
    # K = 2 rows [c, 1 − c] with c on a coarse lattice: many exact ties in the confidences,
    # so the stable equal-mass split and the (lo, hi] edges (0.2, 0.4, … are lattice points)
    # are exercised. float64, so the edges are exactly those of `metrics`.
    rng = np.random.default_rng(0)
    g, n = 6, 203
    conf = torch.tensor(rng.integers(10, 21, size=(g, n)) / 20.0)
    labels = torch.tensor(rng.integers(0, 2, size=n))
    correct = labels == 0
    e, a = ece_grid(conf, correct, 5), adaece_grid(conf, correct, 7)
    for i in range(g):
        probs = torch.stack([conf[i], 1 - conf[i]], 1)
        assert float(e[i]) == pytest.approx(M.ece(probs, labels, n_bins=5), abs=1e-12)
        assert float(a[i]) == pytest.approx(M.adaece(probs, labels, n_bins=7), abs=1e-12)


def test_grid_adaece_float32_fast_sort_matches_metrics() -> None:
    # float32 on the CPU takes the int64-key numpy sort; ties again via a lattice
    rng = np.random.default_rng(1)
    conf = torch.tensor(rng.integers(50, 101, size=(4, 999)) / 100.0, dtype=torch.float32)
    labels = torch.tensor(rng.integers(0, 2, size=999))
    a = adaece_grid(conf, labels == 0, 15)
    for i in range(4):
        probs = torch.stack([conf[i], 1 - conf[i]], 1)
        assert float(a[i]) == pytest.approx(M.adaece(probs, labels), abs=1e-12)


def test_first_minimum_prefers_the_first_of_ties() -> None:
    assert first_minimum(torch.tensor([0.3, 0.1, 0.1 + 1e-16, 0.1], dtype=torch.float64)) == 1
    assert first_minimum(torch.tensor([float("nan"), 0.2, 0.1], dtype=torch.float64)) == 2


# -- temperature scaling ----------------------------------------------------------------------


def test_default_grid_is_exact_tenths() -> None:
    assert len(DEFAULT_TEMPERATURES) == 100
    # exact k/10 doubles: 0.3 is not 0.1 + 0.1 + 0.1 = 0.30000000000000004
    assert DEFAULT_TEMPERATURES[2] == 0.3 and DEFAULT_TEMPERATURES[2] != 0.1 + 0.1 + 0.1
    assert tuple(k / 10 for k in range(1, 101)) == DEFAULT_TEMPERATURES
    assert DEFAULT_TEMPERATURES[0] == 0.1 and DEFAULT_TEMPERATURES[-1] == 10.0


@pytest.mark.parametrize("criterion, metric", [("ece", M.ece), ("adaece", M.adaece)])
def test_ts_grid_criterion_equals_metrics_at_every_grid_point(criterion, metric) -> None:
    zv, yv = planted(1500, 10, 2.0, seed=3)
    # near-ties: the top logit one ulp above an earlier runner-up, so that at large T the
    # softmax rounds them equal and its argmax (first maximum) is the runner-up; and an exact tie
    zv[0, :2] = torch.tensor([float(np.nextafter(np.float32(5.0), np.float32(0))), 5.0])
    yv[0] = 1
    zv[1, :2] = 4.0
    ts = TemperatureScaling(criterion=criterion).fit(zv, yv)
    assert ts.grid.tolist() == list(DEFAULT_TEMPERATURES)
    for t, value in zip(DEFAULT_TEMPERATURES, ts.curve.tolist(), strict=True):
        assert value == pytest.approx(metric(ts_probs(zv, t), yv), abs=1e-9), t
    # the fitted T is the grid argmin and calibrate() is softmax(z / T)
    best = int(torch.argmin(ts.curve))
    assert DEFAULT_TEMPERATURES[best] == ts.T
    assert ts.criterion_value == pytest.approx(metric(ts.calibrate(zv), yv), abs=1e-9)
    torch.testing.assert_close(ts.calibrate(zv), torch.softmax(zv / ts.T, 1))


def test_ts_ties_go_to_the_smallest_temperature() -> None:
    # all logits equal: every T gives the uniform distribution, so every grid point ties
    z = torch.zeros(50, 4)
    y = torch.arange(50) % 4
    ts = TemperatureScaling().fit(z, y)
    assert torch.all(ts.curve == ts.curve[0])
    assert ts.T == 0.1
    # a user grid given in any order is searched ascending
    ts = TemperatureScaling(temperatures=[3.0, 0.7, 2.0, 0.7]).fit(z, y)
    assert ts.temperatures == (0.7, 2.0, 3.0) and ts.T == 0.7


def test_ts_on_focal_ts_grid_is_focal_ts_with_gamma_zero() -> None:
    # Komisarenko & Kull §5.1: TS "selected over the same values grid and same choice criteria"
    from calibtune.posthoc import DEFAULT_FOCAL_TEMPERATURES, FocalTemperatureScaling

    zv, yv = planted(1500, 10, 1.7, seed=8)
    for criterion in ("adaece", "nll"):
        name = "ts" if criterion == "adaece" else "ts_nll"
        params = {"criterion": criterion} if name == "ts" else {}
        ts = build_posthoc(name, t_grid="focal_ts", **params).fit(zv, yv)
        assert ts.temperatures == DEFAULT_FOCAL_TEMPERATURES and ts.grid.numel() == 500
        fts = FocalTemperatureScaling(criterion=criterion, gammas=[0.0]).fit(zv, yv)
        assert ts.T == fts.T and fts.gamma_ev == 0.0
        # focal TS evaluates in float32 (log space for nll), TS's nll grid in float64
        torch.testing.assert_close(ts.curve, fts.curve[0], atol=1e-7, rtol=1e-6)
    # the NLL grid curve is the metric's NLL at every grid point
    ts = build_posthoc("ts_nll", temperatures=[0.5, 1.0, 1.7, 3.0]).fit(zv, yv)
    for t, v in zip(ts.temperatures, ts.curve.tolist(), strict=True):
        assert v == pytest.approx(M.nll(torch.softmax(zv.double() / t, 1), yv), abs=1e-12)
    assert ts.T == 1.7
    with pytest.raises(ValueError, match=r"expected at most one of t_grid and temperatures"):
        build_posthoc("ts", t_grid="focal_ts", temperatures=[1.0])
    with pytest.raises(ValueError, match=r"ts: t_grid: expected one of 'ts', 'focal_ts', got 'x'"):
        build_posthoc("ts", t_grid="x")


@pytest.mark.parametrize("name", ["ts", "focal_ts"])
def test_equal_mass_fit_is_independent_of_the_validation_order(name: str) -> None:
    # 30 distinct logit rows repeated: every confidence is tied many times across group edges
    zv, _ = planted(30, 5, 1.5, seed=9)
    idx = torch.randint(0, 30, (900,), generator=torch.Generator().manual_seed(1))
    z, y = zv[idx], torch.randint(0, 5, (900,), generator=torch.Generator().manual_seed(2))
    params = {"criterion": "adaece", **FAST_PARAMS.get(name, {})}
    ref = build_posthoc(name, **params).fit(z, y)
    for seed in range(3):
        perm = torch.randperm(900, generator=torch.Generator().manual_seed(seed))
        other = build_posthoc(name, **params).fit(z[perm], y[perm])
        assert other.params() == ref.params()
        # float32 maps may differ by an ulp with a row's position (vectorised vs scalar exp)
        torch.testing.assert_close(other.curve, ref.curve, atol=1e-9, rtol=0)


@pytest.mark.parametrize("t_true", [0.6, 2.0])
def test_ts_recovers_a_planted_temperature(t_true: float) -> None:
    z, y = planted(20000, 10, t_true, seed=4)
    nll_fit = TemperatureScaling(criterion="nll").fit(z, y)
    assert abs(nll_fit.T - t_true) <= 0.05 * t_true
    ece_fit = TemperatureScaling().fit(z, y)
    assert abs(ece_fit.T - t_true) <= 0.15 * t_true
    # NLL optimum: no better NLL nearby, and the reported criterion is the NLL at T
    z64 = z.double()
    at = M.nll(torch.softmax(z64 / nll_fit.T, 1), y)
    assert nll_fit.criterion_value == pytest.approx(at, abs=1e-9)
    for f in (0.98, 1.02):
        assert at <= M.nll(torch.softmax(z64 / (nll_fit.T * f), 1), y)


def test_ts_nll_respects_bounds_and_validates() -> None:
    z, _ = planted(2000, 5, 1.0, seed=5)
    y = torch.randint(0, 5, (2000,), generator=torch.Generator().manual_seed(0))
    # labels independent of z: NLL keeps falling as T grows, so T ends at the upper bound
    ts = TemperatureScaling(criterion="nll", t_min=0.5, t_max=4.0).fit(z, y)
    assert abs(ts.T - 4.0) <= 1e-5
    with pytest.raises(ValueError, match=r"expected t_min < t_max, got t_min=2.0, t_max=1.0"):
        TemperatureScaling(criterion="nll", t_min=2.0, t_max=1.0)
    with pytest.raises(ValueError, match=r"temperatures: expected a float list in \(0, inf\)"):
        TemperatureScaling(temperatures=[0.0, 1.0])
    with pytest.raises(ValueError, match=r"TemperatureScaling: criterion: expected one of"):
        TemperatureScaling(criterion="ECE")


def test_ts_improves_held_out_calibration(val_test) -> None:
    zv, yv, zt, yt = val_test
    ts = TemperatureScaling().fit(zv, yv)
    assert abs(ts.T - 2.0) <= 0.3
    before = M.ece(torch.softmax(zt, 1), yt)
    after = M.ece(ts.calibrate(zt), yt)
    assert after < before / 3
    assert M.error(ts.calibrate(zt), yt) == M.error(torch.softmax(zt, 1), yt)


# -- ensemble temperature scaling -----------------------------------------------------------


def _mse(p: torch.Tensor, onehot: torch.Tensor) -> float:
    return float(((p - onehot) ** 2).mean())


def test_ets_matches_brute_force_reference(val_test) -> None:
    zv, yv, *_ = val_test
    z64, k = zv.double(), zv.shape[1]
    onehot = torch.nn.functional.one_hot(yv, k).double()
    ets = EnsembleTemperatureScaling().fit(zv, yv)
    w = np.array([ets.w_ts, ets.w_orig, ets.w_unif])
    assert (w >= 0).all() and w.sum() == pytest.approx(1.0, abs=1e-12)
    # T: the MSE of plain TS on a dense grid over the reference bounds [0.05, 5]
    grid = np.linspace(0.05, 5.0, 496)
    mse = [_mse(torch.softmax(z64 / t, 1), onehot) for t in grid]
    assert abs(ets.T - grid[int(np.argmin(mse))]) <= 0.01
    # weights: no point of a 0.02-lattice on the simplex has a lower MSE
    comps = (torch.softmax(z64 / ets.T, 1), torch.softmax(z64, 1), torch.full_like(z64, 1 / k))
    best = min(
        _mse(a * comps[0] + b * comps[1] + (1 - a - b) * comps[2], onehot)
        for a in np.arange(0, 1.0001, 0.02)
        for b in np.arange(0, 1.0001 - a, 0.02)
    )
    ours = _mse(w[0] * comps[0] + w[1] * comps[1] + w[2] * comps[2], onehot)
    assert ours <= best + 1e-10
    torch.testing.assert_close(ets.calibrate(z64), w[0] * comps[0] + w[1] * comps[1] + w[2] / k)


def test_ets_uses_the_uniform_component_for_uninformative_logits() -> None:
    # labels independent of the logits: the best mix is (nearly) the uniform distribution
    z, _ = planted(4000, 5, 1.0, seed=6, scale=1.0)
    y = torch.randint(0, 5, (4000,), generator=torch.Generator().manual_seed(1))
    for loss in ("mse", "nll"):
        ets = EnsembleTemperatureScaling(loss=loss).fit(z, y)
        assert ets.w_unif > 0.5, loss


def test_ets_nll_loss_beats_plain_ts_nll(val_test) -> None:
    zv, yv, *_ = val_test
    ets = EnsembleTemperatureScaling(loss="nll").fit(zv, yv)
    ts = TemperatureScaling(criterion="nll").fit(zv, yv)
    assert M.nll(ets.calibrate(zv.double()), yv) <= ts.criterion_value + 1e-9
    with pytest.raises(ValueError, match=r"EnsembleTemperatureScaling: loss: expected one of"):
        EnsembleTemperatureScaling(loss="brier")


# -- spline calibration -----------------------------------------------------------------------


def test_natural_spline_matches_scipy_and_least_squares_recovers_it() -> None:
    knots_x = np.linspace(0, 1, 6)
    knots_y = np.array([0.0, 0.3, -0.2, 0.5, 0.1, 0.4])
    ref = CubicSpline(knots_x, knots_y, bc_type="natural")
    x = np.linspace(0, 1, 501)
    # data on a natural spline with these knots: the least-squares fit returns its knot values
    fitted = fit_natural_spline(x, ref(x), 6)
    np.testing.assert_allclose(fitted, knots_y, atol=1e-10)
    np.testing.assert_allclose(natural_spline_derivative(knots_y, x), ref(x, 1), atol=1e-10)


def test_spline_reduces_top_label_ece(val_test) -> None:
    zv, yv, zt, yt = val_test
    sp = SplineCalibration().fit(zv, yv)
    assert sp.knots.shape == (6,) and list(sp.params()) == [f"knot_{i}" for i in range(6)]
    assert np.all(np.diff(sp.xs) > 0) and sp.xs.size <= len(zv)
    assert M.ece(sp.calibrate(zt), yt) < M.ece(torch.softmax(zt, 1), yt) / 2


def test_spline_leaves_a_calibrated_model_nearly_unchanged() -> None:
    zv, yv = planted(20000, 10, 1.0, seed=7)
    zt, _ = planted(5000, 10, 1.0, seed=8)
    sp = SplineCalibration().fit(zv, yv)
    conf_before = torch.softmax(zt, 1).amax(1)
    conf_after = sp.calibrate(zt).amax(1)
    assert float((conf_after - conf_before).abs().mean()) < 0.03


def test_rescale_top_keeps_ratios_argmax_and_sums() -> None:
    p = torch.tensor(
        [
            [0.6, 0.3, 0.1],  # plain proportional rescale
            [0.5, 0.45, 0.05],  # target below what the runner-up would get: mix toward uniform
            [0.5, 0.45, 0.05],  # target below chance (1/3): floored just above 1/3
            [1.0, 0.0, 0.0],  # one-hot: remaining mass spread uniformly
            [0.2, 0.7, 0.1],  # top is not the first column
        ],
        dtype=torch.float64,
    )
    new_top = torch.tensor([0.5, 0.4, 0.2, 0.7, 0.9], dtype=torch.float64)
    out = rescale_top(p, new_top)
    torch.testing.assert_close(out.sum(1), torch.ones(5, dtype=torch.float64))
    assert torch.equal(out.argmax(1), p.argmax(1))
    f64 = torch.float64
    # row 0: c' = 0.5; others 0.3 : 0.1 share 0.5 -> 0.375, 0.125
    torch.testing.assert_close(out[0], torch.tensor([0.5, 0.375, 0.125], dtype=f64))
    # row 1: c' = 0.4, limit share 0.4/0.6 = 2/3; shares (0.9, 0.1), uniform 0.5:
    #   λ = (0.9 − 2/3) / (0.9 − 0.5) = 0.5833 -> shares (2/3, 1/3) -> (0.4, 0.4, 0.2), top first
    assert out[1, 0] == pytest.approx(0.4, abs=1e-15) and out[1, 0] > out[1, 1]
    torch.testing.assert_close(out[1], torch.tensor([0.4, 0.4, 0.2], dtype=f64))
    # row 2: c' = 0.2 < 1/3 -> floored a few ulps above 1/3, others (almost) uniform
    torch.testing.assert_close(out[2], torch.full((3,), 1 / 3, dtype=f64))
    assert out[2, 0] > out[2, 1] and out[2, 0] > out[2, 2]
    torch.testing.assert_close(out[3], torch.tensor([0.7, 0.15, 0.15], dtype=f64))
    # row 4: c' = 0.9 on column 1, 0.2 : 0.1 share 0.1
    torch.testing.assert_close(out[4], torch.tensor([0.2 / 3, 0.9, 0.1 / 3], dtype=f64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rescale_top_stress_keeps_argmax_strictly(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(11)
    for k in (2, 3, 10, 100):
        p = torch.softmax(torch.randn(4000, k, generator=g, dtype=torch.float64) * 3, 1)
        p = p.to(dtype)
        new_top = torch.rand(4000, generator=g, dtype=torch.float64).to(dtype)
        out = rescale_top(p, new_top)
        assert torch.equal(out.argmax(1), p.argmax(1)), k
        top2 = out.topk(2, dim=1).values
        assert bool((top2[:, 0] > top2[:, 1]).all()), k
        torch.testing.assert_close(out.sum(1), torch.ones(4000, dtype=dtype))
        # the new confidence is honoured wherever it is above chance
        honoured = new_top > 1.001 / k
        torch.testing.assert_close(out.amax(1)[honoured], new_top[honoured])


def test_spline_keeps_argmax_when_accuracy_is_below_the_runner_up() -> None:
    # 10 classes, true temperature 4: accuracy is far below the runner-up probabilities, so the
    # spline's target confidence often needs the others' shares flattened (and sometimes the 1/K
    # floor)
    zv, yv = planted(4000, 10, 4.0, seed=9)
    zt, _ = planted(4000, 10, 4.0, seed=10)
    p = SplineCalibration().fit(zv, yv).calibrate(zt)
    assert torch.equal(p.argmax(1), zt.argmax(1))
    top2 = p.topk(2, dim=1).values
    assert bool((top2[:, 0] > top2[:, 1]).all())
