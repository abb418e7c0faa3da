"""Non-parametric maps: top-label histogram binning and one-vs-rest isotonic regression.

Both are fitted on p = softmax(z) of the validation logits (float64) and can output exact zeros
(an empty-hit bin, an isotonic step at 0), which would make the NLL infinite. Every output row is
therefore mixed with the uniform distribution, q ← (1 − ε) q + ε / K (``eps``, default 1e-4), so
each probability is at least ε / K and the NLL of one sample at most log(K / ε) (≈ 11.5 for
K = 10). The mixing is affine and increasing, so it keeps the order of every row; ``eps = 0``
gives the raw maps (used for the parity tests).

* Histogram binning, top-label (Gupta & Ramdas 2022, "Top-label calibration and multiclass-to-
  binary reductions", ICLR, Alg. 2): for each class l, the validation samples predicted l are put
  into B_l = max(1, ⌊n_l / points_per_bin⌋) bins of their confidence max_k p_k — equal-mass bins
  (quantiles of those confidences, the paper's choice) or equal-width bins on [0, 1]; a bin
  predicts its validation accuracy. A bin is (e_{j−1}, e_j] (a confidence on an edge belongs to
  the lower bin, as netcal's ``np.digitize(right=True)``). The predicted class is kept by
  construction (the top-label map changes only the confidence); the other classes share 1 − c'
  as in spline calibration (`rescale_top`). A class never predicted on validation keeps its
  confidence.
* Isotonic regression, one-vs-rest (Zadrozny & Elkan 2002): for each class k an increasing
  step-free map of p_k fitted to 1[y = k] by pool-adjacent-violators (scipy's
  ``isotonic_regression`` on tied values averaged, as scikit-learn's ``IsotonicRegression``),
  evaluated by linear interpolation between its nodes and constant beyond them
  (``out_of_bounds="clip"``); the K outputs are renormalised to sum to 1 (a row of zeros becomes
  uniform). The renormalisation can change the argmax.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch
from scipy.optimize import isotonic_regression

from calibtune._registry import Param

from ._base import PosthocCalibrator
from ._spline import rescale_top

_EPS = Param(
    "eps",
    kind="float",
    low=0.0,
    high=0.01,
    searchable=False,
    doc="mass mixed with uniform, q ← (1 − ε) q + ε/K, so the NLL stays finite",
)


def mix_uniform(q: torch.Tensor, eps: float) -> torch.Tensor:
    """(1 − ε) q + ε / K row-wise: every entry ≥ ε / K, rows still sum to 1, order kept."""
    return q if eps == 0 else (1 - eps) * q + eps / q.shape[1]


def bin_edges(conf: np.ndarray, n_bins: int, binning: str) -> np.ndarray:
    """The n_bins − 1 inner edges: quantiles of ``conf`` ("mass") or j / n_bins ("width")."""
    inner = np.arange(1, n_bins) / n_bins
    return np.quantile(conf, inner) if binning == "mass" else inner


def fit_histogram(
    conf: np.ndarray, hits: np.ndarray, points_per_bin: int, binning: str
) -> tuple[np.ndarray, np.ndarray]:
    """Binary histogram binning: (inner edges (B−1,), bin values (B,)) for scores ``conf`` (n,)
    and 0/1 targets ``hits`` (n,), B = max(1, ⌊n / points_per_bin⌋). A bin is (e_{j−1}, e_j];
    an empty bin (possible with ties or equal-width bins) predicts the overall mean."""
    edges = bin_edges(conf, max(1, conf.size // points_per_bin), binning)
    idx = np.searchsorted(edges, conf, side="left")
    count = np.bincount(idx, minlength=edges.size + 1)
    total = np.bincount(idx, weights=hits, minlength=edges.size + 1)
    values = np.where(count > 0, total / np.maximum(count, 1), hits.mean())
    return edges, values


def _padded(rows: list[np.ndarray], fill: float, device: torch.device) -> torch.Tensor:
    """A (len(rows), max length) float64 tensor, each row right-padded with ``fill``."""
    width = max(2, max(r.size for r in rows))  # ≥ 2: a lookup may read one past a lone node
    out = np.full((len(rows), width), fill)
    for i, r in enumerate(rows):
        out[i, : r.size] = r
    return torch.as_tensor(out, dtype=torch.float64, device=device)


class HistogramBinning(PosthocCalibrator):
    """Top-label histogram binning (Gupta & Ramdas 2022), then ε-mixing with uniform.

    Fitted attributes: ``edges`` (K, B_max − 1) inner bin edges per predicted class (padded
    with +inf), ``values`` (K, B_max) bin accuracies (NaN for a class never predicted on
    validation: its confidence is kept). Keeps the argmax (the predicted class is part of the
    map). Shapes: fit(val_logits (N, K), val_labels (N,)); calibrate(logits (M, K)) -> (M, K).
    """

    name = "hist_binning"
    #: True: the top-label map keeps the predicted class and `rescale_top` keeps it on top
    preserves_argmax: ClassVar[bool] = True
    PARAMS = (
        Param(
            "points_per_bin",
            kind="int",
            low=1,
            high=100_000,
            doc="validation samples per bin; B_l = max(1, n_l // points_per_bin) (paper: 50)",
        ),
        Param(
            "binning",
            kind="categorical",
            choices=("mass", "width"),
            doc="equal-mass (the paper's) or equal-width bins",
        ),
        _EPS,
    )

    def __init__(self, points_per_bin: int = 50, binning: str = "mass", eps: float = 1e-4) -> None:
        super().__init__()
        self._configure(self._checked(locals()))

    def _configure(self, cfg: dict[str, Any]) -> None:
        self.points_per_bin: int = cfg["points_per_bin"]
        self.binning: str = cfg["binning"]
        self.eps: float = cfg["eps"]
        self.edges = torch.empty(0)
        self.values = torch.empty(0)

    def _fit(self, z: torch.Tensor, y: torch.Tensor) -> None:
        conf, pred = torch.softmax(z.to(torch.float64), dim=1).max(dim=1)
        hits = (pred == y).to(torch.float64).cpu().numpy()
        conf_np, pred_np = conf.cpu().numpy(), pred.cpu().numpy()
        edges, values = [], []
        for label in range(z.shape[1]):  # one binary problem per class, as in the paper
            mask = pred_np == label
            if not mask.any():
                edges.append(np.empty(0))
                values.append(np.array([math.nan]))
                continue
            e, v = fit_histogram(conf_np[mask], hits[mask], self.points_per_bin, self.binning)
            edges.append(e)
            values.append(v)
        self.edges = _padded(edges, math.inf, z.device)
        self.values = _padded(values, math.nan, z.device)

    def _calibrate(self, z: torch.Tensor) -> torch.Tensor:
        p = torch.softmax(z.to(torch.float64), dim=1)
        conf, pred = p.max(dim=1)
        edges, values = self.edges.to(z.device), self.values.to(z.device)
        idx = (edges[pred] < conf[:, None]).sum(1)  # bin (e_{j−1}, e_j]
        new = values[pred, idx]
        new = torch.where(torch.isnan(new), conf, new)
        # in the output dtype: rescale_top's margin keeps the top class strictly on top there
        return mix_uniform(rescale_top(p.to(z.dtype), new.to(z.dtype)), self.eps)

    def _params(self) -> dict[str, float]:
        fitted = ~torch.isnan(self.values[:, 0])
        bins = (~torch.isnan(self.values)).sum()
        return {"bins": float(bins), "classes_fitted": float(fitted.sum())}


def fit_isotonic(x: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nodes (xs, ys) of the increasing least-squares fit of ``t`` (n,) on ``x`` (n,).

    Tied x are averaged first (weights = their counts), then pool-adjacent-violators; only the
    two ends of each constant run are kept (the interpolant is unchanged), as scikit-learn does.
    """
    xs, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    means = np.bincount(inverse, weights=t) / counts
    ys = isotonic_regression(means, weights=counts.astype(np.float64), increasing=True).x
    if ys.size > 2:
        inner = (ys[1:-1] != ys[:-2]) | (ys[1:-1] != ys[2:])
        keep = np.concatenate([[True], inner, [True]])
        xs, ys = xs[keep], ys[keep]
    return xs, ys


class IsotonicCalibration(PosthocCalibrator):
    """One-vs-rest isotonic regression on softmax(z), renormalised, then ε-mixing.

    Fitted attributes: ``xs``/``ys`` (K, M) per-class nodes (padded: xs with +inf, ys with the
    last value), ``n_nodes`` (K,). Can change the argmax (each class has its own map).
    Shapes: fit(val_logits (N, K), val_labels (N,)); calibrate(logits (M, K)) -> (M, K).
    """

    name = "isotonic"
    #: False: per-class monotone maps followed by renormalisation can reorder the classes
    preserves_argmax: ClassVar[bool] = False
    PARAMS = (_EPS,)

    def __init__(self, eps: float = 1e-4) -> None:
        super().__init__()
        self._configure(self._checked(locals()))

    def _configure(self, cfg: dict[str, Any]) -> None:
        self.eps: float = cfg["eps"]
        self.xs = torch.empty(0)
        self.ys = torch.empty(0)
        self.n_nodes = torch.empty(0, dtype=torch.int64)

    def _fit(self, z: torch.Tensor, y: torch.Tensor) -> None:
        p = torch.softmax(z.to(torch.float64), dim=1).cpu().numpy()
        y_np = y.cpu().numpy()
        nodes = [fit_isotonic(p[:, k], (y_np == k).astype(np.float64)) for k in range(p.shape[1])]
        self.n_nodes = torch.tensor([xs.size for xs, _ in nodes], device=z.device)
        self.xs = _padded([xs for xs, _ in nodes], math.inf, z.device)
        last = self.n_nodes - 1
        ys = _padded([ys for _, ys in nodes], 0.0, z.device)
        pad = torch.arange(ys.shape[1], device=z.device)[None, :] > last[:, None]
        self.ys = torch.where(pad, ys.gather(1, last[:, None]), ys)

    def _calibrate(self, z: torch.Tensor) -> torch.Tensor:
        xs, ys, n = self.xs.to(z.device), self.ys.to(z.device), self.n_nodes.to(z.device)
        x = torch.softmax(z.to(torch.float64), dim=1).T.contiguous()  # (K, M): one row per class
        last = (n - 1)[:, None]
        xc = torch.minimum(torch.maximum(x, xs[:, :1]), xs.gather(1, last))
        hi = torch.searchsorted(xs, xc, right=True)
        hi = torch.minimum(hi.clamp_min(1), last.clamp_min(1))
        lo = hi - 1
        x0, x1, y0, y1 = xs.gather(1, lo), xs.gather(1, hi), ys.gather(1, lo), ys.gather(1, hi)
        span = x1 - x0
        # one node (or the padding beyond it): the class's map is a constant
        ok = torch.isfinite(span) & (span > 0)
        frac = torch.where(ok, (xc - x0) / torch.where(ok, span, 1.0), 0.0)
        q = (y0 + (y1 - y0) * frac).T.contiguous().clamp(0.0, 1.0)
        total = q.sum(1, keepdim=True)
        q = torch.where(total > 0, q / total.clamp_min(torch.finfo(q.dtype).tiny), 1 / q.shape[1])
        return mix_uniform(q, self.eps).to(z.dtype)

    def _params(self) -> dict[str, float]:
        return {"nodes_mean": float(self.n_nodes.double().mean())}
