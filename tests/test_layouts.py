"""Every public metric and post-hoc method accepts any memory layout of its arrays.

A transposed view, every other row (``x[::2]``) and a numpy array with negative strides hold the
same values as the contiguous array; each public function must return exactly what it returns on
the contiguous one (issue 22, item 7a: ``.view(-1)`` on a non-contiguous tensor used to raise
``RuntimeError: view size is not compatible with input tensor's size and stride``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import calibtune.losses.functional as LF
import calibtune.metrics as M
from calibtune.posthoc import build_posthoc, focal_calibration_map, list_posthoc, refinement_nll

N, K = 120, 6


def _problem() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, K, (N,), generator=g)
    z = torch.randn(N, K, generator=g, dtype=torch.float64)
    z[torch.arange(N // 2), y[: N // 2]] += 2.5
    # a coarse copy of half the rows: tied confidences, so equal-mass code paths see ties
    z[N // 2 :] = torch.round(z[N // 2 :])
    return z, torch.softmax(z, 1), y


def _transposed(x: torch.Tensor) -> torch.Tensor:
    # column-major storage: the same (N, K) values, strides (1, N)
    out = x.T.contiguous().T if x.ndim == 2 else x
    assert x.ndim != 2 or not out.is_contiguous()
    return out


def _every_other_row(x: torch.Tensor) -> torch.Tensor:
    # the rows of x at even positions of a twice-as-long buffer: x[::2] of that buffer
    big = torch.zeros((2 * x.shape[0], *x.shape[1:]), dtype=x.dtype)
    big[::2] = x
    out = big[::2]
    assert not out.is_contiguous()
    return out


def _numpy_reversed(x: torch.Tensor) -> np.ndarray:
    # negative strides (torch.as_tensor rejects them)
    out = np.ascontiguousarray(x.numpy()[::-1])[::-1]
    assert out.strides[0] < 0
    return out


LAYOUTS: dict[str, Callable[[torch.Tensor], Any]] = {
    "transposed": _transposed,
    "every_other_row": _every_other_row,
    "numpy_negative_strides": _numpy_reversed,
}


def _idx() -> torch.Tensor:
    return M.bootstrap_indices(N, 4, seed=1)


# name -> f(z, p, y) on the arrays as given; every array argument goes through the layout
CASES: dict[str, Callable[..., Any]] = {
    **{
        name: (lambda f: lambda z, p, y: f(p, y))(getattr(M, name))
        for name in (
            "ece",
            "mce",
            "adaece",
            "classwise_ece",
            "nll",
            "brier",
            "error",
            "ece_debiased",
            "ece_sweep",
            "smece",
            "aurc",
            "augrc",
            "risk_coverage",
            "selective_report",
        )
    },
    "ece_no_validation": lambda z, p, y: M.ece(p, y, validate_args=False),
    "classwise_ece_no_validation": lambda z, p, y: M.classwise_ece(p, y, validate_args=False),
    "reliability_table_width": lambda z, p, y: M.reliability_table(p, y, 7),
    "reliability_table_mass": lambda z, p, y: M.reliability_table(p, y, 7, binning="mass"),
    "calibration_report_probs": lambda z, p, y: M.calibration_report(probs=p, labels=y),
    "calibration_report_logits": lambda z, p, y: M.calibration_report(logits=z, labels=y),
    "bootstrap_values": lambda z, p, y: M.bootstrap_values(probs=p, labels=y, indices=_idx()),
    "bootstrap_report": lambda z, p, y: M.bootstrap_report(logits=z, labels=y, n_resamples=5),
    "entropy": lambda z, p, y: M.entropy(p),
    "msp": lambda z, p, y: M.msp(p),
    "energy": lambda z, p, y: M.energy(z),
    "ood_score": lambda z, p, y: M.ood_score(logits=z, score="msp"),
    "ood_auroc": lambda z, p, y: M.ood_auroc(p[: N // 2], p[N // 2 :]),
    "ood_aupr": lambda z, p, y: M.ood_aupr(in_logits=z[:40], out_logits=z[40:], score="energy"),
    "fpr_at_95_tpr": lambda z, p, y: M.fpr_at_95_tpr(p[:50], p[50:]),
    "roc_curve_points": lambda z, p, y: M.roc_curve_points(p[:70], p[70:]),
    # 1-D scores: a column of the (N, K) array is itself a strided view
    "auroc_from_scores": lambda z, p, y: M.auroc_from_scores(z[:60, 0], z[60:, 1]),
    "aupr_from_scores": lambda z, p, y: M.aupr_from_scores(z[:60, 0], z[60:, 1]),
    "fpr95_from_scores": lambda z, p, y: M.fpr95_from_scores(z[:60, 0], z[60:, 1]),
    "roc_from_scores": lambda z, p, y: M.roc_from_scores(z[:60, 0], z[60:, 1]),
    "validation_bins": lambda z, p, y: LF.validation_bins(p, y, 7),
    "focal_calibration_map": lambda z, p, y: focal_calibration_map(p, 1.5),
    "refinement_nll": lambda z, p, y: refinement_nll(z, y),
}


def _same(a: Any, b: Any, where: str) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b), where
        for i, (u, v) in enumerate(zip(a, b, strict=True)):
            _same(u, v, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=where)
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b, err_msg=where)
    else:
        assert a == b or (a != a and b != b), where  # floats: equal, or both NaN


def _laid_out(layout: str, z: torch.Tensor, p: torch.Tensor, y: torch.Tensor) -> tuple:
    lay = LAYOUTS[layout]
    # labels: a strided 1-D view (column 0 of an (N, 2) tensor), or the numpy reversed view
    y2 = torch.stack([y, y], 1)[:, 0] if layout != "numpy_negative_strides" else lay(y)
    return lay(z), lay(p), y2


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_metric_accepts_any_layout(case: str, layout: str) -> None:
    z, p, y = _problem()
    ref = CASES[case](z, p, y)
    got = CASES[case](*_laid_out(layout, z, p, y))
    _same(got, ref, case)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_bootstrap_top_label_accepts_strided_vectors(layout: str) -> None:
    _, p, y = _problem()
    conf, pred = p.max(1)
    correct = pred == y
    ref = M.bootstrap_top_label(conf, correct, _idx(), 7)
    c2 = torch.stack([conf, conf], 1)[:, 0]
    k2 = torch.stack([correct, correct], 1)[:, 0]
    assert not c2.is_contiguous()
    _same(M.bootstrap_top_label(c2, k2, _idx(), 7), ref, "bootstrap_top_label")


FAST = {"temperatures": [0.5, 1.0, 1.5, 2.0, 3.0]}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("name", list_posthoc())
def test_posthoc_fit_and_calibrate_accept_any_layout(name: str, layout: str) -> None:
    z, _, y = _problem()
    params = FAST if name.startswith("focal_ts") else {}
    ref = build_posthoc(name, **params).fit(z, y)
    lz, _, ly = _laid_out(layout, z, z, y)
    got = build_posthoc(name, **params).fit(lz, ly)
    _same(got.params(), ref.params(), f"{name}.params")
    _same(got.calibrate(lz), ref.calibrate(z), f"{name}.calibrate")
