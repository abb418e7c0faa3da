"""Focal calibration map and focal temperature scaling (Komisarenko & Kull 2024)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from calibtune import metrics as M
from calibtune.posthoc import (
    DEFAULT_FOCAL_TEMPERATURES,
    DEFAULT_GAMMAS,
    FocalTemperatureScaling,
    TemperatureScaling,
    focal_calibration_map,
)
from calibtune.posthoc._temperature import ts_probs


def eq1_reference(q: torch.Tensor, gamma: float) -> torch.Tensor:
    """Eq. (1) of the paper written literally, in float64 (fine away from q_j ∈ {0, 1})."""
    q = q.double()
    inv = 1 / ((1 - q) ** gamma * (gamma * torch.log(q) / (1 - q) - 1 / q))
    return inv / inv.sum(-1, keepdim=True)


def prop2_binary(q: float, gamma: float) -> float:
    """Prop. 2 (binary closed form) at the positive-class probability q, as 1 / (1 + e^a)."""
    ratio = ((1 - q) - gamma * q * math.log(q)) / (q - gamma * (1 - q) * math.log1p(-q))
    a = gamma * math.log((1 - q) / q) + math.log(ratio)
    return 1 / (1 + math.exp(a)) if a < 0 else math.exp(-a) / (1 + math.exp(-a))


def random_probs(n: int, k: int, seed: int, scale: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(n, k, generator=g, dtype=torch.float64) * scale, 1)


GAMMAS = [*DEFAULT_GAMMAS, -0.9, 2.0, 20.0]

# -- the map ----------------------------------------------------------------------------------


@pytest.mark.parametrize("gamma", GAMMAS)
def test_map_equals_equation_1(gamma: float) -> None:
    q = random_probs(500, 7, seed=0)
    torch.testing.assert_close(focal_calibration_map(q, gamma), eq1_reference(q, gamma))
    # float32: within float32 accuracy of the float64 reference
    out32 = focal_calibration_map(q.float(), gamma)
    assert out32.dtype == torch.float32
    torch.testing.assert_close(out32.double(), eq1_reference(q, gamma), atol=2e-6, rtol=0)


@pytest.mark.parametrize("gamma", [-0.5, 0.05, 1.0, 3.0])
def test_map_binary_case_equals_proposition_2(gamma: float) -> None:
    qs = [0.01, 0.2, 0.5, 0.73, 0.999]
    out = focal_calibration_map(torch.tensor([[q, 1 - q] for q in qs], dtype=torch.float64), gamma)
    for q, row in zip(qs, out.tolist(), strict=True):
        assert row[0] == pytest.approx(prop2_binary(q, gamma), abs=1e-12)


def test_map_is_the_identity_at_gamma_zero() -> None:
    q = random_probs(100, 5, seed=1).float()
    assert torch.equal(focal_calibration_map(q, 0.0), q)
    batched = focal_calibration_map(q, torch.tensor([0.0, 1.0, 0.0]))
    assert torch.equal(batched[0], q) and torch.equal(batched[2], q)
    assert not torch.equal(batched[1], q)


def test_map_keeps_argmax_and_raises_confident_rows() -> None:
    # The argmax never moves (any γ > −1) — for Eq. (1) itself (float64 reference, no exact
    # ties) and for the implementation; for γ > 0 the top probability rises when q_top ≥ 1/2
    # (Prop. 5 for confident rows).
    q = torch.cat([random_probs(400, 10, seed=2, scale=s) for s in (0.1, 1.0, 4.0)])
    for gamma in GAMMAS:
        assert torch.equal(eq1_reference(q, gamma).argmax(1), q.argmax(1)), gamma
    # exact ties (each row repeated), where the first maximum must stay the first maximum
    q = torch.cat([q, random_probs(200, 2, seed=3).repeat(1, 5) / 5])
    confident = q.amax(1) >= 0.5
    assert 100 < int(confident.sum()) < len(q)
    for gamma in GAMMAS:
        p = focal_calibration_map(q, gamma)
        assert torch.equal(p.argmax(1), q.argmax(1)), gamma
        if gamma > 0:
            assert bool((p.amax(1) >= q.amax(1) - 1e-12)[confident].all()), gamma


def test_map_lowers_low_confidence_rows_as_equation_1_says() -> None:
    # K = 10, q = (0.12, 0.88/9, …): with γ = 1, 1/|ℓ'(q)| where ℓ'(q) = (1−q)(log q/(1−q) − 1/q)
    #   q = 0.12:      0.88 (−2.1203/0.88 − 8.3333)   = −9.4536  -> w = 0.105780
    #   q = 0.097778:  0.902222 (−2.3250/0.902222 − 10.2273) = −11.5522 -> w = 0.086564
    #   p̂_top = 0.105780 / (0.105780 + 9 · 0.086564) = 0.11954 < 0.12
    q = torch.tensor([[0.12] + [0.88 / 9] * 9], dtype=torch.float64)
    p = focal_calibration_map(q, 1.0)
    assert float(p[0, 0]) == pytest.approx(0.11954, abs=2e-5)
    torch.testing.assert_close(p, eq1_reference(q, 1.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("gamma", [-0.99, -0.5, 0.05, 1.0, 5.0, 50.0])
def test_map_is_stable_on_saturated_rows(gamma: float, dtype: torch.dtype) -> None:
    rows = torch.tensor(
        [
            [1 - 1e-8, 1e-8],  # q → 1 (in float32 the first entry rounds to exactly 1)
            [1.0, 0.0],  # one-hot
            [0.0, 1.0],
            [0.5, 0.5],
        ],
        dtype=torch.float64,
    )
    out = focal_calibration_map(rows.to(dtype), gamma)
    assert torch.isfinite(out).all() and (out >= 0).all()
    torch.testing.assert_close(out.sum(1), torch.ones(4, dtype=dtype))
    # one-hot rows are fixed points (the limit of the map), [.5, .5] stays uniform
    torch.testing.assert_close(out[1:], rows[1:].to(dtype))
    # [1 − 1e-8, 1e-8]: the map uses 1 − q_top = 1e-8 even where q_top rounded to 1;
    # compare with the binary closed form (in the binary case p̂(1 − q) = 1 − p̂(q), so the
    # small class is Prop. 2 at q = 1e-8, computed without cancellation)
    expected_small = prop2_binary(1e-8, gamma)
    small = float(out[0, 1])
    if expected_small > torch.finfo(dtype).tiny:
        assert small == pytest.approx(expected_small, rel=1e-4)
    else:
        assert small < 2 * torch.finfo(dtype).tiny

    # many classes, q_j → 0 (denormal and zero entries) next to q_top → 1
    tiny = torch.finfo(dtype).tiny
    k10 = torch.zeros(3, 10, dtype=dtype)
    k10[0, 0], k10[0, 1], k10[0, 2] = 1.0, tiny / 4, 1e-30
    k10[1, 3], k10[1, 4:] = 1 - 6e-7, 1e-7
    k10[2] = 0.1
    out = focal_calibration_map(k10, gamma)
    assert torch.isfinite(out).all()
    assert torch.equal(out.argmax(1), k10.argmax(1))
    torch.testing.assert_close(out[2], k10[2])


def test_map_batched_shapes() -> None:
    q = random_probs(50, 4, seed=4)
    gam = torch.tensor([-0.25, 0.5, 5.0], dtype=torch.float64)
    out = focal_calibration_map(q, gam)  # (N, K) with (G,) -> one map per γ
    assert out.shape == (3, 50, 4)
    for i, g in enumerate(gam.tolist()):
        torch.testing.assert_close(out[i], focal_calibration_map(q, g), atol=1e-15, rtol=0)
    q3 = torch.stack([q, random_probs(50, 4, seed=5), q])  # (G, N, K) with (G,) -> per slice
    out3 = focal_calibration_map(q3, gam)
    for i, g in enumerate(gam.tolist()):
        torch.testing.assert_close(out3[i], focal_calibration_map(q3[i], g), atol=1e-15, rtol=0)
    assert focal_calibration_map(q3, 1.0).shape == (3, 50, 4)


def test_map_rejects_bad_input() -> None:
    q = random_probs(10, 3, seed=6)
    with pytest.raises(ValueError, match=r"gamma: expected finite values > -1.*got -1.0"):
        focal_calibration_map(q, -1.0)
    with pytest.raises(ValueError, match=r"gamma: expected finite values > -1"):
        focal_calibration_map(q, float("nan"))
    with pytest.raises(ValueError, match=r"gamma: expected a scalar or a 1-D \(G,\) array"):
        focal_calibration_map(q, torch.ones(2, 2))
    with pytest.raises(ValueError, match=r"gamma: expected 2 values \(one per slice"):
        focal_calibration_map(torch.stack([q, q]), torch.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match=r"probs: expected rows summing to 1"):
        focal_calibration_map(q * 0.5, 1.0)
    with pytest.raises(ValueError, match=r"probs: expected a 2-D \(N, K\) or 3-D \(G, N, K\)"):
        focal_calibration_map(q[0], 1.0)
    bad = q.clone()
    bad[2, 1] = float("nan")
    with pytest.raises(ValueError, match=r"probs: expected finite values"):
        focal_calibration_map(bad, 1.0)


# -- focal temperature scaling ---------------------------------------------------------------


def test_default_grids_are_the_seeds() -> None:
    assert DEFAULT_GAMMAS == (-0.5, -0.25, 0.05, 0.25, 0.37, 0.5, 0.75, 1.0, 5.0)
    assert len(DEFAULT_FOCAL_TEMPERATURES) == 500
    assert tuple(k / 100 for k in range(1, 501)) == DEFAULT_FOCAL_TEMPERATURES
    assert DEFAULT_FOCAL_TEMPERATURES[2] == 0.03 and DEFAULT_FOCAL_TEMPERATURES[-1] == 5.0
    f = FocalTemperatureScaling()
    assert f.gammas == DEFAULT_GAMMAS and f.temperatures == DEFAULT_FOCAL_TEMPERATURES


def _data(n: int, k: int, seed: int, t_true: float = 2.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g) * 3
    y = torch.multinomial(torch.softmax(z.double() / t_true, 1), 1, generator=g).squeeze(1)
    return z, y


TEMPS = (0.3, 0.7, 1.0, 1.45, 2.0, 2.6, 4.0)


@pytest.mark.parametrize("criterion, metric", [("adaece", M.adaece), ("ece", M.ece)])
def test_grid_criterion_equals_metrics_of_calibrate(criterion, metric) -> None:
    # The vectorised (γ, T) search must score each grid point exactly as `metrics` scores the
    # probabilities that calibrate() returns for that point.
    z, y = _data(800, 10, seed=0)
    fts = FocalTemperatureScaling(criterion=criterion, temperatures=TEMPS).fit(z, y)
    assert fts.curve.shape == (9, len(TEMPS))
    for gi, g in enumerate(DEFAULT_GAMMAS):
        for ti, t in enumerate(TEMPS):
            one = FocalTemperatureScaling(gammas=[g], temperatures=[t]).fit(z, y)
            p = one.calibrate(z)
            assert float(fts.curve[gi, ti]) == pytest.approx(metric(p, y), abs=1e-6), (g, t)
            # calibrate() is the paper's composition focal_map(softmax(z / T), γ)
            ref = focal_calibration_map(torch.softmax(z.double() / t, 1), g)
            torch.testing.assert_close(p.double(), ref, atol=2e-6, rtol=0)
    best = int(torch.argmin(fts.curve.T.reshape(-1)))
    assert (fts.T, fts.gamma_ev) == (TEMPS[best // 9], DEFAULT_GAMMAS[best % 9])
    assert fts.criterion_value == pytest.approx(metric(fts.calibrate(z), y), abs=1e-6)


def test_nll_criterion_equals_metrics_nll() -> None:
    z, y = _data(800, 10, seed=1)
    fts = FocalTemperatureScaling(criterion="nll", temperatures=TEMPS).fit(z, y)
    for gi, g in enumerate(DEFAULT_GAMMAS):
        for ti, t in enumerate(TEMPS):
            p = focal_calibration_map(ts_probs(z.double(), t), g)
            assert float(fts.curve[gi, ti]) == pytest.approx(M.nll(p, y), rel=1e-5), (g, t)


def test_nll_criterion_recovers_planted_gamma_and_temperature() -> None:
    g = torch.Generator().manual_seed(2)
    z = torch.randn(50000, 4, generator=g, dtype=torch.float64) * 2
    # T within ±0.1 of each planted value (step 0.05), all nine γ of the seed's grid
    temps = [round(t + d, 2) for t in (0.5, 1.0, 2.0) for d in (-0.1, -0.05, 0.0, 0.05, 0.1)]
    for gamma_true, t_true in [(1.0, 2.0), (-0.5, 0.5), (5.0, 1.0)]:
        p_true = focal_calibration_map(torch.softmax(z / t_true, 1), gamma_true)
        y = torch.multinomial(p_true, 1, generator=g).squeeze(1)
        fts = FocalTemperatureScaling(criterion="nll", temperatures=temps).fit(z.float(), y)
        assert fts.gamma_ev == gamma_true
        assert abs(fts.T - t_true) <= 0.051


def test_gamma_zero_reduces_to_temperature_scaling() -> None:
    z, y = _data(1000, 10, seed=3)
    fts = FocalTemperatureScaling(
        criterion="ece", gammas=[0.0], temperatures=TemperatureScaling().temperatures
    ).fit(z, y)
    ts = TemperatureScaling().fit(z, y)
    assert fts.T == ts.T and fts.gamma_ev == 0.0
    torch.testing.assert_close(fts.curve[0], ts.curve, atol=1e-12, rtol=0)
    assert torch.equal(fts.calibrate(z), ts.calibrate(z))


def test_ties_go_to_smallest_temperature_then_smallest_gamma() -> None:
    # every (γ, T) gives the uniform distribution; float64 so that it is uniform to the last bit
    # in every candidate (float32 rounding of the map differs by an ulp between γ's)
    z = torch.zeros(40, 3, dtype=torch.float64)
    y = torch.arange(40) % 3
    fts = FocalTemperatureScaling(gammas=[1.0, -0.25, 0.5], temperatures=[2.0, 0.5, 1.0])
    fts.fit(z, y)
    assert (fts.T, fts.gamma_ev) == (0.5, -0.25)
    assert fts.gammas == (-0.25, 0.5, 1.0) and fts.temperatures == (0.5, 1.0, 2.0)


def test_default_grid_fit_improves_calibration_and_keeps_argmax() -> None:
    z, y = _data(2000, 10, seed=4)
    zt, yt = _data(2000, 10, seed=5)
    fts = FocalTemperatureScaling().fit(z, y)
    assert fts.gamma_ev in DEFAULT_GAMMAS and fts.T in DEFAULT_FOCAL_TEMPERATURES
    assert fts.curve.shape == (9, 500) and bool(torch.isfinite(fts.curve).all())
    p = fts.calibrate(zt)
    assert torch.equal(p.argmax(1), zt.argmax(1))
    assert M.adaece(p, yt) < M.adaece(torch.softmax(zt, 1), yt) / 3
    assert set(fts.params()) == {"T", "gamma_ev"}


def test_saturated_logits_give_finite_probabilities() -> None:
    z = torch.tensor([[80.0, 0.0, -10.0], [0.0, 0.0, 0.0], [-50.0, 60.0, 59.0]])
    y = torch.tensor([0, 1, 1])
    fts = FocalTemperatureScaling(gammas=[-0.5, 5.0], temperatures=[0.01, 1.0]).fit(z, y)
    for g in (-0.5, 5.0):
        for t in (0.01, 1.0):
            one = FocalTemperatureScaling(gammas=[g], temperatures=[t]).fit(z, y)
            p = one.calibrate(z)
            assert torch.isfinite(p).all() and torch.equal(p.argmax(1), z.argmax(1))
    assert bool(torch.isfinite(fts.curve).all())


def test_constructor_validation() -> None:
    with pytest.raises(ValueError, match=r"FocalTemperatureScaling: criterion: expected one of"):
        FocalTemperatureScaling(criterion="brier")
    with pytest.raises(ValueError, match=r"gammas: expected a float list in \(-1, inf\)"):
        FocalTemperatureScaling(gammas=[0.5, -2.0])
    with pytest.raises(ValueError, match=r"temperatures: expected a float list in \(0, inf\)"):
        FocalTemperatureScaling(temperatures=[-1.0])
    with pytest.raises(ValueError, match=r"n_bins: expected an integer in \[1, inf\)"):
        FocalTemperatureScaling(n_bins=0)
    assert np.isnan(FocalTemperatureScaling().T)
