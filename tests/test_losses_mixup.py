"""The mixup family (issue 23): the batch transform, RegMixup, RankMixup (M-NDCG, M-RL), soft
targets, the registry contract on the mixed path, and the training loop that applies it.

References are written from the papers' equations, independently of `calibtune.losses._mixup`:
hard-label cross-entropies weighted by λ (not the soft-target path), and per-sample Python loops
over sorted lists for the ranking terms (fine in a test; the implementation is vectorised).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as TF
import yaml

import calibtune.losses.functional as F_cal
from calibtune.cli import main
from calibtune.losses import LOSSES, MixedTargets, build_loss, mixup_batch
from calibtune.studyfile._spaces import load_loss_space
from calibtune.training import _loop as loop

MIXUP = sorted(n for n in LOSSES.names() if hasattr(LOSSES.get(n).factory, "batch_transform"))
ROOT = Path(__file__).resolve().parents[1]


def test_the_family_is_registered():
    assert MIXUP == ["rankmixup", "rankmixup_mrl", "regmixup"]
    assert build_loss("regmixup").hparams == {"alpha": 10.0, "eta": 1.0}  # Pinto et al.
    assert build_loss("rankmixup_mrl").hparams == {"alpha": 1.0, "margin": 0.1, "weight": 0.1}
    assert build_loss("rankmixup").hparams == {"alpha": 1.0, "weight": 0.1, "num_mixup": 3}


# -- the transform ------------------------------------------------------------------------------


@pytest.mark.parametrize("copies", [1, 3])
def test_mixup_batch_is_the_clean_batch_then_its_mixed_copies(copies):
    torch.manual_seed(0)
    x, y = torch.randn(6, 1, 2, 2, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1, 2])
    xa, t = mixup_batch(x, y, alpha=2.0, copies=copies)
    assert xa.shape == (6 * (1 + copies), 1, 2, 2) and xa.dtype == x.dtype
    assert torch.equal(xa[:6], x) and torch.equal(t.labels, y)
    assert t.partner.shape == (copies, 6) and t.lam.shape == (copies,)
    for m in range(copies):
        assert sorted(t.partner[m].tolist()) == list(range(6))  # a permutation
        lam = float(t.lam[m])
        assert 0.0 < lam < 1.0
        expected = lam * x + (1 - lam) * x[t.partner[m]]
        torch.testing.assert_close(xa[6 * (1 + m) : 6 * (2 + m)], expected)
        soft = t.soft(3, torch.float64)[m]
        ref = lam * TF.one_hot(y, 3) + (1 - lam) * TF.one_hot(y[t.partner[m]], 3)
        torch.testing.assert_close(soft, ref.double())


@pytest.mark.parametrize("alpha", [0.4, 10.0])
def test_lambda_has_the_beta_moments(alpha):
    """λ ~ Beta(α, α): mean ½, variance 1/(4(2α + 1)) (10⁵ draws; 6 standard errors)."""
    torch.manual_seed(1)
    n = 100_000
    _, t = mixup_batch(torch.zeros(2, 1), torch.tensor([0, 1]), alpha=alpha, copies=n)
    var = 1 / (4 * (2 * alpha + 1))
    assert abs(float(t.lam.mean()) - 0.5) < 6 * math.sqrt(var / n)
    assert float(t.lam.var()) == pytest.approx(var, rel=0.03)


def test_mixup_batch_stays_on_the_device_of_its_input():
    x, y = torch.empty(8, 3, device="meta"), torch.empty(8, dtype=torch.long, device="meta")
    xa, t = mixup_batch(x, y, alpha=10.0, copies=2)
    assert xa.device.type == t.partner.device.type == t.lam.device.type == "meta"
    assert xa.shape == (24, 3)


# -- parity with the papers' formulas -----------------------------------------------------------


def _case(b=6, k=4, copies=1, seed=0, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, k, (b,), generator=g)
    y[1] = y[0]  # at least one same-class pair may occur; and different ones
    partner = torch.stack([torch.randperm(b, generator=g) for _ in range(copies)])
    partner[0, 0] = 1  # row 0 mixes with a sample of its own class
    partner[0, 1] = 0
    lam = torch.rand(copies, generator=g, dtype=torch.float64) * 0.8 + 0.1
    z = scale * torch.randn((1 + copies) * b, k, generator=g, dtype=torch.float64)
    return z, MixedTargets(y, partner, lam)


def _ref_regmixup(z, t, eta):
    """CE(x, y) + η·mean_m [λ_m CE(x̃_m, y) + (1 − λ_m) CE(x̃_m, y_π)] (Pinto et al. Eq. 3 with
    the authors' ``regmixup_criterion``), per clean sample, from hard-label cross-entropies."""
    b, m = t.labels.shape[0], t.partner.shape[0]
    out = TF.cross_entropy(z[:b], t.labels, reduction="none")
    for c in range(m):
        zm = z[b * (1 + c) : b * (2 + c)]
        lam = t.lam[c]
        mixed = lam * TF.cross_entropy(zm, t.labels, reduction="none") + (
            1 - lam
        ) * TF.cross_entropy(zm, t.labels[t.partner[c]], reduction="none")
        out = out + eta * mixed / m
    return out


def _ref_mrl(z, t, margin, weight):
    """Noh et al. M-RL as the authors' code: CE + w·mean over copies of
    1[not one-hot target]·relu(max z̃ − max z + m), one sample at a time."""
    b, m = t.labels.shape[0], t.partner.shape[0]
    rows = []
    for i in range(b):
        ce = TF.cross_entropy(z[i : i + 1], t.labels[i : i + 1])
        reg = 0.0
        for c in range(m):
            if t.labels[t.partner[c, i]] == t.labels[i]:
                continue
            reg = reg + torch.relu(z[b * (1 + c) + i].max() - z[i].max() + margin)
        rows.append(ce + weight * reg / m)
    return torch.stack(rows)


def _ref_ndcg(z, t, weight):
    """Noh et al. M-NDCG, one sample at a time: gains (confidences) and relevances (label mass)
    of [clean, copies sorted by relevance], discount log₂(j + 2), N = DCG/IDCG or its inverse."""
    b, m = t.labels.shape[0], t.partner.shape[0]
    p = torch.softmax(z, dim=1)
    rows = []
    for i in range(b):
        copies = []
        for c in range(m):
            lam = float(t.lam[c])
            same = bool(t.labels[t.partner[c, i]] == t.labels[i])
            rel = 1.0 if same else max(lam, 1 - lam)
            copies.append((rel, p[b * (1 + c) + i].max()))
        copies.sort(key=lambda rc: -rc[0])  # stable: ties keep copy order (as argsort may not)
        items = [(1.0, p[i].max()), *copies]
        dcg = sum(c / math.log2(j + 2) for j, (_, c) in enumerate(items))
        idcg = sum(r / math.log2(j + 2) for j, (r, _) in enumerate(items))
        ndcg = dcg / idcg if idcg > dcg else idcg / dcg
        rows.append(TF.cross_entropy(z[i : i + 1], t.labels[i : i + 1]) + weight * (1 - ndcg))
    return torch.stack(rows)


def _value_and_grad(fn, z):
    z = z.detach().clone().requires_grad_(True)
    out = fn(z)
    (g,) = torch.autograd.grad(out.sum(), z)
    return out.detach(), g


def _parity(fn, ref, z):
    v, g = _value_and_grad(fn, z)
    rv, rg = _value_and_grad(ref, z)
    torch.testing.assert_close(v, rv, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g, rg, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("copies", [1, 2])
@pytest.mark.parametrize("eta", [1.0, 0.3])
def test_regmixup_equals_the_papers_formula(copies, eta):
    z, t = _case(copies=copies, seed=copies)
    _parity(
        lambda s: F_cal.regmixup_loss(s, t, eta=eta, reduction="none"),
        lambda s: _ref_regmixup(s, t, eta),
        z,
    )


@pytest.mark.parametrize("copies", [1, 3])
def test_rankmixup_mrl_equals_the_authors_hinge(copies):
    z, t = _case(copies=copies, seed=10 + copies)
    _parity(
        lambda s: F_cal.rankmixup_mrl_loss(s, t, margin=0.3, weight=0.5, reduction="none"),
        lambda s: _ref_mrl(s, t, 0.3, 0.5),
        z,
    )


@pytest.mark.parametrize("copies", [1, 3])
def test_rankmixup_ndcg_equals_the_authors_ndcg(copies):
    z, t = _case(copies=copies, seed=20 + copies)
    _parity(
        lambda s: F_cal.rankmixup_loss(s, t, weight=0.7, num_mixup=copies, reduction="none"),
        lambda s: _ref_ndcg(s, t, 0.7),
        z,
    )


def test_hand_derived_values():
    # two clean samples (y = 0, 1) and one copy with partners (1, 0), λ = 0.75
    z = torch.tensor(
        [[1.0, 0.0], [0.0, 2.0], [0.0, 0.0], [math.log(3.0), 0.0]], dtype=torch.float64
    )
    t = MixedTargets(torch.tensor([0, 1]), torch.tensor([[1, 0]]), torch.tensor([0.75]))
    ce = [math.log(1 + math.exp(-1)), math.log(1 + math.exp(-2))]  # 0.31326, 0.12693
    # RegMixup, η = 1: mixed row 0 has p = (½, ½): CE = log 2 whatever λ; mixed row 1 has
    # p = (¾, ¼) and target ¾ on class 1 (its own), ¼ on class 0: −(¾ log ¼ + ¼ log ¾)
    mix = [math.log(2), -(0.75 * math.log(0.25) + 0.25 * math.log(0.75))]
    reg = F_cal.regmixup_loss(z, t, eta=1.0, reduction="none")
    torch.testing.assert_close(reg, torch.tensor([ce[0] + mix[0], ce[1] + mix[1]]).double())
    # M-RL, m = 0.1, w = 1: hinges max(0, 0 − 1 + 0.1) = 0 and max(0, log 3 − 2 + 0.1) = 0
    # for row 1 the mixed top logit log 3 = 1.0986 < 2 − 0.1: both zero, so M-RL = CE
    mrl = F_cal.rankmixup_mrl_loss(z, t, margin=0.1, weight=1.0, reduction="none")
    torch.testing.assert_close(mrl, torch.tensor(ce).double())
    # with m = 1: row 1 hinge = log 3 − 2 + 1 = 0.09861
    mrl = F_cal.rankmixup_mrl_loss(z, t, margin=1.0, weight=1.0, reduction="none")
    torch.testing.assert_close(mrl, torch.tensor([ce[0], ce[1] + math.log(3) - 1]).double())
    # M-NDCG, w = 1, row 0: gains (σ(1) = 0.73106, ½), relevances (1, ¾), discounts (1, log₂3):
    # DCG = 0.73106 + 0.31546 = 1.04652, IDCG = 1 + 0.47320 = 1.47320, N = 0.71037
    g0 = 1 / (1 + math.exp(-1))
    dcg, idcg = g0 + 0.5 / math.log2(3), 1 + 0.75 / math.log2(3)
    nd = F_cal.rankmixup_loss(z, t, weight=1.0, num_mixup=1, reduction="none")
    assert float(nd[0]) == pytest.approx(ce[0] + 1 - dcg / idcg, rel=1e-12)
    assert dcg / idcg == pytest.approx(0.71037, abs=1e-5)


# -- the registry contract on the mixed path ---------------------------------------------------


def _mixed(name, b=8, k=5, seed=0, dtype=torch.float32, scale=2.0):
    torch.manual_seed(seed)
    loss = build_loss(name)
    x, y = torch.randn(b, 3), torch.randint(0, k, (b,))
    xa, t = loss.batch_transform(x, y)
    w = torch.randn(3, k)
    return (scale * xa @ w).to(dtype), t


@pytest.mark.parametrize("name", MIXUP)
class TestMixedContract:
    def test_sum_is_mean_times_clean_batch_and_none_is_per_clean_sample(self, name):
        z, t = _mixed(name)
        mean, total = build_loss(name)(z, t), build_loss(name, reduction="sum")(z, t)
        per = build_loss(name, reduction="none")(z, t)
        assert mean.shape == total.shape == () and per.shape == (8,)
        torch.testing.assert_close(total, mean * 8)
        torch.testing.assert_close(per.mean(), mean)

    def test_per_sample_terms_are_independent(self, name):
        """Row i of "none" depends on clean row i and its copies only (no batch statistic)."""
        z, t = _mixed(name, seed=1)
        z = z.double().requires_grad_(True)
        per = build_loss(name, reduction="none")(z, t)
        (g,) = torch.autograd.grad(per[3], z)
        b, m = 8, t.partner.shape[0]
        mine = {3 + b * c for c in range(m + 1)}
        others = [r for r in range(b * (m + 1)) if r not in mine]
        assert g[others].abs().max() == 0 and g[sorted(mine)].abs().sum() > 0

    @pytest.mark.parametrize("scale", [2.0, 60.0])
    def test_finite_loss_and_gradient(self, name, scale):
        z, t = _mixed(name, seed=2, scale=scale)
        v, g = _value_and_grad(lambda s: build_loss(name)(s, t), z)
        assert torch.isfinite(v).all() and torch.isfinite(g).all() and g.abs().sum() > 0

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
    def test_dtype_and_device_preserved(self, name, dtype):
        z, t = _mixed(name, seed=3, dtype=dtype)
        z.requires_grad_(True)
        out = build_loss(name)(z, t)
        out.backward()
        assert out.dtype == dtype and z.grad is not None and z.grad.dtype == dtype
        meta = MixedTargets(t.labels.to("meta"), t.partner.to("meta"), t.lam.to("meta"))
        zm = torch.empty(z.shape, dtype=dtype, device="meta", requires_grad=True)
        out = build_loss(name).to("meta")(zm, meta)
        out.backward()
        assert out.device.type == "meta" and zm.grad is not None and zm.grad.device.type == "meta"

    def test_plain_labels_are_the_clean_cross_entropy(self, name):
        z, y = torch.randn(6, 4), torch.tensor([0, 1, 2, 3, 0, 1])
        torch.testing.assert_close(build_loss(name)(z, y), TF.cross_entropy(z, y))

    def test_rejects_a_batch_of_the_wrong_size(self, name):
        z, t = _mixed(name, seed=4)
        with pytest.raises(ValueError, match=r"_loss: logits: expected \(1 \+ M\)·B = \d+ rows"):
            build_loss(name)(z[:-1], t)


# -- soft targets -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fn", "params"), [("cross_entropy_loss", {}), ("focal_loss", {"gamma": 2.0})]
)
def test_soft_targets_one_hot_is_hard_and_mixup_is_lambda_weighted(fn, params):
    f = getattr(F_cal, fn)
    g = torch.Generator().manual_seed(0)
    z = 2 * torch.randn(10, 4, generator=g, dtype=torch.float64)
    ya, yb = torch.randint(0, 4, (10,), generator=g), torch.randint(0, 4, (10,), generator=g)
    one_hot = TF.one_hot(ya, 4).double()
    _parity(lambda s: f(s, one_hot, **params, reduction="none"),
            lambda s: f(s, ya, **params, reduction="none"), z)  # fmt: skip
    soft = 0.3 * one_hot + 0.7 * TF.one_hot(yb, 4).double()
    _parity(
        lambda s: f(s, soft, **params, reduction="none"),
        lambda s: (
            0.3 * f(s, ya, **params, reduction="none") + 0.7 * f(s, yb, **params, reduction="none")
        ),
        z,
    )


def test_soft_focal_is_finite_where_p_rounds_to_one():
    z = torch.tensor([[60.0, -60.0, -60.0], [0.0, 0.0, 0.0]], requires_grad=True)
    t = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    for gamma in (0.5, 2.0):
        out = F_cal.focal_loss(z, t, gamma)
        (g,) = torch.autograd.grad(out, z)
        assert torch.isfinite(out) and torch.isfinite(g).all()


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda z: F_cal.brier_loss(z, torch.full((4, 3), 1 / 3)),
            r"^brier_loss: targets: expected class indices of shape \(4,\) \(soft \(B, K\) "
            r"targets: cross_entropy_loss, focal_loss only\), got shape \(4, 3\)$",
        ),
        (
            lambda z: F_cal.adafocal_loss(z, torch.full((4, 3), 1 / 3), [1.0], []),
            r"^adafocal_loss: targets: expected class indices of shape \(4,\)",
        ),
        (
            lambda z: F_cal.cross_entropy_loss(z, torch.ones(4, 2)),
            r"^cross_entropy_loss: targets: expected \(4,\) int64 class indices or \(4, 3\) "
            r"floating-point class probabilities, got shape \(4, 2\) dtype torch.float32$",
        ),
        (
            lambda z: F_cal.focal_loss(z, torch.ones(4, 3, dtype=torch.long), 1.0),
            r"^focal_loss: targets: expected \(4,\) int64 .* got shape \(4, 3\) dtype torch.int64",
        ),
    ],
)
def test_losses_that_cannot_take_soft_targets_refuse_them_in_one_line(call, match):
    with pytest.raises(ValueError, match=match):
        call(torch.zeros(4, 3))


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "params", "match"),
    [
        ("regmixup", {"alpha": 0}, r"^regmixup: alpha: expected a number in \(0, inf\), got 0$"),
        ("regmixup", {"eta": -1}, r"^regmixup: eta: expected a number in \[0, inf\), got -1$"),
        ("rankmixup", {"num_mixup": 0}, r"^rankmixup: num_mixup: expected an integer in \[1, inf"),
        ("rankmixup_mrl", {"margin": "x"}, r"^rankmixup_mrl: margin: expected a number"),
    ],
)
def test_bad_parameters_name_the_rule(name, params, match):
    with pytest.raises(ValueError, match=match):
        build_loss(name, **params)


def test_a_bad_parameter_in_a_trial_file_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = yaml.safe_load((ROOT / "studies" / "trials" / "digits_regmixup.yaml").read_text())
    cfg["loss"]["params"]["alpha"] = -1
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "alpha: expected a number in (0, inf), got -1" in err[0], err


def test_a_search_space_outside_the_declared_range_is_refused(tmp_path):
    bad = tmp_path / "s.yaml"
    bad.write_text(
        "loss: regmixup\nparams:\n  alpha: {type: float, low: 0.0, high: 2.0}\n", encoding="utf-8"
    )
    with pytest.raises(ValueError, match=r"alpha"):
        load_loss_space(bad)


# -- the loop applies the transform ---------------------------------------------------------------


def _spec(loss: str, n: int):
    from test_device_path import _spec as device_spec

    return device_spec(torch.device("cpu"), loss, "digits", n=n)


@pytest.mark.parametrize("name", MIXUP)
def test_the_loop_trains_on_the_mixed_batch_and_counts_the_clean_rows(name):
    torch.manual_seed(0)
    spec = _spec(name, 96)
    seen_rows = []
    model = spec.model
    hook = model.register_forward_hook(lambda m, i, o: seen_rows.append(o.shape[0]))
    loss_sum, wrong, seen = loop._train_epoch(spec, loop._Sources.of(spec), 1, 0.05, None)[
        0
    ].tolist()
    hook.remove()
    copies = build_loss(name).copies()
    assert seen_rows == [32 * (1 + copies)] * 3  # clean + mixed rows in one forward
    assert seen == 96 and 0 <= wrong <= 96 and math.isfinite(loss_sum)


@pytest.mark.parametrize("name", MIXUP)
def test_host_reads_of_a_mixup_epoch_do_not_grow_with_its_steps(name):
    from test_device_path import _reads_of_an_epoch

    few, many = _reads_of_an_epoch(name, 64), _reads_of_an_epoch(name, 256)  # 2 vs 8 steps
    assert few == many <= 2


def test_evaluation_passes_are_never_mixed():
    torch.manual_seed(0)
    spec = _spec("regmixup", 64)  # two training batches of 32; validation: 64 samples
    rows = []
    hook = spec.model.register_forward_hook(lambda m, i, o: rows.append(o.shape[0]))
    cache = loop.train_epochs(spec)
    hook.remove()
    assert rows == [64, 64, 64]  # two mixed training batches (32 + 32), one validation pass
    assert cache is not None and cache.val_logits.shape == (64, 10)
