"""Ensemble temperature scaling (ETS): a convex mix of TS, original and uniform probabilities.

Zhang, Kailkhura, Han 2020, "Mix-n-Match: Ensemble and Compositional Methods for Uncertainty
Calibration in Deep Learning" (ICML), used as a post-hoc baseline in Ghosh et al. 2022
("AdaFocal", App. E):

    p = w_ts · softmax(z / T) + w_orig · softmax(z) + w_unif · 1/K,   w ∈ simplex.

Fitting follows the authors' code (``ets_calibrate``): first T by minimising the loss of plain
temperature scaling over T ∈ [0.05, 5], then the three weights by minimising the same loss over
the simplex (SLSQP from w = (1, 0, 0)). The loss is the mean squared error against one-hot labels
averaged over N·K entries (``loss="mse"``, the authors' default) or the NLL (``loss="nll"``).
Differences from the reference code: T is found by bounded Brent instead of L-BFGS-B (same
objective and bounds); the MSE over the weights is evaluated through its exact 3×3 quadratic
form (w'Aw − 2b'w + c)/(NK) instead of re-mixing N×K arrays, and everything runs in float64.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from scipy.optimize import minimize, minimize_scalar

from calibtune._registry import Param

from ._base import PosthocCalibrator
from ._temperature import ts_probs

# Bounds on T of the reference implementation.
T_BOUNDS = (0.05, 5.0)


def _ts_loss(z64: torch.Tensor, y: torch.Tensor, t: float, loss: str) -> float:
    if loss == "nll":
        lp = torch.log_softmax(z64 / t, dim=-1)
        return float(-lp.gather(1, y[:, None]).mean())
    p = torch.softmax(z64 / t, dim=-1)
    # mean over N·K of (p − onehot)²: (Σ p² − 2 p_y + 1) / K per row
    sq = (p * p).sum(-1) - 2 * p.gather(1, y[:, None]).squeeze(1) + 1
    return float(sq.mean() / p.shape[1])


def _fit_weights(comps: list[torch.Tensor], y: torch.Tensor, loss: str) -> np.ndarray:
    """argmin over the simplex of the loss of Σ_i w_i comps[i] (each (N, K) probabilities)."""
    n, k = comps[0].shape
    if loss == "mse":
        flat = torch.stack([c.reshape(-1) for c in comps])  # (3, N·K)
        a = (flat @ flat.T).cpu().numpy()
        b = torch.stack([c.gather(1, y[:, None]).sum() for c in comps]).cpu().numpy()
        nk = float(n * k)

        def fun(w: np.ndarray) -> float:
            return float((w @ a @ w - 2 * b @ w + n) / nk)

        def jac(w: np.ndarray) -> np.ndarray:
            return (2 * a @ w - 2 * b) / nk
    else:
        py = torch.stack([c.gather(1, y[:, None]).squeeze(1) for c in comps], 1).cpu().numpy()
        tiny = np.finfo(np.float64).tiny

        def fun(w: np.ndarray) -> float:
            return float(-np.mean(np.log(np.maximum(py @ w, tiny))))

        def jac(w: np.ndarray) -> np.ndarray:
            return -np.mean(py / np.maximum(py @ w, tiny)[:, None], axis=0)

    res = minimize(
        fun,
        np.array([1.0, 0.0, 0.0]),
        jac=jac,
        method="SLSQP",
        bounds=[(0.0, 1.0)] * 3,
        constraints={"type": "eq", "fun": lambda w: np.sum(w) - 1.0},
        tol=1e-12,
    )
    w = np.clip(res.x, 0.0, 1.0)
    return w / w.sum()


_LOSS = Param(
    "loss",
    kind="categorical",
    choices=("mse", "nll"),
    doc="loss for T and the weights: mse (the authors' default) or nll",
)


class EnsembleTemperatureScaling(PosthocCalibrator):
    """p = w_ts softmax(z/T) + w_orig softmax(z) + w_unif / K (Zhang et al. 2020, Mix-n-Match).

    Fitted attributes: ``T``, ``w_ts``, ``w_orig``, ``w_unif`` (non-negative, summing to 1).
    The argmax is unchanged whenever w_ts + w_orig > 0 (both components share the logits'
    order; the uniform term adds a constant). ``loss``: ``"mse"`` (default, as the authors'
    ``ets_calibrate``) or ``"nll"``, used for both T and the weights.
    Shapes: fit(val_logits (N, K), val_labels (N,)); calibrate(logits (M, K)) -> (M, K).
    """

    name = "ets"
    PARAMS = (_LOSS,)

    def __init__(self, loss: str = "mse") -> None:
        super().__init__()
        self._configure(self._checked(locals()))

    def _configure(self, cfg: dict[str, Any]) -> None:
        self.loss: str = cfg["loss"]
        self.T: float = math.nan
        self.w_ts: float = math.nan
        self.w_orig: float = math.nan
        self.w_unif: float = math.nan

    def _fit(self, z: torch.Tensor, y: torch.Tensor) -> None:
        z64 = z.to(torch.float64)
        res = minimize_scalar(
            lambda t: _ts_loss(z64, y, t, self.loss),
            bounds=T_BOUNDS,
            method="bounded",
            options={"xatol": 1e-9},
        )
        self.T = float(res.x)
        k = z.shape[1]
        comps = [ts_probs(z64, self.T), ts_probs(z64, 1.0), torch.full_like(z64, 1.0 / k)]
        w = _fit_weights(comps, y, self.loss)
        self.w_ts, self.w_orig, self.w_unif = (float(v) for v in w)

    def _calibrate(self, z: torch.Tensor) -> torch.Tensor:
        k = z.shape[1]
        return self.w_ts * ts_probs(z, self.T) + self.w_orig * ts_probs(z, 1.0) + self.w_unif / k

    def _params(self) -> dict[str, float]:
        return {"T": self.T, "w_ts": self.w_ts, "w_orig": self.w_orig, "w_unif": self.w_unif}
