"""OOD scores and detection metrics: orientation, hand values and parity with scikit-learn."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

from calibtune import metrics as M


def _sets(seed: int, ties: bool = False):
    rng = np.random.default_rng(seed)
    in_logits = rng.normal(size=(400, 10)) * 4
    out_logits = rng.normal(size=(300, 10)) * 1.5
    if ties:  # quantised logits create many tied scores
        in_logits, out_logits = np.round(in_logits), np.round(out_logits)
    in_p = torch.softmax(torch.tensor(in_logits), 1)
    out_p = torch.softmax(torch.tensor(out_logits), 1)
    return in_logits, out_logits, in_p, out_p


def test_entropy_msp_energy_hand_values():
    p = np.array([[0.5, 0.5], [1.0, 0.0]])
    np.testing.assert_allclose(M.entropy(p).numpy(), [np.log(2), 0.0])
    np.testing.assert_allclose(M.msp(p).numpy(), [0.5, 1.0])
    z = np.array([[0.0, 0.0], [1.0, 2.0]])
    np.testing.assert_allclose(M.energy(z).numpy(), [-np.log(2), -np.log(np.e + np.e**2)])


@pytest.mark.parametrize("score", ["entropy", "msp", "energy"])
@pytest.mark.parametrize("ties", [False, True])
def test_auroc_aupr_roc_equal_sklearn(score, ties):
    in_z, out_z, in_p, out_p = _sets(1, ties)
    s_in = M.ood_score(in_p, in_z, score).numpy()
    s_out = M.ood_score(out_p, out_z, score).numpy()
    y = np.r_[np.zeros(len(s_in)), np.ones(len(s_out))]
    s = np.r_[s_in, s_out]
    kw = dict(in_logits=in_z, out_logits=out_z) if score == "energy" else {}
    args = () if score == "energy" else (in_p, out_p)
    assert M.ood_auroc(*args, score=score, **kw) == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    assert M.ood_aupr(*args, score=score, **kw) == pytest.approx(
        average_precision_score(y, s), abs=1e-12
    )
    fpr, tpr, thr = M.roc_curve_points(*args, score=score, **kw)
    rfpr, rtpr, rthr = roc_curve(y, s, drop_intermediate=False)
    np.testing.assert_allclose(fpr, rfpr, atol=1e-12)
    np.testing.assert_allclose(tpr, rtpr, atol=1e-12)
    np.testing.assert_allclose(thr[1:], rthr[1:], atol=1e-12)
    # FPR@95: first ROC point whose TPR reaches 0.95, from sklearn's curve
    expected = rfpr[np.argmax(rtpr >= 0.95)]
    assert M.fpr_at_95_tpr(*args, score=score, **kw) == pytest.approx(expected, abs=1e-12)


def test_orientation_confident_in_distribution_gives_high_auroc():
    _, _, in_p, out_p = _sets(2)
    assert M.ood_auroc(in_p, out_p, "entropy") > 0.9
    assert M.ood_auroc(in_p, out_p, "msp") > 0.8
    assert M.ood_auroc(out_p, in_p, "entropy") < 0.1  # swapping the sets flips it


def test_auroc_hand_derived():
    # in scores [0.1, 0.4], out scores [0.35, 0.8]: pairs (out > in): 0.35>0.1, 0.8>0.1, 0.8>0.4
    # -> 3 of 4 pairs -> AUROC 0.75 ; AP: ranks 0.8(+) 0.4(-) 0.35(+) 0.1(-) -> (1 + 2/3)/2
    assert M.auroc_from_scores([0.1, 0.4], [0.35, 0.8]) == pytest.approx(0.75)
    assert M.aupr_from_scores([0.1, 0.4], [0.35, 0.8]) == pytest.approx((1 + 2 / 3) / 2)
    # a tie between an in and an out score counts one half
    assert M.auroc_from_scores([0.5], [0.5]) == pytest.approx(0.5)


def test_ood_bad_inputs():
    with pytest.raises(ValueError, match="score: expected one of entropy, msp, energy, got 'max'"):
        M.ood_auroc(np.ones((2, 2)) / 2, np.ones((2, 2)) / 2, score="max")
    with pytest.raises(ValueError, match="score 'energy': expected logits="):
        M.ood_auroc(np.ones((2, 2)) / 2, np.ones((2, 2)) / 2, score="energy")
    with pytest.raises(ValueError, match="in_scores: expected finite scores"):
        M.auroc_from_scores([np.nan, 1.0], [0.5])
    with pytest.raises(ValueError, match="out_scores: expected a non-empty 1-D array"):
        M.auroc_from_scores([1.0], [])
