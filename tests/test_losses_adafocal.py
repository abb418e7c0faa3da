"""AdaFocal / CalFocal / AdaDualFocal controller: Algorithm 1 step by step, binning, state."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch

import calibtune.losses.functional as F_cal
from calibtune.losses import LOSSES, AdaFocalLoss, build_loss
from calibtune.losses._kernel import Schedule
from calibtune.metrics import adaece
from calibtune.metrics.binning import equal_mass_sizes

# every adaptive loss, from the registry
ADAPTIVE = sorted(e.name for e in LOSSES if getattr(e.factory, "adaptive", False))


def _val_set(
    conf: float, acc: float, n: int = 10, k: int = 10
) -> tuple[torch.Tensor, torch.Tensor]:
    """n predictions of confidence ``conf`` for class 0 (the rest spread evenly), a fraction
    ``acc`` of them correct: C_val = conf and A_val = acc."""
    row = [conf] + [(1 - conf) / (k - 1)] * (k - 1)
    probs = torch.tensor([row] * n, dtype=torch.float64)
    labels = torch.ones(n, dtype=torch.long)
    labels[: round(acc * n)] = 0
    return probs, labels


def test_algorithm_1_rises_caps_falls_switches_floors_and_switches_back() -> None:
    loss = build_loss("adafocal", n_bins=1)  # λ 1, γ_init 1, γ_max 20, γ_min −2, S_th 0.2
    recs = [loss.update(*_val_set(0.95, 0.0)) for _ in range(4)]
    # over-confident, E = 0.95: γ = e^0.95, e^1.9, e^2.85 = 17.29, then 17.29·e^0.95 = 44.7 → 20
    expected = [math.exp(0.95), math.exp(1.9), math.exp(2.85), 20.0]
    assert [r["gammas"][0] for r in recs] == pytest.approx(expected, rel=1e-12)
    assert recs[0]["c_val"] == pytest.approx([0.95]) and recs[0]["a_val"] == [0.0]

    recs = [loss.update(*_val_set(0.1, 1.0)) for _ in range(6)]
    # under-confident, E = 0.1 − 1 = −0.9: γ = 20e^−0.9 = 8.13, 3.31, 1.34, 0.547, 0.222, then
    # 20e^−5.4 = 0.090 < S_th → −0.2 (switch to inverse focal)
    expected = [20 * math.exp(-0.9 * i) for i in range(1, 6)] + [-0.2]
    assert [r["gammas"][0] for r in recs] == pytest.approx(expected, rel=1e-12)
    assert [r["switched"] for r in recs] == [[False]] * 5 + [[True]]

    recs = [loss.update(*_val_set(0.1, 1.0)) for _ in range(3)]
    # still under-confident, now γ < 0: γ ← max(−2, γ·e^{+0.9}) = −0.492, −1.210, −2.98 → −2
    expected = [-0.2 * math.exp(0.9), -0.2 * math.exp(1.8), -2.0]
    assert [r["gammas"][0] for r in recs] == pytest.approx(expected, rel=1e-12)

    recs = [loss.update(*_val_set(0.95, 0.0)) for _ in range(3)]
    # over-confident again, E = 0.95: γ ← γ·e^{−0.95} = −0.774, −0.299, −0.116 → +0.2 (back)
    expected = [-2 * math.exp(-0.95), -2 * math.exp(-1.9), 0.2]
    assert [r["gammas"][0] for r in recs] == pytest.approx(expected, rel=1e-12)
    assert [r["switched"] for r in recs] == [[False], [False], [True]]
    assert [r["step"] for r in loss.history] == list(range(1, 17))
    assert loss.gammas.tolist() == pytest.approx([0.2])


def test_rule_is_vectorised_over_bins() -> None:
    gammas = torch.tensor([1.0, 1.0, -1.0, -1.0, 0.0], dtype=torch.float64)
    gap = torch.tensor([0.1, -2.0, 0.1, -0.1, 0.3], dtype=torch.float64)
    new, switched = F_cal.adafocal_gamma_update(gammas, gap, 1.0, 20.0, -2.0, 0.2)
    # e^0.1 = 1.105; e^−2 = 0.135 < S_th → −0.2; −e^−0.1 = −0.905; −e^0.1 = −1.105; 0 → −0.2
    assert new.tolist() == pytest.approx(
        [math.exp(0.1), -0.2, -math.exp(-0.1), -math.exp(0.1), -0.2], rel=1e-12
    )
    assert switched.tolist() == [False, True, False, False, True]


def test_calfocal_gamma_is_exp_lambda_gap() -> None:
    loss = build_loss("calfocal", n_bins=1, lam=10.0)
    assert loss.gammas.tolist() == [1.0]  # E = 0 before any validation: γ = e^0
    rec = loss.update(*_val_set(0.9, 0.8))
    assert rec["gammas"] == pytest.approx([math.exp(10 * 0.1)], rel=1e-9)
    rec = loss.update(*_val_set(0.9, 0.9))  # not cumulative: back to e^0 when calibrated
    assert rec["gammas"] == pytest.approx([1.0]) and rec["switched"] == [False]


def test_validation_bins_use_adaece_grouping_and_smallest_confidence_edges() -> None:
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(2 * torch.randn(103, 6, generator=g), dim=1)
    labels = torch.randint(0, 6, (103,), generator=g)
    bins = F_cal.validation_bins(probs, labels, 7)
    conf, pred = probs.max(1)
    # numpy reference: stable sort, array_split groups (sizes 15,15,15,15,15,14,14)
    order = np.argsort(conf.numpy(), kind="stable")
    groups = np.array_split(order, 7)
    assert bins.counts.tolist() == [len(gr) for gr in groups] == [15] * 5 + [14] * 2
    assert bins.edges.tolist() == [float(conf[gr].min()) for gr in groups[1:]]
    assert bins.conf.tolist() == pytest.approx([float(conf[gr].double().mean()) for gr in groups])
    correct = (pred == labels).double()
    assert bins.acc.tolist() == pytest.approx([float(correct[gr].mean()) for gr in groups])
    # AdaECE is exactly Σ_b |B_b|/N · |C_b − A_b| over these bins
    gap = (bins.counts * (bins.conf - bins.acc).abs()).sum() / 103
    assert float(gap) == pytest.approx(adaece(probs, labels, 7), rel=1e-12)


def test_validation_bins_do_not_depend_on_the_order_of_the_validation_set() -> None:
    # confidences on a 0.1 lattice: ties straddle every group boundary
    g = torch.Generator().manual_seed(3)
    conf = torch.randint(3, 10, (300,), generator=g).double() / 10
    probs = torch.cat([conf[:, None], ((1 - conf) / 9)[:, None].expand(-1, 9)], 1)
    labels = torch.where(torch.rand(300, generator=g) < conf, 0, 1)
    ref = F_cal.validation_bins(probs, labels, 7)
    accs = set()
    for seed in range(4):
        perm = torch.randperm(300, generator=torch.Generator().manual_seed(seed))
        bins = F_cal.validation_bins(probs[perm], labels[perm], 7)
        for a, b in zip(bins, ref, strict=True):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=0, equal_nan=True)
        accs.add(tuple(bins.acc.nan_to_num(-1).tolist()))
    assert len(accs) == 1
    # tied confidences really straddle the array_split boundaries (the case the rule is for),
    # and the bins' boundaries fall only between distinct confidences
    sc = conf.sort().values
    split = torch.cumsum(torch.tensor(equal_mass_sizes(300, 7)), 0)[:-1]
    assert bool((sc[split - 1] == sc[split]).any())
    starts = torch.cumsum(ref.counts.long(), 0)[:-1]
    starts = starts[(starts > 0) & (starts < 300)]
    assert bool((sc[starts - 1] < sc[starts]).all())
    # an empty bin has no evidence: the update leaves its γ where it was
    loss = build_loss("adafocal", n_bins=7)
    before = loss.gammas.clone()
    loss.update(probs, labels)
    empty = ref.counts == 0
    assert bool(empty.any()) and torch.equal(loss.gammas[empty], before[empty])
    assert bool(torch.isfinite(loss.gammas).all())
    # hand example: (.1, wrong) ×3, (.1, right), (.7, right), 2 bins of sizes [3, 2]: the
    # boundary would cut the run of .1's, so it moves past it: bin 0 = the four .1's
    # (acc 1/4), bin 1 = {.7} (acc 1), edge .7 — whatever the input order
    pairs = [(0.1, 0), (0.1, 1), (0.1, 0), (0.1, 0), (0.7, 1)]
    for rot in range(5):
        pr = pairs[rot:] + pairs[:rot]
        c = torch.tensor([p for p, _ in pr], dtype=torch.float64)
        pb = torch.cat([c[:, None], ((1 - c) / 9)[:, None].expand(-1, 9)], 1)
        y = torch.tensor([0 if ok else 1 for _, ok in pr])
        bins = F_cal.validation_bins(pb, y, 2)
        assert bins.acc.tolist() == [0.25, 1.0] and bins.edges.tolist() == [0.7]


def test_update_needs_a_sample_per_bin_and_probabilities() -> None:
    loss = build_loss("adafocal", n_bins=15)
    probs, labels = _val_set(0.9, 0.5, n=10)
    with pytest.raises(ValueError, match=r"adafocal.update.*expected at least n_bins=15 .*got 10"):
        loss.update(probs, labels)
    with pytest.raises(ValueError, match=r"adafocal.update.*probs: expected values in \[0, 1\]"):
        loss.update(torch.randn(40, 3) * 5, torch.zeros(40, dtype=torch.long))


def test_initial_bins_are_equal_width() -> None:
    loss = build_loss("adafocal", n_bins=4, gamma_init=2.5)
    assert loss.edges.tolist() == [0.25, 0.5, 0.75]
    assert loss.gammas.tolist() == [2.5] * 4
    assert build_loss("adafocal", n_bins=1).edges.numel() == 0


@pytest.mark.parametrize("n_bins", [10, 15, 20, 100])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_initial_edges_are_exactly_k_over_n_in_every_dtype(n_bins: int, dtype) -> None:
    # the float nearest to k/n is the edge: p_y written as k/n sits on edge k (upper bin,
    # [e_b, e_{b+1})) in float32 and float64 alike; torch.linspace's edges are off by an ulp
    loss = build_loss("adafocal", n_bins=n_bins)
    assert loss.edges.tolist() == [k / n_bins for k in range(1, n_bins)]
    on = torch.tensor([k / n_bins for k in range(1, n_bins)], dtype=dtype)
    sched = Schedule(torch.arange(n_bins, dtype=torch.float64), loss.edges)
    assert sched.select(on).tolist() == list(range(1, n_bins))
    below = torch.nextafter(on, torch.zeros_like(on))
    assert sched.select(below).tolist() == list(range(n_bins - 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_training_binning_at_edge_values(dtype: torch.dtype) -> None:
    # p_y exactly on an edge belongs to the upper bin [e_b, e_{b+1}); just below, to the lower
    z = torch.tensor([[1.0, 0.2, -0.5]], dtype=dtype)
    y = torch.tensor([0])
    p_y = torch.expm1(-torch.nn.functional.cross_entropy(z, y, reduction="none")) + 1
    loss = build_loss("adafocal", n_bins=2, reduction="none")
    loss.gammas.copy_(torch.tensor([5.0, -1.0], dtype=torch.float64))
    focal5 = F_cal.focal_loss(z, y, 5.0, "none")
    inverse1 = F_cal.inverse_focal_loss(z, y, 1.0, "none")
    loss.edges.fill_(float(p_y))
    assert torch.equal(loss(z, y), inverse1)
    loss.edges.fill_(float(torch.nextafter(p_y, torch.ones_like(p_y))))
    assert torch.equal(loss(z, y), focal5)
    # first bin open below, last open above
    loss.edges.fill_(1.0)
    assert torch.equal(loss(z, y), focal5)
    loss.edges.fill_(0.0)
    assert torch.equal(loss(z, y), inverse1)


def test_adadual_focal_updates_gamma_and_uses_dual_form() -> None:
    loss = build_loss("adadual_focal", n_bins=1, reduction="none")
    z = torch.log(torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64))
    y = torch.tensor([0])
    # γ = 1 initially: −(1 − 0.5 + 0.3)^1 · ln 0.5
    assert loss(z, y).item() == pytest.approx(0.8 * math.log(2), rel=1e-12)
    loss.update(*_val_set(0.95, 0.0))
    assert loss.gammas.item() == pytest.approx(math.exp(0.95))  # the authors' code never updates
    loss.gammas.fill_(-2.0)  # inverse dual form −(1 + p_y − p_j)^2 ln p_y = 1.2²·ln 2
    assert loss(z, y).item() == pytest.approx(1.44 * math.log(2), rel=1e-12)


def _trained(name: str = "adafocal", **params) -> AdaFocalLoss:
    loss = build_loss(name, n_bins=5, **params)
    g = torch.Generator().manual_seed(1)
    for step in (10, 20, 30):
        probs = torch.softmax(3 * torch.randn(60, 4, generator=g), dim=1)
        loss.update(probs, torch.randint(0, 4, (60,), generator=g), step=step)
    return loss  # type: ignore[return-value]


@pytest.mark.parametrize("name", ["adafocal", "adadual_focal", "calfocal"])
def test_state_round_trip_continues_exactly(name: str) -> None:
    loss = _trained(name, update_every=50)
    buf = io.BytesIO()
    torch.save(loss.state_dict(), buf)
    buf.seek(0)
    resumed = build_loss(name, n_bins=5, update_every=50)
    resumed.load_state_dict(torch.load(buf, weights_only=True))
    assert torch.equal(resumed.gammas, loss.gammas) and torch.equal(resumed.edges, loss.edges)
    assert resumed.history == loss.history and [r["step"] for r in loss.history] == [10, 20, 30]
    sd_a, sd_b = loss.state_dict(), resumed.state_dict()
    assert sd_a.keys() == sd_b.keys() and sd_a["_extra_state"] == sd_b["_extra_state"]
    probs = torch.softmax(torch.randn(60, 4), dim=1)
    labels = torch.randint(0, 4, (60,))
    assert loss.update(probs, labels) == resumed.update(probs, labels)
    assert torch.equal(resumed.gammas, loss.gammas)
    # the history a caller gets back is a copy: mutating it leaves the state alone
    resumed.update(probs, labels)["gammas"][0] = 123.0
    assert resumed.history[-1]["gammas"][0] != 123.0


def test_loading_state_of_another_configuration_is_refused() -> None:
    state = _trained(lam=1.0).state_dict()
    other = build_loss("adafocal", n_bins=5, lam=2.0)
    with pytest.raises(ValueError, match=r"adafocal.load_state_dict: expected state saved by"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="expected state saved by"):
        build_loss("adadual_focal", n_bins=5).load_state_dict(state)


def test_broadcast_state_without_distributed_is_a_noop() -> None:
    loss = _trained()
    before = (loss.gammas.clone(), loss.edges.clone(), list(loss.history))
    loss.broadcast_state()
    assert torch.equal(loss.gammas, before[0]) and loss.history == before[2]


def test_update_cost_is_vectorised() -> None:
    # 5k × 100 validation probabilities: one O(N log N) pass, well under the 20 ms budget
    # (bench/bench_losses.py measures it); here only a loose bound against Python loops.
    import time

    loss = build_loss("adafocal")
    probs = torch.softmax(torch.randn(5000, 100), dim=1)
    labels = torch.randint(0, 100, (5000,))
    loss.update(probs, labels)
    t0 = time.perf_counter()
    for _ in range(5):
        loss.update(probs, labels)
    assert (time.perf_counter() - t0) / 5 < 0.5


def test_the_registry_lists_the_three_adaptive_losses() -> None:
    assert ADAPTIVE == ["adadual_focal", "adafocal", "calfocal"]


@pytest.mark.parametrize("name", ADAPTIVE)
def test_adaptive_interface(name: str) -> None:
    assert build_loss(name).update_every == "epoch"
    loss = build_loss(name, n_bins=3, update_every=25)
    assert loss.adaptive and loss.update_every == 25 and loss.history == []
    assert loss.gammas.shape == (3,) and loss.edges.shape == (2,)
    probs, labels = _val_set(0.9, 0.5)
    step = torch.arange(10, dtype=torch.float64) * 1e-3  # distinct confidences, rows sum to 1
    probs[:, 0] += step
    probs[:, 1] -= step
    rec = loss.update(probs, labels)
    assert set(rec) == {"step", "edges", "c_val", "a_val", "counts", "gammas", "switched"}
    assert len(rec["edges"]) == 2 and all(len(rec[k]) == 3 for k in ("c_val", "gammas"))
    assert rec["counts"] == [4, 3, 3] and all(isinstance(v, float) for v in rec["gammas"])
    # one confidence for all: the tied run stays in bin 0, bins 1-2 are empty (NaN, γ finite)
    rec = loss.update(*_val_set(0.9, 0.5))
    assert rec["counts"] == [10, 0, 0] and rec["edges"] == [1.0, 1.0]
    assert math.isnan(rec["c_val"][1]) and all(math.isfinite(v) for v in rec["gammas"])
    assert not build_loss("focal").adaptive and not hasattr(build_loss("focal"), "update")
