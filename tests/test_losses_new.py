"""The issue-14 losses (MbLS, LogitNorm, MDCA, DCA): values and gradients against plain float64
formulas written here (autograd over the papers' definitions, re-typed from the formulas, the MDCA
one as the authors' per-class loop), hand-derived values, float64 gradcheck of the fused backward,
and construction/call errors. The registry contract (reductions, dtypes, devices, batch size 1)
runs over these losses in tests/test_losses.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as TF
from torch.autograd import gradcheck

import calibtune.losses.functional as F_cal
from calibtune.losses import build_loss

NEW = ["mbls", "logitnorm", "mdca", "dca"]


def _logits(b: int = 12, k: int = 5, scale: float = 3.0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    z = (scale * torch.randn(b, k, generator=g)).double()
    return z, torch.randint(0, k, (b,), generator=g)


# -- plain references: per-sample losses (B,), batch terms broadcast as the module documents --


def ref_mbls(z, y, margin, lam):
    d = z.max(dim=1, keepdim=True).values - z
    return TF.cross_entropy(z, y, reduction="none") + lam * TF.relu(d - margin).mean(dim=1)


def ref_logitnorm(z, y, tau):
    norms = torch.norm(z, p=2, dim=-1, keepdim=True) + 1e-7
    return TF.cross_entropy(z / norms / tau, y, reduction="none")


def ref_mdca(z, y, beta):
    probs = torch.softmax(z, dim=1)
    k = z.shape[1]
    mdca = sum(torch.abs(probs[:, c].mean() - (y == c).double().mean()) for c in range(k)) / k
    return TF.cross_entropy(z, y, reduction="none") + beta * mdca


def ref_dca(z, y, beta):
    conf, pred = torch.softmax(z, dim=1).max(dim=1)
    dca = torch.abs(conf.mean() - pred.eq(y).double().mean())
    return TF.cross_entropy(z, y, reduction="none") + beta * dca


CASES = [
    ("mbls_loss", ref_mbls, {"margin": 2.0, "lam": 0.7}),
    ("mbls_loss", ref_mbls, {"margin": 0.0, "lam": 0.1}),
    ("logitnorm_loss", ref_logitnorm, {"tau": 0.04}),
    ("logitnorm_loss", ref_logitnorm, {"tau": 1.5}),
    ("logitnorm_loss", ref_logitnorm, {"tau": 0.002}),  # −log p_y from the maxima (2/τ > 700)
    ("mdca_loss", ref_mdca, {"beta": 1.0}),
    ("mdca_loss", ref_mdca, {"beta": 10.0}),
    ("dca_loss", ref_dca, {"beta": 5.0}),
    ("dca_loss", ref_dca, {"beta": 0.5}),
]


@pytest.mark.parametrize(("fn", "ref", "params"), CASES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_value_and_gradient_match_the_plain_formula(fn, ref, params, reduction) -> None:
    z, y = _logits(seed=len(fn) + len(params))
    w = torch.linspace(-1.0, 2.0, z.shape[0], dtype=torch.float64)
    za = z.clone().requires_grad_(True)
    out = getattr(F_cal, fn)(za, y, **params, reduction=reduction)
    zr = z.clone().requires_grad_(True)
    per = ref(zr, y, **params)
    expected = {"mean": per.mean(), "sum": per.sum(), "none": per}[reduction]
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    upstream = w if reduction == "none" else torch.tensor(1.7, dtype=torch.float64)
    (g,) = torch.autograd.grad(out, za, upstream)
    (gr,) = torch.autograd.grad(expected, zr, upstream)
    assert gr.abs().sum() > 0
    torch.testing.assert_close(g, gr, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("fn", "_ref", "params"), CASES)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_fused_backward_passes_float64_gradcheck(fn, _ref, params, reduction) -> None:
    z, y = _logits(6, 4, seed=3)
    z.requires_grad_(True)
    assert gradcheck(
        lambda t: getattr(F_cal, fn)(t, y, **params, reduction=reduction), (z,), eps=1e-6
    )


def test_hand_values() -> None:
    # MbLS: z = (8, 1, 0), y = 0: distances (0, 7, 8), beyond m = 6 by (0, 1, 2) → mean 1;
    # CE = log(1 + e^-7 + e^-8)
    z, y = torch.tensor([[8.0, 1.0, 0.0]], dtype=torch.float64), torch.tensor([0])
    ce = torch.log1p(torch.tensor(-7.0).exp() + torch.tensor(-8.0).exp()).double()
    torch.testing.assert_close(F_cal.mbls_loss(z, y, 6.0, 0.1), ce + 0.1)
    # LogitNorm: z = (3, 4) → (0.6, 0.8)/τ with τ = 0.5 → (1.2, 1.6); CE at class 0 = log(1+e^0.4)
    z, y = torch.tensor([[3.0, 4.0]], dtype=torch.float64), torch.tensor([0])
    expected = torch.log1p(torch.tensor(0.4, dtype=torch.float64).exp())
    torch.testing.assert_close(F_cal.logitnorm_loss(z, y, 0.5), expected, rtol=1e-6, atol=0)
    # MDCA: zero logits, K = 2, labels (0, 0): p̄ = (½, ½), f = (1, 0) → (½ + ½)/2 = ½
    z, y = torch.zeros(2, 2, dtype=torch.float64), torch.tensor([0, 0])
    torch.testing.assert_close(
        F_cal.mdca_loss(z, y, 2.0), torch.log(torch.tensor(2.0)).double() + 1
    )
    # DCA: rows (2, 0) y=1 and (0, 0) y=0 (argmax 0 on the tie): C = (σ(2) + ½)/2, A = ½
    z, y = torch.tensor([[2.0, 0.0], [0.0, 0.0]], dtype=torch.float64), torch.tensor([1, 0])
    s2 = torch.sigmoid(torch.tensor(2.0, dtype=torch.float64))
    ce = (-torch.log(1 - s2) + torch.log(torch.tensor(2.0))) / 2
    torch.testing.assert_close(F_cal.dca_loss(z, y, 3.0), ce + 3 * ((s2 + 0.5) / 2 - 0.5))


@pytest.mark.parametrize(
    ("fn", "params"),
    [
        ("mbls_loss", {"margin": 3.0, "lam": 0.0}),
        ("mdca_loss", {"beta": 0.0}),
        ("dca_loss", {"beta": 0.0}),
    ],
)
def test_zero_weight_is_cross_entropy(fn, params) -> None:
    z, y = _logits(seed=9)
    torch.testing.assert_close(
        getattr(F_cal, fn)(z, y, **params, reduction="none"),
        TF.cross_entropy(z, y, reduction="none"),
    )


def test_mbls_penalty_is_zero_within_the_margin() -> None:
    z, y = _logits(scale=0.5, seed=4)  # every logit gap < 6
    torch.testing.assert_close(F_cal.mbls_loss(z, y, 6.0, 5.0), TF.cross_entropy(z, y))


def test_logitnorm_is_scale_invariant_and_finite_at_zero_logits() -> None:
    z, y = _logits(seed=5)
    torch.testing.assert_close(
        F_cal.logitnorm_loss(100 * z, y, 0.04), F_cal.logitnorm_loss(z, y, 0.04), rtol=1e-7, atol=0
    )
    z0 = torch.zeros(3, 4, dtype=torch.float64, requires_grad=True)
    out = F_cal.logitnorm_loss(z0, torch.tensor([0, 1, 2]), 0.04)
    out.backward()
    torch.testing.assert_close(out, torch.log(torch.tensor(4.0, dtype=torch.float64)))
    # at z = 0 only the CE part of the gradient remains (the normalisation term is 0·z)
    expected = (torch.full((3, 4), 0.25) - TF.one_hot(torch.tensor([0, 1, 2]), 4)).double()
    torch.testing.assert_close(z0.grad, expected / (0.04 * 1e-7) / 3)


def test_mdca_is_zero_when_mean_probabilities_match_class_frequencies() -> None:
    # uniform predictions on a batch holding every class equally often: p̄ = f = 1/K
    z, y = torch.zeros(6, 3, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1, 2])
    torch.testing.assert_close(F_cal.mdca_loss(z, y, 7.0), TF.cross_entropy(z, y))


@pytest.mark.parametrize(
    ("name", "params", "match"),
    [
        ("mbls", {"margin": -1}, r"^mbls: margin: expected a number in \[0, inf\), got -1$"),
        ("mbls", {"lam": "big"}, r"^mbls: lam: expected a number in \[0, inf\), got 'big'$"),
        ("logitnorm", {"tau": 0}, r"^logitnorm: tau: expected a number in \(0, inf\), got 0$"),
        ("mdca", {"beta": -0.5}, r"^mdca: beta: expected a number in \[0, inf\), got -0.5$"),
        ("dca", {"beta": float("nan")}, r"^dca: beta: expected a number in \[0, inf\), got nan$"),
        ("dca", {"gamma": 1.0}, r"^dca: unknown parameter 'gamma'; expected one of beta$"),
    ],
)
def test_construction_errors(name: str, params: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build_loss(name, **params)


def test_call_errors_name_the_function() -> None:
    z, y = _logits()
    with pytest.raises(ValueError, match=r"^logitnorm_loss: tau: expected a number in \(0, inf\)"):
        F_cal.logitnorm_loss(z, y, -1.0)
    with pytest.raises(ValueError, match=r"^mdca_loss: targets: expected int64 class indices"):
        F_cal.mdca_loss(z, y.int(), 1.0)
    with pytest.raises(ValueError, match=r"^dca_loss: logits: expected a 2-D \(B, K\) tensor"):
        F_cal.dca_loss(z[0], y, 1.0)


@pytest.mark.parametrize("name", NEW)
def test_defaults_are_the_papers(name: str) -> None:
    expected = {
        "mbls": {"margin": 6.0, "lam": 0.1},
        "logitnorm": {"tau": 0.04},
        "mdca": {"beta": 1.0},
        "dca": {"beta": 5.0},
    }[name]
    assert build_loss(name).hparams == expected


def test_ties_for_the_top_logit_share_its_gradient_like_amax() -> None:
    # rows with two or three equal maxima (the ±50-logit regime of the contract tests): the
    # gradient through max_j z_j is split evenly among the tied classes, as torch.amax's is
    z = torch.tensor(
        [[3.0, 3.0, -6.0, 0.0], [1.0, 1.0, 1.0, -9.0], [0.0, 5.0, -2.0, 5.0]], dtype=torch.float64
    )
    y = torch.tensor([0, 3, 2])

    def ref_mbls_amax(t):
        d = t.amax(dim=1, keepdim=True) - t
        return TF.cross_entropy(t, y) + 0.3 * TF.relu(d - 4.0).mean(dim=1).mean()

    def ref_dca_amax(t):
        conf = torch.softmax(t, dim=1).amax(dim=1)
        correct = (t.gather(1, y[:, None]).squeeze(1) == t.amax(dim=1)).double()
        return TF.cross_entropy(t, y) + 2.0 * (conf.mean() - correct.mean()).abs()

    for fn, ref in [
        (lambda t: F_cal.mbls_loss(t, y, 4.0, 0.3), ref_mbls_amax),
        (lambda t: F_cal.dca_loss(t, y, 2.0), ref_dca_amax),
    ]:
        za, zr = z.clone().requires_grad_(True), z.clone().requires_grad_(True)
        out, expected = fn(za), ref(zr)
        torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
        out.backward()
        expected.backward()
        torch.testing.assert_close(za.grad, zr.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", NEW)
def test_a_second_backward_gets_the_same_gradient_and_keeps_the_first(name: str) -> None:
    # the fused backwards write into buffers forward left behind; with retain_graph a second
    # backward must rebuild them and leave the first gradient untouched
    z, y = _logits(16, 7, seed=5)
    z[0, :2] = z[0].max() + 1.0  # a tie for the top logit
    z.requires_grad_(True)
    out = build_loss(name, reduction="none")(z, y)
    w = torch.linspace(0.5, 2.0, 16, dtype=torch.float64)
    (g1,) = torch.autograd.grad(out, z, w, retain_graph=True)
    kept = g1.clone()
    (g2,) = torch.autograd.grad(out, z, w)
    assert torch.equal(g1, kept)
    torch.testing.assert_close(g2, g1, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("name", NEW)
def test_buffers_reused_across_calls_are_never_shared_by_two_live_graphs(name: str) -> None:
    # two forwards before one backward (the first graph still holds its buffers), then a third
    # call after both graphs are gone: every gradient equals the plain formula's
    loss = build_loss(name)
    ref = {"mbls": ref_mbls, "logitnorm": ref_logitnorm, "mdca": ref_mdca, "dca": ref_dca}[name]
    grads, refs = [], []
    for seed in (1, 2, 3):
        z, y = _logits(10, 6, seed=seed)
        za, zr = z.clone().requires_grad_(True), z.clone().requires_grad_(True)
        grads.append((za, loss(za, y)))
        refs.append(torch.autograd.grad(ref(zr, y, **loss.hparams).mean(), zr)[0])
        if seed == 2:
            (grads[0][1] + grads[1][1]).backward()
    grads[2][1].backward()
    for (za, _), gr in zip(grads, refs, strict=True):
        torch.testing.assert_close(za.grad, gr, rtol=1e-10, atol=1e-12)


def test_logitnorm_small_tau_stays_finite_where_p_y_underflows() -> None:
    # τ = 0.01: s = (70.7, −70.7), p_y = e^−141 is 0 in float32, so −log p_y must come from the
    # maxima (−log p_y = 141.42), not from p
    z = torch.tensor([[1.0, -1.0]], requires_grad=True)
    out = F_cal.logitnorm_loss(z, torch.tensor([1]), 0.01)
    out.backward()
    torch.testing.assert_close(out, torch.tensor(2**0.5 / 0.01), rtol=1e-6, atol=0)
    assert torch.isfinite(z.grad).all()


@pytest.mark.parametrize("name", NEW)
def test_a_kept_gradient_is_never_overwritten_and_a_dropped_one_is_reused(name: str) -> None:
    # the fused backwards return a pooled buffer: one the caller keeps must survive the next
    # call; once dropped, the next step writes into the same memory (no fresh allocation)
    loss = build_loss(name)
    z1, y1 = _logits(10, 6, seed=1)
    z2, y2 = _logits(10, 6, seed=2)
    (g1,) = torch.autograd.grad(loss(z1.requires_grad_(True), y1), z1)
    kept = g1.clone()
    (g2,) = torch.autograd.grad(loss(z2.requires_grad_(True), y2), z2)
    assert torch.equal(g1, kept)
    assert g2.data_ptr() != g1.data_ptr()
    ptr = g2.data_ptr()
    del g1, g2
    (g3,) = torch.autograd.grad(loss(z2, y2), z2)
    assert g3.data_ptr() == ptr
