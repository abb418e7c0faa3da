"""Losses: registry contract (generated from `list_losses()`), reference values, error paths.

References are written independently of the fused implementation: plain autograd over the
formula (float64, moderate logits where it is accurate) or hand-derived numbers in comments.
"""

from __future__ import annotations

import io
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as TF

import calibtune.losses.functional as F_cal
from calibtune import losses
from calibtune._registry import Param, Registry
from calibtune.losses import LOSSES, CalibrationLoss, build_loss, flsd_from_p0, list_losses

ALL = list_losses()
# the adaptive losses, from the registry (each class declares ``adaptive``)
ADAPTIVE = {e.name for e in LOSSES if getattr(e.factory, "adaptive", False)}
DOCS = Path(__file__).resolve().parents[1] / "docs" / "losses.md"


def _with_state(loss: CalibrationLoss) -> CalibrationLoss:
    """Give an adaptive loss non-trivial state: one real update, then γ of both signs."""
    if loss.adaptive:
        g = torch.Generator().manual_seed(0)
        probs = torch.softmax(3 * torch.randn(200, 5, generator=g), dim=1)
        loss.update(probs, torch.randint(0, 5, (200,), generator=g))
        n = loss.gammas.numel()
        signs = torch.where(torch.arange(n) % 3 == 0, -1.0, 1.0).to(torch.float64)
        if loss.name != "calfocal":  # CalFocal's γ = exp(·) is always positive
            loss.gammas.mul_(signs)
        loss.gammas.add_(torch.linspace(0, 0.5, n, dtype=torch.float64) * torch.sign(loss.gammas))
    return loss


def _logits(b: int = 16, k: int = 5, scale: float = 2.0, seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(b, k, generator=g)).to(dtype), torch.randint(
        0, k, (b,), generator=g
    )


def _grad(fn, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    z = z.detach().clone().requires_grad_(True)
    out = fn(z)
    (g,) = torch.autograd.grad(out.sum(), z)
    return out.detach(), g


# -- contract, generated from the registry ------------------------------------------------


@pytest.mark.parametrize("name", ALL)
class TestLossContract:
    def test_registry_entry_declares_valid_defaults(self, name: str) -> None:
        entry = LOSSES.get(name)
        assert entry.summary
        for p in entry.params:
            assert isinstance(p, Param) and p.doc
            assert p.validate(p.default, name) == p.validate(p.validate(p.default, name), name)
        loss = build_loss(name)
        assert isinstance(loss, CalibrationLoss) and loss.name == name
        assert loss.hparams == entry.defaults() | {
            p.name: tuple(p.default) for p in entry.params if p.kind == "float_list"
        }
        assert isinstance(loss.adaptive, bool) and loss.adaptive == (name in ADAPTIVE)
        # an adaptive loss exposes the update API; a plain one does not
        assert hasattr(loss, "update") == loss.adaptive

    @pytest.mark.parametrize("scale", [2.0, 50.0])
    def test_finite_loss_and_gradient(self, name: str, scale: float) -> None:
        loss = _with_state(build_loss(name))
        z, y = _logits(64, 7, scale=scale, seed=1)
        if scale == 50.0:
            # ±50 logits: rows 0-31 have one +50 entry, rows 32-63 several; half the targets
            # are the +50 class, so p_y rounds to exactly 1 (and elsewhere to 0) in float32
            top = z.argmax(1)
            z = torch.where(z > 0, 50.0, -50.0)
            z[:32] = -50.0
            z[torch.arange(64), top] = 50.0
            y[::2] = top[::2]
        out, g = _grad(lambda t: loss(t, y), z)
        assert torch.isfinite(out).all() and torch.isfinite(g).all()

    def test_sum_is_mean_times_batch_and_none_is_per_sample(self, name: str) -> None:
        z, y = _logits(16, 5, seed=2)
        mean = _with_state(build_loss(name))(z, y)
        total = _with_state(build_loss(name, reduction="sum"))(z, y)
        per = _with_state(build_loss(name, reduction="none"))(z, y)
        assert mean.shape == () and total.shape == () and per.shape == (16,)
        torch.testing.assert_close(total, mean * 16, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(per.mean(), mean, rtol=1e-5, atol=1e-6)

    @pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
    def test_gradient_matches_reduction(self, name: str, reduction: str) -> None:
        # reference: Σ_i w_i ∂ℓ_i/∂z from one backward pass per sample of the "none" output
        # (one-hot upstream gradients); "sum" has w = 1, "mean" w = 1/B, "none" random w.
        z, y = _logits(8, 4, seed=3, dtype=torch.float64)
        zr = z.clone().requires_grad_(True)
        per = _with_state(build_loss(name, reduction="none"))(zr, y)
        rows = [torch.autograd.grad(per[i], zr, retain_graph=True)[0] for i in range(8)]
        w = {
            "mean": torch.full((8,), 1 / 8, dtype=torch.float64),
            "sum": torch.ones(8, dtype=torch.float64),
            "none": torch.linspace(-1.0, 2.0, 8, dtype=torch.float64),
        }[reduction]
        expected = sum(wi * r for wi, r in zip(w, rows, strict=True))
        zg = z.clone().requires_grad_(True)
        out = _with_state(build_loss(name, reduction=reduction))(zg, y)
        upstream = w if reduction == "none" else torch.ones((), dtype=torch.float64)
        (g,) = torch.autograd.grad(out, zg, grad_outputs=upstream)
        assert expected.abs().sum() > 0
        torch.testing.assert_close(g, expected, rtol=1e-10, atol=1e-12)

    def test_batch_size_one(self, name: str) -> None:
        z, y = _logits(1, 3, seed=4)
        out, g = _grad(lambda t: _with_state(build_loss(name))(t, y), z)
        assert out.shape == () and torch.isfinite(out) and torch.isfinite(g).all()

    def test_gradient_reaches_logits(self, name: str) -> None:
        z, y = _logits(16, 5, seed=5)
        _, g = _grad(lambda t: _with_state(build_loss(name))(t, y), z)
        assert g.abs().sum() > 0

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
    def test_dtype_and_device_preserved(self, name: str, dtype: torch.dtype) -> None:
        z, y = _logits(16, 5, seed=6, dtype=dtype)
        z.requires_grad_(True)
        out = _with_state(build_loss(name))(z, y)
        out.backward()
        assert out.dtype == dtype and out.device == z.device
        assert z.grad is not None and z.grad.dtype == dtype and torch.isfinite(z.grad).all()
        # device: on the "meta" device any tensor the loss created on the CPU would raise
        # (a device mismatch), so this checks device handling without a GPU
        loss = _with_state(build_loss(name)).to("meta")
        zm = torch.empty(16, 5, dtype=dtype, device="meta", requires_grad=True)
        out = loss(zm, y.to("meta"))
        out.backward()
        assert out.device.type == "meta" and out.dtype == dtype
        assert zm.grad is not None and zm.grad.device.type == "meta" and zm.grad.dtype == dtype

    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
    def test_cuda(self, name: str) -> None:
        z, y = _logits(32, 5, seed=7)
        loss = _with_state(build_loss(name))
        cpu = loss(z, y)
        loss = loss.to("cuda")
        zc = z.cuda().requires_grad_(True)
        out = loss(zc, y.cuda())
        out.backward()
        assert out.device.type == "cuda" and zc.grad is not None
        torch.testing.assert_close(out.cpu(), cpu, rtol=1e-4, atol=1e-5)

    def test_state_dict_loads_with_weights_only(self, name: str) -> None:
        loss = _with_state(build_loss(name))
        buf = io.BytesIO()
        torch.save(loss.state_dict(), buf)
        buf.seek(0)
        state = torch.load(buf, weights_only=True)
        fresh = build_loss(name)
        fresh.load_state_dict(state)
        z, y = _logits(16, 5, seed=8)
        torch.testing.assert_close(fresh(z, y), loss(z, y), rtol=0, atol=0)

    def test_rejects_bad_reduction(self, name: str) -> None:
        with pytest.raises(ValueError, match=r"reduction: expected one of 'mean', 'sum', 'none'"):
            build_loss(name, reduction="avg")

    def test_documented(self, name: str) -> None:
        rows = [r for r in DOCS.read_text().splitlines() if r.startswith(f"| `{name}` |")]
        assert len(rows) == 1, f"docs/losses.md needs one table row for {name}"
        for p in LOSSES.get(name).params:
            assert f"`{p.name}`" in rows[0], f"docs/losses.md row {name} misses {p.name}"


def test_docs_list_nothing_unregistered() -> None:
    names = re.findall(r"^\| `([a-z_]+)` \|", DOCS.read_text(), flags=re.M)
    assert sorted(names) == ALL


def test_registry_is_the_shared_registry_type() -> None:
    assert isinstance(LOSSES, Registry) and LOSSES.names() == ALL
    assert set(ALL) == {
        "cross_entropy",
        "focal",
        "inverse_focal",
        "flsd",
        "calfocal",
        "adafocal",
        "dual_focal",
        "adadual_focal",
        "fcl",
        "brier",
        "label_smoothing",
        "mmce",
        # issue 14
        "mbls",
        "logitnorm",
        "mdca",
        "dca",
        # issue 23
        "regmixup",
        "rankmixup",
        "rankmixup_mrl",
    }


# -- independent references ---------------------------------------------------------------


def _ref_focal(z: torch.Tensor, y: torch.Tensor, gamma: torch.Tensor | float) -> torch.Tensor:
    lp = torch.log_softmax(z, 1).gather(1, y[:, None]).squeeze(1)
    return -((1 - lp.exp()) ** gamma) * lp


def _ref_inverse(z: torch.Tensor, y: torch.Tensor, gamma: float) -> torch.Tensor:
    lp = torch.log_softmax(z, 1).gather(1, y[:, None]).squeeze(1)
    return -((1 + lp.exp()) ** gamma) * lp


def _ref_dual(z: torch.Tensor, y: torch.Tensor, gamma: float) -> torch.Tensor:
    p = torch.softmax(z, 1)
    p_y = p.gather(1, y[:, None])
    p_j = torch.where(p < p_y, p, torch.zeros_like(p)).max(1).values
    return -((1 - p_y.squeeze(1) + p_j) ** gamma) * torch.log(p_y.squeeze(1))


def _ref_brier(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((torch.softmax(z, 1) - TF.one_hot(y, z.shape[1]).to(z.dtype)) ** 2).sum(1)


def _close_with_grads(fn, ref, z: torch.Tensor, atol: float = 1e-10) -> None:
    v, g = _grad(fn, z)
    rv, rg = _grad(ref, z)
    torch.testing.assert_close(v, rv, rtol=1e-9, atol=atol)
    torch.testing.assert_close(g, rg, rtol=1e-7, atol=atol)


@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0, 2.0, 3.0, 7.5])
def test_focal_and_inverse_match_the_formula(gamma: float) -> None:
    z, y = _logits(32, 6, seed=10, dtype=torch.float64)
    _close_with_grads(
        lambda t: F_cal.focal_loss(t, y, gamma, "none"), lambda t: _ref_focal(t, y, gamma), z
    )
    _close_with_grads(
        lambda t: F_cal.inverse_focal_loss(t, y, gamma, "none"),
        lambda t: _ref_inverse(t, y, gamma),
        z,
    )


@pytest.mark.parametrize("fn", ["focal_loss", "inverse_focal_loss", "dual_focal_loss"])
def test_gamma_zero_is_cross_entropy(fn: str) -> None:
    z, y = _logits(32, 6, seed=11, dtype=torch.float64)
    _close_with_grads(
        lambda t: getattr(F_cal, fn)(t, y, 0.0), lambda t: TF.cross_entropy(t, y), z, atol=1e-12
    )


def test_focal_gradient_is_finite_and_exact_when_p_y_rounds_to_one() -> None:
    # p_y = 1 − ~1e-43 is exactly 1.0 in float32; the true gradient is ~0. Autograd through
    # (1 − p)^0.5 would give inf·0 = NaN here.
    z = torch.tensor([[50.0, -50.0, -50.0]], requires_grad=True)
    y = torch.tensor([0])
    for fn in (F_cal.focal_loss, F_cal.dual_focal_loss):
        out = fn(z, y, 0.5)
        (g,) = torch.autograd.grad(out, z)
        assert out == 0 and torch.equal(g, torch.zeros_like(g))


@pytest.mark.parametrize(
    ("p", "label", "p_j"),
    [
        ([0.5, 0.3, 0.2], 0, 0.3),  # ground truth is the max: p_j = second largest
        ([0.5, 0.3, 0.2], 1, 0.2),  # ground truth in the middle: next one below it
        ([0.5, 0.3, 0.2], 2, 0.0),  # ground truth is the min: p_j = 0, plain focal
        ([0.4, 0.4, 0.2], 0, 0.2),  # tie with p_y is excluded: the 0.2 below it
        ([0.4, 0.2, 0.4], 2, 0.2),
    ],
)
def test_dual_focal_hand_computed(p: list[float], label: int, p_j: float) -> None:
    # ℓ = −(1 − p_y + p_j)^2 log p_y, e.g. case 1: −(1 − 0.5 + 0.3)² log 0.5 = 0.64·0.693147
    z = torch.log(torch.tensor([p], dtype=torch.float64))
    y = torch.tensor([label])
    p_y = p[label]
    expected = -((1 - p_y + p_j) ** 2) * math.log(p_y)
    assert F_cal.dual_focal_loss(z, y, 2.0).item() == pytest.approx(expected, rel=1e-12)
    if p_j == 0.0:
        assert F_cal.dual_focal_loss(z, y, 2.0).item() == pytest.approx(
            F_cal.focal_loss(z, y, 2.0).item(), rel=1e-12
        )


def test_dual_focal_hand_values_spelled_out() -> None:
    z = torch.log(torch.tensor([[0.5, 0.3, 0.2]] * 3, dtype=torch.float64))
    out = F_cal.dual_focal_loss(z, torch.tensor([0, 1, 2]), 2.0, "none")
    # 0.8²·ln 2 = 0.443614;  0.9²·(−ln 0.3) = 0.975218;  0.8²·(−ln 0.2) = 1.030040
    torch.testing.assert_close(
        out, torch.tensor([0.443614, 0.975218, 1.030040], dtype=out.dtype), atol=1e-6, rtol=0
    )


@pytest.mark.parametrize("k", [6, 300])  # 300: the two-level p_j search (K ≥ 4 chunks)
@pytest.mark.parametrize("gamma", [0.5, 2.0, 5.0])
def test_dual_focal_matches_the_formula_with_gradients(gamma: float, k: int) -> None:
    z, y = _logits(32, k, seed=12, dtype=torch.float64)
    _close_with_grads(
        lambda t: F_cal.dual_focal_loss(t, y, gamma, "none"), lambda t: _ref_dual(t, y, gamma), z
    )


def test_fcl_is_focal_plus_lambda_brier() -> None:
    z, y = _logits(32, 6, seed=13, dtype=torch.float64)
    _close_with_grads(
        lambda t: F_cal.fcl_loss(t, y, 3.0, 1.5, "none"),
        lambda t: F_cal.focal_loss(t, y, 3.0, "none") + 1.5 * F_cal.brier_loss(t, y, "none"),
        z,
    )
    _close_with_grads(lambda t: F_cal.brier_loss(t, y, "none"), lambda t: _ref_brier(t, y), z)


def test_brier_hand_computed() -> None:
    # p = (0.7, 0.2, 0.1), y = 0: (0.3)² + 0.2² + 0.1² = 0.14
    z = torch.log(torch.tensor([[0.7, 0.2, 0.1]], dtype=torch.float64))
    assert F_cal.brier_loss(z, torch.tensor([0])).item() == pytest.approx(0.14, rel=1e-12)


def test_label_smoothing() -> None:
    z, y = _logits(32, 6, seed=14, dtype=torch.float64)
    _close_with_grads(
        lambda t: F_cal.label_smoothing_loss(t, y, 0.0), lambda t: TF.cross_entropy(t, y), z
    )

    # (1 − α) on y, α/(K − 1) on the 5 others
    def ref(t: torch.Tensor) -> torch.Tensor:
        s = torch.full_like(t, 0.1 / 5).scatter(1, y[:, None], 0.9)
        return -(s * torch.log_softmax(t, 1)).sum(1).mean()

    _close_with_grads(lambda t: F_cal.label_smoothing_loss(t, y, 0.1), ref, z)
    # the fused kernel against torch's own smoothing (ε = αK/(K − 1)), per sample
    _close_with_grads(
        lambda t: F_cal.label_smoothing_loss(t, y, 0.25, "none"),
        lambda t: TF.cross_entropy(t, y, reduction="none", label_smoothing=0.25 * 6 / 5),
        z,
    )
    # at α = (K − 1)/K the target is uniform
    uniform = F_cal.label_smoothing_loss(z, y, 5 / 6)
    assert uniform.item() == pytest.approx(-torch.log_softmax(z, 1).mean(1).mean().item())


def test_flsd_default_is_fsld53_around_the_threshold() -> None:
    # p_y = 0.19 < 0.2 uses γ = 5, p_y = 0.21 uses γ = 3 (two classes: logits (log p, log(1−p)))
    z = torch.log(torch.tensor([[0.19, 0.81], [0.21, 0.79]], dtype=torch.float64))
    y = torch.tensor([0, 0])
    out = build_loss("flsd", reduction="none")(z, y)
    expected = [-(0.81**5) * math.log(0.19), -(0.79**3) * math.log(0.21)]
    assert out.tolist() == pytest.approx(expected, rel=1e-12)


def test_flsd_schedule_and_no_gradient_through_gamma() -> None:
    z, y = _logits(64, 5, scale=1.5, seed=15, dtype=torch.float64)
    gammas, thresholds = (6.0, 4.0, 1.0), (0.25, 0.6)
    p_y = torch.softmax(z, 1).gather(1, y[:, None]).squeeze(1)
    g = torch.tensor(gammas, dtype=torch.float64)[(p_y >= 0.25).long() + (p_y >= 0.6).long()]
    assert len(set(g.tolist())) == 3  # the data exercises all three bins
    _close_with_grads(
        lambda t: F_cal.flsd_loss(t, y, gammas, thresholds, "none"),
        lambda t: _ref_focal(t, y, g),  # γ a constant: no gradient through the choice
        z,
    )


def test_lambert_w_gamma_star() -> None:
    # Mukhoti et al. Prop. 2: γ*(0.2) ≈ 4.85 (FLSD's 5), γ*(0.25) ≈ 3.07 (FLSD's 3)
    assert flsd_from_p0(0.2) == pytest.approx(4.8506, abs=1e-4)
    assert flsd_from_p0(0.25) == pytest.approx(3.0702, abs=1e-4)
    assert flsd_from_p0((0.2, 0.25)) == pytest.approx((4.8506, 3.0702), abs=1e-4)
    assert F_cal.flsd_from_p0(0.5) == 0.0 and flsd_from_p0(0.9) == 0.0
    # γ* is decreasing in p0, and g(p0, γ*) = 1 at the threshold (the defining equality)
    for p0 in (0.05, 0.1, 0.2, 0.3, 0.45):
        gs = flsd_from_p0(p0)
        g_fn = (1 - p0) ** gs - gs * p0 * (1 - p0) ** (gs - 1) * math.log(p0)
        assert g_fn == pytest.approx(1.0, abs=1e-9)
    assert flsd_from_p0(0.1) > flsd_from_p0(0.2) > flsd_from_p0(0.3)
    with pytest.raises(ValueError, match=r"p0: expected a number in \(0, 1\), got 0"):
        flsd_from_p0(0)


def _ref_mmce(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Pairwise sums of Kumar et al.'s weighted MMCE, written out with Python loops."""
    p = torch.softmax(z, 1)
    r, pred = p.max(1)
    c = [i for i in range(len(y)) if pred[i] == y[i]]
    w = [i for i in range(len(y)) if pred[i] != y[i]]
    m, n = len(c), len(w)
    if m == 0 or n == 0:
        return z.sum() * 0

    def k(i: int, j: int) -> torch.Tensor:
        return torch.exp(-(r[i] - r[j]).abs() / 0.4)

    cc = sum((1 - r[i]) * (1 - r[j]) * k(i, j) for i in c for j in c) / m**2
    ww = sum(r[i] * r[j] * k(i, j) for i in w for j in w) / n**2
    cw = sum((1 - r[i]) * r[j] * k(i, j) for i in c for j in w) / (m * n)
    return torch.sqrt(cc + ww - 2 * cw)


def test_mmce_matches_pairwise_formula() -> None:
    z, y = _logits(12, 4, seed=16, dtype=torch.float64)
    _close_with_grads(lambda t: F_cal.mmce_weighted(t, y), lambda t: _ref_mmce(t, y), z)
    _close_with_grads(
        lambda t: F_cal.mmce_loss(t, y, 2.0),
        lambda t: TF.cross_entropy(t, y) + 2.0 * _ref_mmce(t, y),
        z,
    )


def _ref_mmce_seed(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The seed code's MMCE_weighted (focal_calibration ``Losses/mmce.py``) written out: each
    kernel sum is a *mean* over its pairs, then divided again by m², n², mn (guards omitted)."""
    p = torch.softmax(z, 1)
    r, pred = p.max(1)
    c = [i for i in range(len(y)) if pred[i] == y[i]]
    w = [i for i in range(len(y)) if pred[i] != y[i]]
    m, n = len(c), len(w)

    def k(i: int, j: int) -> torch.Tensor:
        return torch.exp(-(r[i] - r[j]).abs() / 0.4)

    cc = sum((1 - r[i]) * (1 - r[j]) * k(i, j) for i in c for j in c) / (m * m)
    ww = sum(r[i] * r[j] * k(i, j) for i in w for j in w) / (n * n)
    cw = sum((1 - r[i]) * r[j] * k(i, j) for i in c for j in w) / (m * n)
    return torch.sqrt(cc / m**2 + ww / n**2 - 2 * cw / (m * n))


def test_mmce_focal_calibration_normalization_matches_the_seed_code() -> None:
    z, y = _logits(12, 4, seed=16, dtype=torch.float64)
    _close_with_grads(
        lambda t: F_cal.mmce_weighted(t, y, normalization="focal_calibration"),
        lambda t: _ref_mmce_seed(t, y),
        z,
    )
    loss = build_loss("mmce", lam=2.0, normalization="focal_calibration")
    expected = TF.cross_entropy(z, y) + 2.0 * _ref_mmce_seed(z, y)
    torch.testing.assert_close(loss(z, y), expected)
    assert build_loss("mmce").hparams["normalization"] == "kumar"  # Kumar et al. by default


def _batch_with_accuracy(acc: float, seed: int, b: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    z = torch.randn(b, 10, generator=torch.Generator().manual_seed(seed)) * 3
    y = z.argmax(1)
    wrong = round((1 - acc) * b)
    y[:wrong] = (y[:wrong] + 1) % 10
    return z, y


def test_mmce_normalizations_differ_by_an_accuracy_dependent_factor() -> None:
    # not a uniform 1/B² rescaling: the ratio at 60 % batch accuracy is several times that at 90 %
    ratios = {}
    for acc in (0.6, 0.9):
        r = []
        for seed in range(10):
            z, y = _batch_with_accuracy(acc, seed)
            kumar = F_cal.mmce_weighted(z, y)
            seed_code = F_cal.mmce_weighted(z, y, normalization="focal_calibration")
            r.append(float(kumar / seed_code))
        ratios[acc] = (min(r), max(r))
    assert ratios[0.6][0] > 40 and ratios[0.6][1] < 48  # measured 41-47
    assert ratios[0.9][0] > 4 and ratios[0.9][1] < 12  # measured 5-11
    with pytest.raises(ValueError, match=r"normalization: expected one of 'kumar', "):
        F_cal.mmce_weighted(z, y, normalization="seed")


def test_mmce_is_zero_when_one_group_is_empty() -> None:
    z = torch.tensor([[3.0, 0.0], [0.0, 2.0]], requires_grad=True)
    out = F_cal.mmce_weighted(z, z.argmax(1))  # every prediction correct
    (g,) = torch.autograd.grad(out, z)
    assert out == 0 and torch.equal(g, torch.zeros_like(g))


@pytest.mark.parametrize(
    "fn",
    [
        lambda t, y: F_cal.focal_loss(t, y, 0.5),
        lambda t, y: F_cal.inverse_focal_loss(t, y, 1.5),
        lambda t, y: F_cal.dual_focal_loss(t, y, 2.0),
        lambda t, y: F_cal.fcl_loss(t, y, 2.0, 0.7, "none"),
        lambda t, y: F_cal.brier_loss(t, y, "sum"),
        lambda t, y: F_cal.label_smoothing_loss(t, y, 0.3, "none"),
        lambda t, y: F_cal.label_smoothing_loss(t, y, 0.2, "sum"),
        lambda t, y: F_cal.flsd_loss(t, y, (5.0, 3.0), (0.2,)),
        lambda t, y: F_cal.adadual_focal_loss(
            t, y, torch.tensor([2.0, -1.0, 0.5], dtype=torch.float64), torch.tensor([0.2, 0.5])
        ),
    ],
)
def test_fused_backward_passes_gradcheck(fn) -> None:
    z, y = _logits(6, 4, seed=17, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda t: fn(t, y), (z.requires_grad_(True),))


def test_adafocal_mixes_focal_and_inverse_by_bin() -> None:
    z, y = _logits(64, 5, scale=1.5, seed=18, dtype=torch.float64)
    gammas = torch.tensor([3.0, -1.5, 0.4, -0.2], dtype=torch.float64)
    edges = torch.tensor([0.2, 0.4, 0.7], dtype=torch.float64)
    p_y = torch.softmax(z, 1).gather(1, y[:, None]).squeeze(1)
    g = gammas[torch.bucketize(p_y, edges, right=True)]
    assert (g < 0).any() and (g > 0).any()

    def ref(t: torch.Tensor) -> torch.Tensor:
        return torch.where(g >= 0, _ref_focal(t, y, g.abs()), _ref_inverse(t, y, g.abs()))

    _close_with_grads(lambda t: F_cal.adafocal_loss(t, y, gammas, edges, "none"), ref, z)


def test_half_precision_is_computed_in_float32() -> None:
    # bfloat16 logits give exactly the float32 computation rounded to bfloat16 (loss and
    # gradient), not a computation carried out in bfloat16
    z, y = _logits(16, 5, seed=19)
    zb = z.bfloat16()
    for name in ("focal", "dual_focal", "fcl", "label_smoothing"):
        loss = build_loss(name)
        z16, z32 = zb.clone().requires_grad_(True), zb.float().requires_grad_(True)
        out16, out32 = loss(z16, y), loss(z32, y)
        out16.backward()
        out32.backward()
        assert torch.equal(out16, out32.bfloat16()), name
        assert torch.equal(z16.grad, z32.grad.bfloat16()), name


# -- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "params", "match"),
    [
        ("focal", {"gamma": -1}, r"focal: gamma: expected a number in \[0, inf\), got -1"),
        ("focal", {"gama": 1}, r"focal: unknown parameter 'gama'; expected one of gamma"),
        ("adafocal", {"switch_threshold": 0}, r"switch_threshold: expected a number in \(0, inf\)"),
        ("adafocal", {"gamma_min": 0.5}, r"gamma_min: expected a number in \(-inf, 0\), got 0.5"),
        ("adafocal", {"gamma_max": 0}, r"gamma_max: expected a number in \(0, inf\), got 0"),
        ("adafocal", {"n_bins": 0}, r"n_bins: expected an integer in \[1, inf\), got 0"),
        (
            "adafocal",
            {"gamma_init": 30.0},
            r"gamma_init: expected a number in \[gamma_min, gamma_max\]",
        ),
        ("adafocal", {"update_every": 0}, r"update_every: expected 'epoch' or an integer"),
        ("calfocal", {"update_every": "batch"}, r"update_every: expected 'epoch' or an integer"),
        (
            "flsd",
            {"gammas": (5.0,)},
            r"flsd: gammas: expected len\(thresholds\) \+ 1 = 2 values, got 1",
        ),
        ("flsd", {"thresholds": (0.0,)}, r"flsd: thresholds: expected a float list in \(0, 1\)"),
        ("flsd", {"gammas": (5, 3, 1), "thresholds": (0.5, 0.2)}, r"expected strictly increasing"),
        ("label_smoothing", {"alpha": 1.0}, r"alpha: expected a number in \[0, 1\), got 1.0"),
        ("mmce", {"lam": -0.1}, r"mmce: lam: expected a number in \[0, inf\), got -0.1"),
        ("mmce", {"normalization": "sum"}, r"mmce: normalization: expected one of 'kumar', "),
    ],
)
def test_construction_errors(name: str, params: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build_loss(name, **params)


def test_unknown_loss_lists_the_registry() -> None:
    with pytest.raises(
        ValueError, match=r"unknown loss 'focall'; expected one of: adadual_focal, "
    ):
        build_loss("focall")
    with pytest.raises(ValueError, match="mmce"):
        build_loss("focall")


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda z, y: F_cal.focal_loss(z[0], y, 2.0), r"focal_loss: logits: expected a 2-D"),
        (lambda z, y: F_cal.focal_loss(z, y.float(), 2.0), r"targets: expected int64 class"),
        (lambda z, y: F_cal.focal_loss(z, y[:3], 2.0), r"targets: expected shape \(8,\)"),
        (lambda z, y: F_cal.focal_loss(z[:, :1], y, 2.0), r"expected B >= 1 samples and K >= 2"),
        (lambda z, y: F_cal.focal_loss(z.long(), y, 2.0), r"logits: expected a floating-point"),
        (lambda z, y: F_cal.focal_loss(z, y, -0.5), r"focal_loss: gamma: expected a number in"),
        (lambda z, y: F_cal.focal_loss(z, y, 2.0, "avg"), r"reduction: expected one of"),
        (lambda z, y: F_cal.dual_focal_loss(z, y, float("nan")), r"gamma: expected a number"),
        (lambda z, y: F_cal.fcl_loss(z, y, 1.0, -1.0), r"fcl_loss: lam: expected a number in"),
        (
            lambda z, y: F_cal.label_smoothing_loss(z, y, 0.9),
            r"alpha: expected a number in \[0, \(K-1\)/K\] = \[0, 0.75\] for K=4 classes",
        ),
        (lambda z, y: F_cal.flsd_loss(z, y, (5.0, 3.0), (1.2,)), r"thresholds: expected strictly"),
        (lambda z, y: F_cal.flsd_loss(z, y, (5.0, -3.0), (0.2,)), r"flsd_loss: gammas: expected"),
        (
            lambda z, y: F_cal.adafocal_loss(z, y, torch.ones(3), torch.ones(3)),
            r"expected gammas of shape \(M,\) and edges of shape \(M-1,\), got \(3,\) and \(3,\)",
        ),
    ],
)
def test_call_errors(call, match: str) -> None:
    z, y = _logits(8, 4, seed=20)
    with pytest.raises(ValueError, match=match):
        call(z, y)


# the function-backed modules (`name=`, `function=` subclasses): each module is its function with
# the resolved hyperparameters, passed by name (non-default values, so a dropped or swapped one
# shows)
FUNCTION_MODULES = {
    "cross_entropy": (F_cal.cross_entropy_loss, {}),
    "focal": (F_cal.focal_loss, {"gamma": 1.5}),
    "inverse_focal": (F_cal.inverse_focal_loss, {"gamma": 2.5}),
    "dual_focal": (F_cal.dual_focal_loss, {"gamma": 2.0}),
    "fcl": (F_cal.fcl_loss, {"gamma": 2.0, "lam": 0.3}),
    "brier": (F_cal.brier_loss, {}),
    "label_smoothing": (F_cal.label_smoothing_loss, {"alpha": 0.2}),
    "mmce": (F_cal.mmce_loss, {"lam": 0.7, "normalization": "focal_calibration"}),
    "mbls": (F_cal.mbls_loss, {"margin": 1.0, "lam": 0.4}),
    "logitnorm": (F_cal.logitnorm_loss, {"tau": 0.5}),
    "mdca": (F_cal.mdca_loss, {"beta": 2.0}),
    "dca": (F_cal.dca_loss, {"beta": 3.0}),
    # with plain labels (no batch transform) the mixup family is its clean part; the mixed
    # path is tested in tests/test_losses_mixup.py
    "regmixup": (F_cal.regmixup_loss, {"alpha": 5.0, "eta": 0.5}),
    "rankmixup": (F_cal.rankmixup_loss, {"alpha": 2.0, "weight": 0.3, "num_mixup": 2}),
    "rankmixup_mrl": (F_cal.rankmixup_mrl_loss, {"alpha": 2.0, "margin": 0.2, "weight": 0.3}),
}


def test_function_backed_modules_are_their_function() -> None:
    backed = {n for n in list_losses() if LOSSES.get(n).factory.function is not None}
    assert backed == set(FUNCTION_MODULES)
    g = torch.Generator().manual_seed(11)
    z, y = 3 * torch.randn(9, 6, generator=g, dtype=torch.float64), torch.arange(9) % 6
    for name, (fn, params) in FUNCTION_MODULES.items():
        module = build_loss(name, reduction="none", **params)
        assert type(module).__name__ in losses.__all__, name
        torch.testing.assert_close(module(z, y), fn(z, y, **params, reduction="none"))
