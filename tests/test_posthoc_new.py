"""Vector/matrix scaling, Dirichlet-ODIR, top-label histogram binning, one-vs-rest isotonic.

Parity: probmetrics 1.3.0 (vector and matrix scaling; its matrix scaling on log-probabilities is
unregularised Dirichlet calibration), scikit-learn's ``IsotonicRegression`` and netcal
(``HistogramBinning`` binary, ``IsotonicRegression`` multiclass). ``dirichletcal`` needs
Python ≥ 3.12 (this project runs 3.11), so Dir-ODIR with λ, μ > 0 is checked against an
independent float64 scipy L-BFGS-B fit of the paper's objective written out below.
The registry-wide contract (shapes, dtypes, errors) runs in ``test_posthoc.py``.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from calibtune import metrics as M
from calibtune.metrics import keys as K
from calibtune.posthoc import (
    POSTHOC,
    DirichletCalibration,
    HistogramBinning,
    IsotonicCalibration,
    MatrixScaling,
    VectorScaling,
    build_posthoc,
    list_posthoc,
)
from calibtune.posthoc._affine import canonical, odir_objective
from calibtune.posthoc._binning import fit_histogram, fit_isotonic

NEW = ("vector_scaling", "matrix_scaling", "dirichlet", "hist_binning", "isotonic")
CHANGES_ARGMAX = {"vector_scaling", "matrix_scaling", "dirichlet", "isotonic"}


def shifted(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Over-confident logits whose labels follow softmax((z + shift) / 2): the true decision
    boundary is shifted, so a fitted intercept or per-class map moves some predictions."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=torch.float64) * 3
    shift = torch.linspace(0.0, 2.0, k, dtype=torch.float64)
    y = torch.multinomial(torch.softmax((z + shift) / 2, 1), 1, generator=g).squeeze(1)
    return z, y


@pytest.fixture(scope="module")
def data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    zv, yv = shifted(2000, 4, seed=0)
    zt, yt = shifted(2000, 4, seed=1)
    return zv, yv, zt, yt


# -- registry, parameters, argmax claims ---------------------------------------------------


def test_new_methods_are_registered_with_their_argmax_claims() -> None:
    assert set(NEW) <= set(list_posthoc())
    keeps = {name: type(build_posthoc(name)).preserves_argmax for name in list_posthoc()}
    assert {n for n, k in keeps.items() if not k} == CHANGES_ARGMAX
    assert DirichletCalibration().reg_lambda == 1e-3 and DirichletCalibration().reg_mu == 1e-3
    assert MatrixScaling().reg_lambda == 0.0 and VectorScaling().reg_mu == 0.0
    assert HistogramBinning().points_per_bin == 50 and HistogramBinning().binning == "mass"


BAD_PARAMS = [
    ("dirichlet", {"reg_lambda": -1}, r"reg_lambda: expected a number in \[0, inf\), got -1"),
    ("matrix_scaling", {"reg_mu": "big"}, r"reg_mu: expected a number in \[0, inf\), got 'big'"),
    (
        "vector_scaling",
        {"reg_lambda": 0.1},
        r"unknown parameter 'reg_lambda'; expected one of max_iter, reg_mu",
    ),
    ("dirichlet", {"max_iter": 0}, r"max_iter: expected an integer in \[1, 100000\], got 0"),
    ("hist_binning", {"binning": "q"}, r"binning: expected one of 'mass', 'width', got 'q'"),
    (
        "hist_binning",
        {"points_per_bin": 0},
        r"points_per_bin: expected an integer in \[1, 100000\], got 0",
    ),
    ("isotonic", {"eps": 0.5}, r"eps: expected a number in \[0, 0.01\], got 0.5"),
]


@pytest.mark.parametrize(("name", "params", "message"), BAD_PARAMS)
def test_bad_parameters_give_one_clear_line(name: str, params: dict, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{name}: {message}$"):
        build_posthoc(name, **params)
    # the constructor checks the same rules (named by the class)
    cls = type(build_posthoc(name))
    if all(k in {p.name for p in cls.PARAMS} for k in params):
        with pytest.raises(ValueError, match=f"^{cls.__name__}: {message}$"):
            cls(**params)


@pytest.mark.parametrize("name", sorted(CHANGES_ARGMAX))
def test_methods_that_may_change_the_argmax_do_change_it(name: str, data) -> None:
    zv, yv, zt, _ = data
    p = build_posthoc(name).fit(zv, yv).calibrate(zt)
    before, after = zt.argmax(1), p.argmax(1)
    moved = after != before
    assert moved.double().mean() > 0.02
    # the true boundary is shifted toward the higher classes: most moved predictions follow it
    assert (after[moved] > before[moved]).double().mean() > 0.5


@pytest.mark.parametrize("seed", range(3))
def test_histogram_binning_keeps_the_argmax_on_random_logits(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    scale = [0.3, 3.0, 30.0][seed]
    zv, zt = torch.randn(1500, 7, generator=g) * scale, torch.randn(1500, 7, generator=g) * scale
    yv = torch.randint(0, 7, (1500,), generator=g)  # labels unrelated: bins ask for low confidence
    for dtype in (torch.float32, torch.float64):
        p = HistogramBinning(points_per_bin=30).fit(zv, yv).calibrate(zt.to(dtype))
        assert torch.equal(p.argmax(1), zt.argmax(1))


# -- affine maps: objective, canonical form, parity ----------------------------------------


def test_odir_objective_hand_derived() -> None:
    x = torch.zeros(1, 2, dtype=torch.float64)
    y = torch.tensor([0])
    w = torch.tensor([[1.0, 2.0], [3.0, 1.0]], dtype=torch.float64)
    b = torch.tensor([1.0, -1.0], dtype=torch.float64)
    # scores = b = (1, −1): NLL = log(1 + e^{−2}); off-diagonal: (2² + 3²) / (2·1) = 6.5;
    # intercept: (1 + 1) / 2 = 1
    nll = math.log(1 + math.exp(-2))
    assert float(odir_objective(x, y, w, b, 0.0, 0.0)) == pytest.approx(nll, abs=1e-15)
    assert float(odir_objective(x, y, w, b, 0.1, 0.0)) == pytest.approx(nll + 0.65, abs=1e-15)
    assert float(odir_objective(x, y, w, b, 0.1, 0.2)) == pytest.approx(nll + 0.85, abs=1e-15)
    # a diagonal (vector) map has no off-diagonal penalty
    v = torch.tensor([2.0, 3.0], dtype=torch.float64)
    assert float(odir_objective(x, y, v, b, 5.0, 0.0)) == pytest.approx(nll, abs=1e-15)


def test_canonical_form_keeps_the_probabilities_and_minimises_the_penalty() -> None:
    g = torch.Generator().manual_seed(0)
    w, b = (
        torch.randn(5, 5, generator=g, dtype=torch.float64),
        torch.randn(5, generator=g, dtype=torch.float64),
    )
    x = torch.randn(50, 5, generator=g, dtype=torch.float64)
    wc, bc = canonical(w, b)
    torch.testing.assert_close(torch.softmax(x @ wc.T + bc, 1), torch.softmax(x @ w.T + b, 1))
    assert abs(float(bc.sum())) < 1e-12
    off = wc - torch.diag(torch.diagonal(wc))
    torch.testing.assert_close(off.sum(0), torch.zeros(5, dtype=torch.float64))
    y = torch.randint(0, 5, (50,), generator=g)
    assert odir_objective(x, y, wc, bc, 1.0, 1.0) < odir_objective(x, y, w, b, 1.0, 1.0)


def _scipy_odir(
    x: np.ndarray, y: np.ndarray, lam: float, mu: float
) -> tuple[np.ndarray, np.ndarray]:
    """Independent reference: L-BFGS-B (scipy, float64) on the paper's objective with its
    analytic gradient, W (K, K) and b (K,) free (no canonical form, no standardisation)."""
    n, k = x.shape
    onehot = np.eye(k)[y]
    mask = 1.0 - np.eye(k)

    def fun(theta: np.ndarray) -> tuple[float, np.ndarray]:
        w, b = theta[: k * k].reshape(k, k), theta[k * k :]
        s = x @ w.T + b
        s -= s.max(1, keepdims=True)
        logq = s - np.log(np.exp(s).sum(1, keepdims=True))
        r = (np.exp(logq) - onehot) / n  # dL/ds
        f = (
            -(onehot * logq).sum() / n
            + lam * (mask * w**2).sum() / (k * (k - 1))
            + mu * (b**2).sum() / k
        )
        gw = r.T @ x + 2 * lam * mask * w / (k * (k - 1))
        gb = r.sum(0) + 2 * mu * b / k
        return f, np.concatenate([gw.ravel(), gb])

    theta0 = np.concatenate([np.eye(k).ravel(), np.zeros(k)])
    res = minimize(
        fun,
        theta0,
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": 20000, "ftol": 1e-15, "gtol": 1e-10},
    )
    return res.x[: k * k].reshape(k, k), res.x[k * k :]


@pytest.mark.timeout(120)
def test_dirichlet_odir_matches_an_independent_scipy_fit(data) -> None:
    zv, yv, zt, _ = data
    lam, mu = 0.05, 0.02
    cal = DirichletCalibration(reg_lambda=lam, reg_mu=mu).fit(zv, yv)
    xv = torch.log_softmax(zv, 1).numpy()
    w_ref, b_ref = _scipy_odir(xv, yv.numpy(), lam, mu)
    # with λ, μ > 0 the minimiser is unique: the reference lands on the canonical form too
    np.testing.assert_allclose(cal.W.numpy(), w_ref, atol=2e-4)
    np.testing.assert_allclose(cal.b.numpy(), b_ref, atol=2e-4)
    xt = torch.log_softmax(zt, 1).numpy()
    s = xt @ w_ref.T + b_ref
    q_ref = np.exp(s - s.max(1, keepdims=True))
    q_ref /= q_ref.sum(1, keepdims=True)
    np.testing.assert_allclose(cal.calibrate(zt).numpy(), q_ref, atol=1e-5)
    ref_obj = odir_objective(
        torch.as_tensor(xv), yv, torch.as_tensor(w_ref), torch.as_tensor(b_ref), lam, mu
    )
    assert cal.objective <= float(ref_obj) + 1e-10


def _probmetrics(cls_name: str):
    pytest.importorskip("numba", reason="probmetrics imports numba")
    from probmetrics.calibrators import logistic

    return getattr(logistic, cls_name)()


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("name", "peer", "inputs"),
    [
        ("vector_scaling", "VectorScalingCalibrator", "logits"),
        ("matrix_scaling", "MatrixScalingCalibrator", "logits"),
        # probmetrics maps probabilities to log p before its matrix scaling: Dirichlet, λ = μ = 0
        ("dirichlet", "MatrixScalingCalibrator", "probs"),
    ],
)
def test_unregularised_affine_maps_match_probmetrics(
    name: str, peer: str, inputs: str, data
) -> None:
    from probmetrics.distributions import CategoricalLogits

    zv, yv, zt, _ = data
    params = {"reg_mu": 0.0} if name == "vector_scaling" else {"reg_lambda": 0.0, "reg_mu": 0.0}
    ours = build_posthoc(name, **params).fit(zv, yv)
    ref = _probmetrics(peer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        if inputs == "logits":
            ref.fit_torch(CategoricalLogits(zv), yv)
            theirs = [ref.predict_proba_torch(CategoricalLogits(z)).get_probs() for z in (zv, zt)]
        else:
            ref.fit(torch.softmax(zv, 1).numpy(), yv.numpy())
            theirs = [
                torch.as_tensor(ref.predict_proba(torch.softmax(z, 1).numpy())) for z in (zv, zt)
            ]
    # probmetrics' BFGS (torchmin defaults) stops at a looser gradient tolerance: the maps agree
    # to 1e-3, and ours reaches the lower (or equal) validation NLL
    torch.testing.assert_close(ours.calibrate(zt), theirs[1].double(), atol=1e-3, rtol=0)
    assert M.nll(ours.calibrate(zv), yv) <= M.nll(theirs[0].double(), yv) + 1e-12


def test_vector_scaling_recovers_a_planted_map() -> None:
    g = torch.Generator().manual_seed(3)
    z = torch.randn(20000, 3, generator=g, dtype=torch.float64) * 2
    v, b = (
        torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64),
        torch.tensor([0.3, -0.1, -0.2], dtype=torch.float64),
    )
    y = torch.multinomial(torch.softmax(z * v + b, 1), 1, generator=g).squeeze(1)
    cal = VectorScaling().fit(z, y)
    torch.testing.assert_close(cal.W, v, atol=0.08, rtol=0)
    torch.testing.assert_close(cal.b, b - b.mean(), atol=0.08, rtol=0)  # canonical: zero mean


# -- histogram binning ---------------------------------------------------------------------


def test_fit_histogram_hand_derived() -> None:
    conf = np.array([0.2, 0.3, 0.4, 0.6, 0.7, 0.9])
    hits = np.array([0.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    # 6 // 3 = 2 equal-mass bins: edge = median 0.5 -> (.., 0.5] holds 1/3 hits, (0.5, ..] 3/3
    edges, values = fit_histogram(conf, hits, points_per_bin=3, binning="mass")
    np.testing.assert_allclose(edges, [0.5])
    np.testing.assert_allclose(values, [1 / 3, 1.0])
    # equal width, 3 bins of [0, 1]: (.., 1/3] {0.2, 0.3}, (1/3, 2/3] {0.4, 0.6}, (2/3, ..] rest
    edges, values = fit_histogram(conf, hits, points_per_bin=2, binning="width")
    np.testing.assert_allclose(edges, [1 / 3, 2 / 3])
    np.testing.assert_allclose(values, [0.5, 0.5, 1.0])
    # 4 bins of width 1/4: the two middle ones are empty and predict the overall mean 0.5
    _, values = fit_histogram(np.array([0.1, 0.2, 0.8, 0.9]), np.array([0, 0, 1, 1.0]), 1, "width")
    np.testing.assert_allclose(values, [0, 0.5, 0.5, 1.0])


def test_top_label_binning_hand_derived() -> None:
    # class 0 predicted four times (confidences a < b < c < d), class 1 twice, class 2 never
    zv = torch.log(
        torch.tensor(
            [
                [0.5, 0.3, 0.2],
                [0.6, 0.2, 0.2],
                [0.7, 0.2, 0.1],
                [0.8, 0.1, 0.1],
                [0.2, 0.7, 0.1],
                [0.1, 0.8, 0.1],
            ],
            dtype=torch.float64,
        )
    )
    yv = torch.tensor([1, 0, 0, 0, 1, 0])
    hb = HistogramBinning(points_per_bin=2, eps=0.0).fit(zv, yv)
    # class 0: bins split at the median 0.65 -> accuracies (0 + 1)/2, (1 + 1)/2; class 1: one bin
    assert hb.values[0, :2].tolist() == [0.5, 1.0] and hb.values[1, 0].item() == 0.5
    assert torch.isnan(hb.values[2, 0]) and hb.params() == {"bins": 3.0, "classes_fitted": 2.0}
    zt = torch.log(torch.tensor([[0.62, 0.28, 0.1], [0.1, 0.15, 0.75]], dtype=torch.float64))
    q = hb.calibrate(zt)
    # row 0: class 0 at 0.62 -> bin 1 -> 0.5; others keep their 0.28 : 0.1 proportions
    torch.testing.assert_close(
        q[0], torch.tensor([0.5, 0.5 * 28 / 38, 0.5 * 10 / 38], dtype=torch.float64)
    )
    # row 1: class 2 was never predicted on validation: unchanged
    torch.testing.assert_close(q[1], torch.tensor([0.1, 0.15, 0.75], dtype=torch.float64))


def test_binary_histogram_matches_netcal_equal_width() -> None:
    from netcal.binning import HistogramBinning as NetcalHB

    rng = np.random.default_rng(0)
    conf = rng.uniform(0, 1, 4000)
    hits = (rng.uniform(0, 1, 4000) < conf**2).astype(np.float64)
    edges, values = fit_histogram(conf, hits, points_per_bin=400, binning="width")  # 10 bins
    ref = NetcalHB(bins=10, equal_intervals=True).fit(conf, hits.astype(int))
    test = rng.uniform(0, 1, 1000)
    ours = values[np.searchsorted(edges, test, side="left")]
    np.testing.assert_allclose(ours, ref.transform(test), atol=1e-12)


# -- isotonic --------------------------------------------------------------------------------


def test_fit_isotonic_hand_derived() -> None:
    # ties at 0.2 average to 0.5 (weight 2); PAV pools it with 0.3 (0, weight 1) -> 1/3; only
    # the ends of each constant run are kept
    x = np.array([0.1, 0.2, 0.2, 0.3, 0.4, 0.5, 0.6])
    t = np.array([0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    xs, ys = fit_isotonic(x, t)
    np.testing.assert_allclose(xs, [0.1, 0.2, 0.3, 0.4, 0.6])
    np.testing.assert_allclose(ys, [0.0, 1 / 3, 1 / 3, 1.0, 1.0])


@pytest.mark.parametrize("k", [2, 5])
def test_isotonic_matches_scikit_learn_and_netcal(k: int) -> None:
    from netcal.binning import IsotonicRegression as NetcalIso
    from sklearn.isotonic import IsotonicRegression

    zv, yv = shifted(1500, k, seed=4)
    zt, _ = shifted(800, k, seed=5)
    ours = IsotonicCalibration(eps=0.0).fit(zv, yv).calibrate(zt).numpy()
    pv, pt = torch.softmax(zv, 1).numpy(), torch.softmax(zt, 1).numpy()
    cols = [
        IsotonicRegression(out_of_bounds="clip").fit(pv[:, c], yv.numpy() == c).predict(pt[:, c])
        for c in range(k)
    ]
    ref = np.stack(cols, 1)
    np.testing.assert_allclose(ours, ref / ref.sum(1, keepdims=True), atol=1e-12)
    if k > 2:  # netcal's multiclass isotonic: one-vs-all sklearn models, renormalised
        theirs = NetcalIso().fit(pv, yv.numpy()).transform(pt)
        np.testing.assert_allclose(ours, theirs, atol=1e-9)


# -- exact zeros and a finite NLL ------------------------------------------------------------


@pytest.mark.parametrize("name", ["hist_binning", "isotonic"])
def test_eps_floor_keeps_the_nll_finite(name: str) -> None:
    # a perfectly separable validation set: the maps output exact 0/1
    g = torch.Generator().manual_seed(6)
    yv = torch.randint(0, 3, (600,), generator=g)
    zv = 6.0 * torch.nn.functional.one_hot(yv, 3).double() + 0.1 * torch.randn(
        600, 3, generator=g, dtype=torch.float64
    )
    yt = torch.randint(0, 3, (300,), generator=g)
    zt = torch.randn(300, 3, generator=g, dtype=torch.float64) * 3  # often wrong and confident
    raw = build_posthoc(name, eps=0.0).fit(zv, yv).calibrate(zt)
    assert (raw == 0).any()
    q = build_posthoc(name).fit(zv, yv).calibrate(zt)  # default ε = 1e-4
    assert float(q.min()) >= 1e-4 / 3 * (1 - 1e-9)
    torch.testing.assert_close(q.sum(1), torch.ones(300, dtype=torch.float64))
    nll = M.calibration_report(probs=q, labels=yt)["nll"]
    assert math.isfinite(nll) and nll <= math.log(3 / 1e-4)
    # the floor is the affine mix (1 − ε) q + ε/K of the raw map
    torch.testing.assert_close(q, (1 - 1e-4) * raw + 1e-4 / 3)


def test_every_method_reports_its_error_in_the_final_evaluation(data) -> None:
    from calibtune.training._final import evaluate_final

    zv, yv, zt, yt = data
    out = evaluate_final(zv.float(), yv, zt.float(), yt, posthoc={n: {} for n in NEW}, n_bins=10)
    for name in NEW:
        p = POSTHOC.build(name).fit(zv.float(), yv).calibrate(zt.float())
        assert out.metrics[K.key("test", "error", name)] == pytest.approx(M.error(p, yt), abs=1e-12)
        assert math.isfinite(out.metrics[K.key("test", "nll", name)])


def test_the_shipped_comparison_study_names_every_registered_method() -> None:
    from pathlib import Path

    from calibtune.study import load_study

    study = load_study(Path(__file__).parents[1] / "studies" / "posthoc_all.yaml")
    assert sorted(study.trial["eval"]["posthoc"]) == list_posthoc()
