"""Calibration metrics: hand-derived values, properties, and parity with independent packages."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from calibtune import metrics as M

# Five samples, K = 2, float64 so no confidence sits on a float32-rounded bin edge.
#   top-label conf: 0.9 (correct), 0.75 (wrong), 0.58 (correct), 0.55 (correct), 0.95 (correct)
FIVE_PROBS = np.array([[0.9, 0.1], [0.25, 0.75], [0.58, 0.42], [0.45, 0.55], [0.05, 0.95]])
FIVE_LABELS = np.array([0, 0, 0, 1, 1])


def test_ece_five_samples_hand_derived():
    # 5 equal-width bins (lo, hi]:
    #   (.4,.6]: {.58 ok, .55 ok}  acc 1, conf .565 -> |gap| .435, weight 2/5
    #   (.6,.8]: {.75 wrong}       acc 0, conf .75  -> .75,        weight 1/5
    #   (.8, 1]: {.9 ok, .95 ok}   acc 1, conf .925 -> .075,       weight 2/5
    # ECE = .4*.435 + .2*.75 + .4*.075 = .174 + .15 + .03 = .354 ; MCE = .75
    assert M.ece(FIVE_PROBS, FIVE_LABELS, n_bins=5) == pytest.approx(0.354, abs=1e-12)
    assert M.mce(FIVE_PROBS, FIVE_LABELS, n_bins=5) == pytest.approx(0.75, abs=1e-12)


def test_adaece_five_samples_hand_derived():
    # sorted conf .55 .58 .75 | .9 .95 (array_split sizes [3, 2]):
    #   group 0: acc 2/3, conf 1.88/3 -> |gap| = |0.6667 - 0.62667| = 0.04
    #   group 1: acc 1,   conf .925   -> 0.075
    # AdaECE = 3/5 * 0.04 + 2/5 * 0.075 = 0.054
    assert M.adaece(FIVE_PROBS, FIVE_LABELS, n_bins=2) == pytest.approx(0.054, abs=1e-12)


def test_adaece_counts_the_minimum_confidence_sample():
    # Only the lowest-confidence sample is wrong; the official code drops it (would give 0.1 gap
    # from conf alone). With it: one group of 3 -> acc 2/3, conf (0.6+0.9+0.9)/3 = 0.8 -> 0.1333.
    probs = np.array([[0.6, 0.4], [0.9, 0.1], [0.9, 0.1]])
    labels = np.array([1, 0, 0])
    assert M.adaece(probs, labels, n_bins=1) == pytest.approx(abs(2 / 3 - 0.8), abs=1e-12)
    # n_bins > N: empty groups are skipped, every sample is still in exactly one group
    assert M.adaece(probs, labels, n_bins=10) == pytest.approx((0.6 + 0.1 + 0.1) / 3, abs=1e-12)


def test_classwise_ece_hand_derived_and_zero_goes_to_first_bin():
    # K = 3, n_bins = 2, bins (0, .5], (.5, 1]; p = 0 must land in the first bin.
    probs = np.array([[0.7, 0.3, 0.0], [0.2, 0.2, 0.6], [0.5, 0.5, 0.0]])
    labels = np.array([0, 2, 1])
    # class 0: p [.7,.2,.5], y [1,0,0]: bin1 {.7:1} -> .3 ; bin0 {.2:0,.5:0} -> |0-.7| = .7
    #          ECE_0 = (.3 + .7)/3 = 1/3
    # class 1: p [.3,.2,.5], y [0,0,1]: bin0 all -> |1 - 1.0| = 0 -> ECE_1 = 0
    # class 2: p [0,.6,0], y [0,1,0]: bin0 {0,0} -> 0 ; bin1 {.6:1} -> .4 -> ECE_2 = .4/3
    expected = (1 / 3 + 0 + 0.4 / 3) / 3
    assert M.classwise_ece(probs, labels, n_bins=2) == pytest.approx(expected, abs=1e-12)


def test_classwise_ece_uses_probs_width_not_max_label():
    # labels only use classes 0,1 but K = 4 columns: the average is over 4 classes
    rng = np.random.default_rng(3)
    probs = rng.dirichlet(np.ones(4), size=50)
    labels = rng.integers(0, 2, size=50)
    per_class = [_naive_ece_binary(probs[:, k], (labels == k).astype(float), 15) for k in range(4)]
    assert M.classwise_ece(probs, labels) == pytest.approx(np.mean(per_class), abs=1e-12)


@pytest.mark.parametrize(("k", "concentration"), [(2, 1.0), (30, 0.05), (30, 5.0)])
def test_classwise_ece_matches_the_per_class_loop(k, concentration):
    # few or most entries above the first bin edge (classwise ECE bins only those, see
    # `_classwise_ece`), and p = 0 entries in the first bin
    rng = np.random.default_rng(k)
    probs = rng.dirichlet(np.full(k, concentration), size=400)
    labels = rng.integers(0, k, size=400)
    per_class = [_naive_ece_binary(probs[:, c], (labels == c).astype(float), 15) for c in range(k)]
    assert M.classwise_ece(probs, labels) == pytest.approx(np.mean(per_class), abs=1e-12)


def _naive_ece_binary(p: np.ndarray, t: np.ndarray, n_bins: int) -> float:
    """Reference: the loop of the focal_calibration code over (lo, hi] bins."""
    edges = np.linspace(0, 1, n_bins + 1)
    total = 0.0
    for b in range(n_bins):
        m = (p > edges[b]) & (p <= edges[b + 1]) if b else (p <= edges[1])
        if m.any():
            total += m.mean() * abs(t[m].mean() - p[m].mean())
    return total


def test_ece_equals_naive_loop_reference():
    rng = np.random.default_rng(7)
    probs = rng.dirichlet(np.ones(10) * 0.3, size=2000)
    labels = rng.integers(0, 10, size=2000)
    conf = probs.max(1)
    correct = (probs.argmax(1) == labels).astype(float)
    assert M.ece(probs, labels) == pytest.approx(_naive_ece_binary(conf, correct, 15), abs=1e-12)


def test_nll_brier_error_hand_derived():
    probs = np.array([[0.5, 0.25, 0.25], [0.1, 0.8, 0.1]])
    labels = np.array([0, 2])
    # NLL = -(log .5 + log .1)/2 ; Brier = ((.25+.0625+.0625) + (.01+.64+.81))/2 ; error = 1/2
    assert M.nll(probs, labels) == pytest.approx(-(np.log(0.5) + np.log(0.1)) / 2, abs=1e-12)
    assert M.brier(probs, labels) == pytest.approx((0.375 + 1.46) / 2, abs=1e-12)
    assert M.error(probs, labels) == pytest.approx(0.5)


def test_report_from_logits_matches_functions_and_exact_nll():
    rng = np.random.default_rng(0)
    logits = torch.tensor(rng.normal(size=(500, 7)) * 4)
    labels = torch.tensor(rng.integers(0, 7, size=500))
    rep = M.calibration_report(logits=logits, labels=labels)
    assert set(rep) == set(M.REPORT_KEYS)
    probs = torch.softmax(logits, 1)
    for key in ("ece", "adaece", "classwise_ece", "mce", "brier", "error", "smece", "ece_debiased"):
        assert rep[key] == pytest.approx(getattr(M, key)(probs, labels), abs=1e-12), key
    assert rep["ece_sweep"] == pytest.approx(M.ece_sweep(probs, labels), abs=1e-12)
    exact = float(torch.nn.functional.cross_entropy(logits, labels))
    assert rep["nll"] == pytest.approx(exact, abs=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ece_near_zero_when_labels_drawn_from_probs(seed):
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(200_000, 10, generator=g) * 2, 1)
    labels = torch.multinomial(probs, 1, generator=g).squeeze(1)
    rep = M.calibration_report(probs=probs, labels=labels)
    assert rep["ece"] < 0.005
    assert rep["adaece"] < 0.005
    assert rep["classwise_ece"] < 0.002
    assert rep["ece_debiased"] < 0.005
    # and a sharpened (over-confident) version is clearly miscalibrated
    sharp = torch.softmax(torch.log(probs) * 3, 1)
    assert M.ece(sharp, labels) > 0.1


def test_permutation_invariance():
    rng = np.random.default_rng(11)
    probs = rng.dirichlet(np.ones(5), size=300)
    labels = rng.integers(0, 5, size=300)
    perm = rng.permutation(300)
    a = M.calibration_report(probs=probs, labels=labels)
    b = M.calibration_report(probs=probs[perm], labels=labels[perm])
    assert set(a) == set(M.REPORT_KEYS)
    for k in M.REPORT_KEYS:
        assert a[k] == pytest.approx(b[k], abs=1e-12), k


# -- edges exactly k/n in every dtype ------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ece_issue_example_confidence_on_an_edge_goes_to_the_lower_bin(dtype):
    # 20 bins; conf .55 (right), .55 (wrong), .58 (right). .55 is edge 11 -> bin (.5, .55]:
    #   (.5, .55]: acc .5, conf .55 -> .05 x 2/3 ; (.55, .6]: acc 1, conf .58 -> .42 x 1/3
    #   ECE = .1/3 + .42/3 = .173333 (scikit-learn, verified_calibration); the upper bin gave .10667
    probs = torch.tensor([[0.45, 0.55], [0.45, 0.55], [0.42, 0.58]], dtype=dtype)
    labels = torch.tensor([1, 0, 1])
    assert M.ece(probs, labels, n_bins=20) == pytest.approx(0.52 / 3, abs=1e-6)


def _nearest(k: int, n: int, dtype: torch.dtype) -> float:
    """The value of ``dtype`` nearest to the exact k/n (checked with fractions)."""
    from fractions import Fraction

    v = torch.tensor(k / n, dtype=dtype)
    exact = Fraction(k, n)
    up = torch.nextafter(v, torch.tensor(2.0, dtype=dtype))
    down = torch.nextafter(v, torch.tensor(-1.0, dtype=dtype))
    err = abs(Fraction(float(v)) - exact)
    assert err <= abs(Fraction(float(up)) - exact) and err <= abs(Fraction(float(down)) - exact)
    return float(v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n_bins", [10, 15, 20, 100])
def test_values_on_every_edge_fall_in_the_lower_bin(dtype, n_bins):
    from calibtune.metrics.binning import equal_width_edges, equal_width_ids

    edges = equal_width_edges(n_bins, dtype, torch.device("cpu"))
    nearest = [_nearest(k, n_bins, dtype) for k in range(n_bins + 1)]
    assert edges.tolist() == nearest
    on = torch.tensor(nearest, dtype=dtype)
    expected = torch.tensor([0, *range(n_bins)])  # 0 -> bin 0, k/n -> bin k-1
    assert torch.equal(equal_width_ids(on, n_bins), expected)
    above = torch.nextafter(on[:-1], torch.tensor(2.0, dtype=dtype))
    assert torch.equal(equal_width_ids(above, n_bins), torch.arange(n_bins))
    # through the public table: binary rows whose top confidence is each edge above 1/2
    ks = [k for k in range(n_bins + 1) if 2 * k > n_bins]
    conf = torch.tensor([k / n_bins for k in ks], dtype=dtype)
    probs = torch.stack([conf, 1 - conf], 1)
    table = M.reliability_table(probs, torch.zeros(len(ks), dtype=torch.long), n_bins=n_bins)
    count = np.zeros(n_bins, dtype=int)
    count[[k - 1 for k in ks]] = 1
    np.testing.assert_array_equal(table["count"], count)
    np.testing.assert_array_equal(table["upper"], [k / n_bins for k in range(1, n_bins + 1)])


# -- equal-mass groups independent of the input order -----------------------------------------


def _rows(pairs: list[tuple[float, int]], k: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """(top-label confidence, correct) pairs as (N, k) float64 probabilities and labels: the
    top class is 0 (first maximum), the rest of the mass is spread evenly."""
    conf = torch.tensor([c for c, _ in pairs], dtype=torch.float64)
    rest = ((1 - conf) / (k - 1))[:, None].expand(-1, k - 1)
    probs = torch.cat([conf[:, None], rest], 1)
    labels = torch.tensor([0 if ok else 1 for _, ok in pairs])
    return probs, labels


def test_adaece_issue_example_keeps_ties_together_whatever_the_order():
    import itertools

    # (.1,0)(.1,1)(.1,0)(.1,0)(.7,1), 2 bins. Sorted confidences .1 .1 .1 .1 .7; array_split sizes
    # [3, 2] put the boundary between positions 2 and 3, both .1: it moves past the tied run
    # (Kumar et al.'s get_equal_bins: boundary (.1 + .1)/2 = .1, a confidence on a boundary goes
    # to the lower bin), so the bins are {.1 ×4} and {.7}:
    #   bin 0: conf .1, acc 1/4 -> 4/5 · |.25 − .1| = .12
    #   bin 1: conf .7, acc 1   -> 1/5 · |1 − .7|   = .06      AdaECE = .18
    # (ordering the ties by correctness instead gave {(.1,0) ×3} | {(.1,1), (.7,1)} -> .30, a
    # value that depends on the labels of tied samples, not only on the confidences)
    pairs = [(0.1, 0), (0.1, 1), (0.1, 0), (0.1, 0), (0.7, 1)]
    values = set()
    for perm in itertools.permutations(range(5)):
        probs, labels = _rows([pairs[i] for i in perm])
        values.add(round(M.adaece(probs, labels, n_bins=2), 12))
    assert values == {0.18}
    table = M.reliability_table(*_rows(pairs), n_bins=2, binning="mass")
    assert table["count"].tolist() == [4, 1]
    assert table["acc"].tolist() == [0.25, 1.0]
    assert table["lower"].tolist() == [0.0, 0.7] and table["upper"].tolist() == [0.7, 1.0]


def test_equal_mass_ties_swallowing_a_group_leave_it_empty():
    # 6 samples, 3 bins of 2: sorted .2 .5 .5 .5 .5 .9 -> groups {.2, .5…} would cut the run of
    # .5's twice; the run stays in group 0 (where it starts), group 1 is empty, group 2 = {.9}
    pairs = [(0.5, 1), (0.2, 0), (0.5, 0), (0.9, 1), (0.5, 1), (0.5, 0)]
    probs, labels = _rows(pairs)
    table = M.reliability_table(probs, labels, n_bins=3, binning="mass")
    assert table["count"].tolist() == [5, 0, 1]
    assert table["lower"].tolist() == [0.0, 0.9, 0.9] and table["upper"].tolist() == [0.9, 0.9, 1]
    # bin 0: conf (.2 + 4·.5)/5 = .44, acc 2/5 -> 5/6 · .04; bin 2: 1/6 · .1 -> (.2 + .1)/6 = .05
    assert M.adaece(probs, labels, n_bins=3) == pytest.approx(0.05, abs=1e-12)


def _tied(seed: int, n: int = 600) -> tuple[np.ndarray, np.ndarray]:
    """Confidences on a coarse grid (many ties across every group boundary)."""
    rng = np.random.default_rng(seed)
    conf = rng.integers(4, 10, size=n) / 10  # .4 … .9
    pairs = [(float(c), int(rng.random() < c)) for c in conf]
    probs, labels = _rows(pairs)
    return probs.numpy(), labels.numpy()


@pytest.mark.parametrize("seed", [0, 1])
def test_equal_mass_metrics_are_permutation_invariant_with_many_ties(seed):
    probs, labels = _tied(seed)
    rng = np.random.default_rng(100 + seed)
    ref = M.calibration_report(probs=probs, labels=labels, n_bins=7)
    ref_table = M.reliability_table(probs, labels, n_bins=7, binning="mass")
    moved = []
    for _ in range(5):
        perm = rng.permutation(len(labels))
        rep = M.calibration_report(probs=probs[perm], labels=labels[perm], n_bins=7)
        for k in ("adaece", "ece_sweep", "ece_debiased"):
            assert rep[k] == pytest.approx(ref[k], abs=1e-12), k
        table = M.reliability_table(probs[perm], labels[perm], n_bins=7, binning="mass")
        for k, v in ref_table.items():
            np.testing.assert_allclose(table[k], v, atol=1e-12, err_msg=k)
        # the old rule (stable sort on confidence alone) moves with the order on these inputs
        moved.append(_adaece_stable_on_conf(probs[perm], labels[perm], 7))
    assert max(moved) - min(moved) > 1e-3


def _adaece_stable_on_conf(probs: np.ndarray, labels: np.ndarray, n_bins: int) -> float:
    conf, correct = probs.max(1), (probs.argmax(1) == labels).astype(float)
    order = np.argsort(conf, kind="stable")
    groups = zip(
        np.array_split(conf[order], n_bins), np.array_split(correct[order], n_bins), strict=True
    )
    return sum(abs(a.sum() - c.sum()) for c, a in groups) / len(conf)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_adaece_equals_verified_calibration_equal_bins(seed):
    # Kumar et al.'s own package: ECE with get_equal_bins (midpoint boundaries between the
    # array_split groups, duplicates merged), p = 1, top-label — on data with many ties
    from calibration import get_ece_em

    probs, labels = _tied(seed, n=301)
    for n_bins in (2, 7, 15, 40):
        ref = get_ece_em(probs, labels, num_bins=n_bins)
        assert M.adaece(probs, labels, n_bins=n_bins) == pytest.approx(ref, abs=1e-12), n_bins
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(5), size=500)
    y = rng.integers(0, 5, size=500)
    assert M.adaece(p, y, n_bins=15) == pytest.approx(get_ece_em(p, y, num_bins=15), abs=1e-12)


def test_adaece_without_ties_is_numpy_array_split_of_the_stable_sort():
    # on tie-free data the tie rule changes nothing: the plain reference of the seed code
    rng = np.random.default_rng(21)
    probs = rng.dirichlet(np.ones(4), size=1001)
    labels = rng.integers(0, 4, size=1001)
    assert len(np.unique(probs.max(1))) == 1001
    ours = M.adaece(probs, labels, n_bins=15)
    assert ours == pytest.approx(_adaece_stable_on_conf(probs, labels, 15), abs=1e-12)


def test_ece_matches_torchmetrics_l1():
    from torchmetrics.functional.classification import multiclass_calibration_error

    rng = np.random.default_rng(5)
    for _ in range(3):
        probs = torch.tensor(rng.dirichlet(np.ones(10) * 0.5, size=3000), dtype=torch.float32)
        labels = torch.tensor(rng.integers(0, 10, size=3000))
        conf = probs.max(1).values
        # their bins are [lo, hi), ours (lo, hi]: they coincide when no confidence is an edge
        assert not torch.isclose(conf * 15, (conf * 15).round(), atol=1e-5).any()
        ref = float(
            multiclass_calibration_error(probs, labels, num_classes=10, n_bins=15, norm="l1")
        )
        assert M.ece(probs, labels) == pytest.approx(ref, abs=2e-6)
        ref_max = float(
            multiclass_calibration_error(probs, labels, num_classes=10, n_bins=15, norm="max")
        )
        assert M.mce(probs, labels) == pytest.approx(ref_max, abs=2e-6)


def test_smece_matches_relplot():
    import relplot

    rng = np.random.default_rng(9)
    logits = rng.normal(size=(4000, 10)) * 3
    labels = rng.integers(0, 10, size=4000)
    probs = torch.softmax(torch.tensor(logits), 1).numpy()
    f, y = relplot.multiclass_logits_to_confidences(probs, labels, probs=True)
    assert M.smece(probs, labels) == pytest.approx(float(relplot.smECE(f, y)), abs=1e-12)


def _smece_case(name: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if name == "overconfident":
        f = rng.uniform(0, 1, n)
        return f, (rng.uniform(0, 1, n) < f**1.5).astype(float)
    if name == "calibrated":
        f = rng.beta(5, 1, n)
        return f, (rng.uniform(0, 1, n) < f).astype(float)
    if name == "near_one":  # σ search ends below 0.01: grid sizes other than relplot's 1001
        return np.clip(rng.normal(0.99, 0.01, n), 0, 1), np.ones(n)
    return np.full(n, 0.3), np.zeros(n)  # "constant": one grid cell, every outcome 0


@pytest.mark.parametrize("name", ["overconfident", "calibrated", "near_one", "constant"])
@pytest.mark.parametrize("n", [1, 7, 1000, 20000])
def test_native_smece_matches_relplot(name, n):
    """The vectorised smECE (`metrics._smece`) against relplot's own on the same (f, y)."""
    import relplot

    from calibtune.metrics._smece import smooth_ece

    f, y = _smece_case(name, n, np.random.default_rng(n))
    assert smooth_ece(f, y) == pytest.approx(float(relplot.smECE(f, y)), abs=1e-9)


@pytest.mark.parametrize("temperature", [1.0, 0.3, 3.0])
def test_ece_debiased_matches_uncertainty_calibration(temperature):
    import calibration as cal

    rng = np.random.default_rng(int(temperature * 10))
    z = rng.normal(size=(5000, 10)) * 2
    p_true = torch.softmax(torch.tensor(z), 1)
    labels = torch.multinomial(p_true, 1, generator=torch.Generator().manual_seed(0)).squeeze(1)
    probs = torch.softmax(torch.tensor(z) / temperature, 1).numpy()
    ref = cal.lower_bound_scaling_ce(
        probs,
        labels.numpy(),
        p=2,
        debias=True,
        num_bins=15,
        binning_scheme=cal.get_equal_bins,
        mode="top-label",
    )
    ours = M.ece_debiased(probs, labels.numpy())
    assert ours == pytest.approx(ref, abs=1e-10)
    if temperature != 1.0:
        assert ours > 0.01  # miscalibrated models are detected


def _naive_sweep(conf: np.ndarray, correct: np.ndarray) -> float:
    order = np.argsort(conf, kind="stable")
    c, a = conf[order], correct[order]
    best = None
    for b in range(1, len(c) + 1):
        groups_c, groups_a = np.array_split(c, b), np.array_split(a, b)
        accs = [g.mean() for g in groups_a]
        if any(accs[i + 1] < accs[i] for i in range(b - 1)):
            break
        best = sum(
            len(gc) / len(c) * abs(ga.mean() - gc.mean())
            for gc, ga in zip(groups_c, groups_a, strict=True)
        )
    return best


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_ece_sweep_equals_naive_sweep(seed):
    rng = np.random.default_rng(seed)
    n = [50, 300, 1000, 2000][seed]
    probs = rng.dirichlet(np.ones(3) * 0.7, size=n)
    labels = np.array([rng.choice(3, p=p**2 / (p**2).sum()) for p in probs])
    conf, correct = probs.max(1), (probs.argmax(1) == labels).astype(float)
    assert M.ece_sweep(probs, labels) == pytest.approx(_naive_sweep(conf, correct), abs=1e-12)


def test_ece_sweep_hand_derived():
    # confidences .6 (wrong) .7 (ok) .8 (wrong) .9 (ok):
    #   b=1: monotone; b=2: groups {.6,.7},{.8,.9}: acc .5,.5 monotone;
    #   b=3: sizes [2,1,1]: acc .5, 0, 1 -> not monotone -> b* = 2
    #   ECE = .5*|.5-.65| + .5*|.5-.85| = .075 + .175 = .25
    probs = np.array([[0.6, 0.4], [0.7, 0.3], [0.8, 0.2], [0.9, 0.1]])
    labels = np.array([1, 0, 1, 0])
    assert M.ece_sweep(probs, labels) == pytest.approx(0.25, abs=1e-12)


def test_ece_sweep_fully_monotone_uses_every_bin():
    # accuracy rises with confidence everywhere: b* = N (one sample per bin)
    conf = np.linspace(0.5, 0.99, 200)
    probs = np.stack([conf, 1 - conf], 1)
    labels = np.zeros(200, dtype=int)
    assert M.ece_sweep(probs, labels) == pytest.approx(float(np.mean(1 - conf)), abs=1e-12)


def test_reliability_table_width_and_mass():
    t = M.reliability_table(FIVE_PROBS, FIVE_LABELS, n_bins=5)
    np.testing.assert_array_equal(t["count"], [0, 0, 2, 1, 2])
    np.testing.assert_allclose(t["lower"], [0, 0.2, 0.4, 0.6, 0.8], atol=1e-7)
    np.testing.assert_allclose(t["conf"][2:], [0.565, 0.75, 0.925])
    np.testing.assert_allclose(t["acc"][2:], [1, 0, 1])
    np.testing.assert_allclose(t["gap"][2:], [-0.435, 0.75, -0.075])
    assert np.isnan(t["conf"][:2]).all()
    m = M.reliability_table(FIVE_PROBS, FIVE_LABELS, n_bins=2, binning="mass")
    np.testing.assert_array_equal(m["count"], [3, 2])
    np.testing.assert_allclose(m["lower"], [0, 0.9])
    np.testing.assert_allclose(m["upper"], [0.9, 1])
    np.testing.assert_allclose(m["acc"], [2 / 3, 1])
    # the mass table reproduces adaece
    ada = (m["count"] / m["count"].sum() * np.abs(m["gap"])).sum()
    assert ada == pytest.approx(M.adaece(FIVE_PROBS, FIVE_LABELS, n_bins=2), abs=1e-12)


def test_float32_inputs_agree_with_float64():
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(2000, 4, generator=g) * 3, 1)
    labels = torch.randint(0, 4, (2000,), generator=g)
    rep32 = M.calibration_report(probs=probs, labels=labels)
    rep64 = M.calibration_report(probs=probs.double(), labels=labels)
    assert all(type(v) is float for v in rep32.values())
    for k in M.REPORT_KEYS:
        assert rep32[k] == pytest.approx(rep64[k], abs=1e-6), k
    assert rep32["ece"] > 0.01  # a non-trivial value, not two zeros


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_metrics_on_cuda_equal_cpu():
    g = torch.Generator().manual_seed(1)
    probs = torch.softmax(torch.randn(3000, 10, generator=g) * 3, 1)
    labels = torch.randint(0, 10, (3000,), generator=g)
    cpu = M.calibration_report(probs=probs, labels=labels)
    gpu = M.calibration_report(probs=probs.cuda(), labels=labels.cuda())
    for k in M.REPORT_KEYS:
        assert gpu[k] == pytest.approx(cpu[k], abs=1e-9), k
    table = M.reliability_table(probs.cuda(), labels.cuda(), binning="mass")
    np.testing.assert_allclose(
        table["gap"], M.reliability_table(probs, labels, binning="mass")["gap"]
    )


BAD_INPUTS = [
    (dict(probs=np.ones((3, 2)) / 2, labels=np.array([0, 1])), r"labels: expected shape \(3,\)"),
    (dict(probs=np.array([[0.5, np.nan], [0.5, 0.5]]), labels=[0, 1]), "probs: expected finite"),
    (dict(probs=np.ones((2, 2)) / 2, labels=[0, 2]), r"labels: expected values in \[0, 1\]"),
    (dict(probs=np.ones((2, 2)) / 2, labels=[0, -1]), r"labels: expected values in \[0, 1\]"),
    (dict(probs=np.ones((2, 2)) / 2, labels=[0, 1], n_bins=0), "n_bins: expected an integer >= 1"),
    (dict(probs=np.ones((2, 2)) / 2, labels=[0, 1], n_bins=2.5), "n_bins: expected an integer"),
    (dict(probs=np.array([[0.7, 0.7], [0.5, 0.5]]), labels=[0, 1]), "rows summing to 1"),
    (dict(probs=np.array([[2.0, -1.0], [0.5, 0.5]]), labels=[0, 1]), r"values in \[0, 1\]"),
    (dict(probs=np.ones(4) / 4, labels=[0]), r"expected a 2-D \(N, K\) array"),
    (dict(probs=np.ones((2, 2)) / 2, labels=[0.5, 1]), "integer class indices"),
]


@pytest.mark.parametrize("fn", [M.ece, M.adaece, M.classwise_ece, M.mce])
@pytest.mark.parametrize(("kwargs", "match"), BAD_INPUTS)
def test_bad_input_raises_clear_value_error(fn, kwargs, match):
    with pytest.raises(ValueError, match=match):
        fn(**kwargs)


def test_report_requires_exactly_one_of_logits_probs():
    with pytest.raises(ValueError, match="exactly one of logits= or probs=, got both"):
        M.calibration_report(logits=np.zeros((2, 2)), probs=np.ones((2, 2)) / 2, labels=[0, 1])
    with pytest.raises(ValueError, match="got neither"):
        M.calibration_report(labels=[0, 1])
    with pytest.raises(ValueError, match="logits: expected finite"):
        M.calibration_report(logits=np.array([[0.0, np.inf], [1, 2]]), labels=[0, 1])


def test_reliability_table_bad_binning():
    with pytest.raises(ValueError, match="binning: expected 'width' or 'mass', got 'quantile'"):
        M.reliability_table(FIVE_PROBS, FIVE_LABELS, binning="quantile")


@pytest.mark.parametrize("n_bins", [1, 3, 7, 40])
def test_snapped_boundaries_and_group_ids_are_one_rule(n_bins):
    # equal_mass_snap (boundaries, used by the sweep) and equal_mass_ids_sorted (ids, used by
    # AdaECE) describe the same groups; no run of tied confidences straddles a boundary
    from calibtune.metrics.binning import (
        equal_mass_ids_sorted,
        equal_mass_sizes,
        equal_mass_snap,
    )

    g = torch.Generator().manual_seed(n_bins)
    conf = (torch.randint(0, 6, (31,), generator=g).double() / 5).sort().values
    ids = equal_mass_ids_sorted(conf, n_bins)
    bounds = torch.cumsum(torch.tensor([0, *equal_mass_sizes(31, n_bins)]), 0)
    snapped = equal_mass_snap(conf, bounds)
    from_bounds = torch.repeat_interleave(torch.arange(n_bins), snapped.diff())
    assert torch.equal(ids, from_bounds)
    inner = snapped[(snapped > 0) & (snapped < 31)]
    assert bool((conf[inner - 1] < conf[inner]).all())
