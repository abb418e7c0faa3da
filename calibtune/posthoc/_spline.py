"""Spline calibration of the top-label confidence (Gupta et al. 2021).

Gupta, Rahimi, Ajanthan, Mensink, Sminchisescu, Hartley 2021, "Calibration of Neural Networks
using Splines" (ICLR), used as a post-hoc baseline in Ghosh et al. 2022 ("AdaFocal", App. E).

Fit (as the authors' ``get_recalibration_function``): sort the validation top-label confidences
s_(1) ≤ … ≤ s_(n) with their correctness a_(i); form the cumulative curves
Ã_i = Σ_{j≤i} a_(j)/n and S̃_i = Σ_{j≤i} s_(j)/n against the "percentile" x_i = (i−1)/(n−1);
least-squares fit a natural cubic spline with ``n_knots`` equally spaced knots on [0, 1] to
Ã − S̃ (the Kolmogorov–Smirnov-style calibration curve); its derivative plus s_(i) estimates the
accuracy at confidence s_(i). The recalibration function is the piecewise-linear interpolant of
(s_(i), accuracy_i), constant beyond the end points, and its output is clipped to [0, 1].

Differences from the reference code, all deliberate:

* linear interpolation weights the neighbours correctly (the reference's ``interpolated_function``
  swaps the two weights); tied validation confidences are merged into one node carrying their
  mean estimated accuracy (the reference keeps duplicates and picks one);
* everything is vectorised (numpy for the fit, torch on the logits' device for ``calibrate``).

Only the top-label confidence c is recalibrated to c'. The other classes share the remaining
mass 1 − c' in their original proportions, p'_j = p_j (1 − c')/(1 − c), so rows still sum to 1 —
except where that would lift the runner-up to c' or above (the spline asks for less confidence
than the runner-up would then have, which happens for inaccurate models): there the others'
shares are mixed toward uniform just enough to stay below c', which keeps the predicted class
while honouring c' exactly. Only a c' at or below chance (1/K) cannot be honoured; it is floored
a few ulps above 1/K. When c = 1 (all other classes exactly 0) the rest is spread uniformly.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from calibtune._registry import Param

from ._base import PosthocCalibrator
from ._temperature import ts_probs


def _natural_second_derivatives(n_knots: int, h: float) -> np.ndarray:
    """Matrix (n_knots, n_knots) mapping knot values y to second derivatives M of the natural
    cubic spline: M_0 = M_{n−1} = 0 and, inside,
    M_{i−1} + 4 M_i + M_{i+1} = 6/h² (y_{i−1} − 2 y_i + y_{i+1})."""
    m = n_knots - 2
    a = 4.0 * np.eye(m) + np.eye(m, k=1) + np.eye(m, k=-1)
    b = np.zeros((m, n_knots))
    i = np.arange(m)
    b[i, i], b[i, i + 1], b[i, i + 2] = 1.0, -2.0, 1.0
    inner = np.linalg.solve(a, b * (6.0 / h**2))
    zero = np.zeros((1, n_knots))
    return np.concatenate([zero, inner, zero])


def _segment(x: np.ndarray, n_knots: int, h: float) -> tuple[np.ndarray, np.ndarray]:
    j = np.clip(np.floor(x / h).astype(np.int64), 0, n_knots - 2)
    return j, x - j * h


def _value_basis(x: np.ndarray, n_knots: int, h: float) -> tuple[np.ndarray, np.ndarray]:
    """Rows mapping (M, y) at the knots to the spline value at x: (len(x), n_knots) each."""
    j, t = _segment(x, n_knots, h)
    bm, by = np.zeros((x.size, n_knots)), np.zeros((x.size, n_knots))
    r = np.arange(x.size)
    bm[r, j] = -(t**3) / (6 * h) + t**2 / 2 - h * t / 3
    bm[r, j + 1] = t**3 / (6 * h) - h * t / 6
    by[r, j] = 1 - t / h
    by[r, j + 1] = t / h
    return bm, by


def _deriv_basis(x: np.ndarray, n_knots: int, h: float) -> tuple[np.ndarray, np.ndarray]:
    """Rows mapping (M, y) at the knots to the spline's derivative at x."""
    j, t = _segment(x, n_knots, h)
    bm, by = np.zeros((x.size, n_knots)), np.zeros((x.size, n_knots))
    r = np.arange(x.size)
    bm[r, j] = -(t**2) / (2 * h) + t - h / 3
    bm[r, j + 1] = t**2 / (2 * h) - h / 6
    by[r, j] = -1 / h
    by[r, j + 1] = 1 / h
    return bm, by


def fit_natural_spline(x: np.ndarray, y: np.ndarray, n_knots: int) -> np.ndarray:
    """Least-squares natural cubic spline on equally spaced knots over [0, 1].

    x, y: (n,) data; returns the knot values (n_knots,)."""
    h = 1.0 / (n_knots - 1)
    m_from_y = _natural_second_derivatives(n_knots, h)
    bm, by = _value_basis(x, n_knots, h)
    design = bm @ m_from_y + by
    return np.linalg.lstsq(design, y, rcond=None)[0]


def natural_spline_derivative(knot_y: np.ndarray, x: np.ndarray) -> np.ndarray:
    n_knots = knot_y.size
    h = 1.0 / (n_knots - 1)
    bm, by = _deriv_basis(x, n_knots, h)
    return bm @ (_natural_second_derivatives(n_knots, h) @ knot_y) + by @ knot_y


def spline_recalibration_table(
    conf: np.ndarray, correct: np.ndarray, n_knots: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Nodes (xs, ys) of the recalibration function and the spline's knot values.

    conf, correct: (n,) float64 validation top-label confidences and 0/1 correctness.
    """
    order = np.argsort(conf, kind="stable")
    s, a = conf[order], correct[order]
    n = s.size
    cum_diff = (np.cumsum(a) - np.cumsum(s)) / n
    pct = np.linspace(0.0, 1.0, n)
    knot_y = fit_natural_spline(pct, cum_diff, n_knots)
    acc = natural_spline_derivative(knot_y, pct) + s
    xs, inverse = np.unique(s, return_inverse=True)
    ys = np.bincount(inverse, weights=acc) / np.bincount(inverse)
    return xs, ys, knot_y


def _interp(x: torch.Tensor, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """Piecewise-linear interpolation through (xs, ys), constant outside [xs[0], xs[-1]]."""
    if xs.numel() == 1:
        return ys.expand_as(x).clone()
    xc = x.clamp(xs[0], xs[-1])
    i = torch.searchsorted(xs, xc, right=True).clamp(1, xs.numel() - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (xc - x0) / (x1 - x0)


def rescale_top(p: torch.Tensor, new_top: torch.Tensor) -> torch.Tensor:
    """Replace each row's top probability by ``new_top`` and share the rest among the others.

    The other classes keep their proportions p_j / (1 − c); where that would put the runner-up
    at or above the new top probability c', their shares are mixed toward uniform just enough to
    stay below it: share_j = (1 − λ) p_j / (1 − c) + λ / (K − 1) with the smallest such λ. That
    is always possible for c' > 1/K, so c' is floored a few ulps above 1/K. Rows sum to 1 and
    the argmax is unchanged. Shapes: p (N, K), new_top (N,) -> (N, K).
    """
    k = p.shape[1]
    eps = torch.finfo(p.dtype).eps
    top = p.argmax(dim=1, keepdim=True)
    others = p.scatter(1, top, 0.0)
    rest = others.sum(1, keepdim=True)  # 1 − c without cancellation
    uniform = torch.full_like(p, 1.0 / (k - 1)).scatter_(1, top, 0.0)
    share = torch.where(rest > 0, others / rest.clamp_min(torch.finfo(p.dtype).tiny), uniform)
    c_new = new_top.unsqueeze(1).clamp(min=(1 + 64 * eps) / k, max=1.0)
    # largest share a non-top class may keep: (1 − c') · share < c'  ⇔  share < c' / (1 − c')
    runner_up = share.amax(1, keepdim=True)
    # margin for the rounding of λ, which is amplified by runner_up / limit
    limit = c_new / (1 - c_new) * (1 - 8 * eps) - 16 * eps * runner_up
    u = 1.0 / (k - 1)
    lam = torch.where(
        runner_up > limit, (runner_up - limit) / (runner_up - u).clamp_min(eps), 0.0
    ).clamp(0.0, 1.0)
    share = share * (1 - lam) + uniform * lam
    return (share * (1 - c_new)).scatter_(1, top, c_new)


_N_KNOTS = Param(
    "n_knots",
    kind="int",
    low=3,
    high=100,
    searchable=False,
    doc="equally spaced knots of the natural cubic spline (the authors use 6)",
)


class SplineCalibration(PosthocCalibrator):
    """Top-label spline recalibration of softmax(z) (Gupta et al. 2021, natural cubic spline).

    Fitted attributes: ``knots`` (the spline's ``n_knots`` knot values, float64 numpy),
    ``xs``/``ys`` (the recalibration function's nodes: validation confidences and estimated
    accuracies). `params` returns the knot values as ``{"knot_0": …, …}``.
    Shapes: fit(val_logits (N, K), val_labels (N,)); calibrate(logits (M, K)) -> (M, K).
    """

    name = "spline"
    PARAMS = (_N_KNOTS,)

    def __init__(self, n_knots: int = 6) -> None:
        super().__init__()
        self._configure(self._checked(locals()))

    def _configure(self, cfg: dict[str, Any]) -> None:
        self.n_knots: int = cfg["n_knots"]
        self.knots = np.full(self.n_knots, math.nan)
        self.xs = np.empty(0)
        self.ys = np.empty(0)

    def _fit(self, z: torch.Tensor, y: torch.Tensor) -> None:
        p = ts_probs(z.to(torch.float64), 1.0)
        conf, pred = p.max(dim=1)
        self.xs, self.ys, self.knots = spline_recalibration_table(
            conf.cpu().numpy(), (pred == y).to(torch.float64).cpu().numpy(), self.n_knots
        )

    def _calibrate(self, z: torch.Tensor) -> torch.Tensor:
        p = ts_probs(z, 1.0)
        # interpolate in float64: validation nodes that differ only beyond float32 precision
        # would otherwise collapse into zero-width segments
        f64 = torch.float64
        xs = torch.as_tensor(self.xs, dtype=f64, device=p.device)
        ys = torch.as_tensor(self.ys, dtype=f64, device=p.device)
        return rescale_top(p, _interp(p.amax(dim=1).to(f64), xs, ys).to(p.dtype))

    def _params(self) -> dict[str, float]:
        return {f"knot_{i}": float(v) for i, v in enumerate(self.knots)}
