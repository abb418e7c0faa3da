"""Affine maps on logits or log-probabilities: vector scaling, matrix scaling, Dirichlet.

All three fit q = softmax(x Wᵀ + b) on validation data by minimising the mean negative
log-likelihood plus the ODIR penalty of Kull et al. 2019 ("Beyond temperature scaling: Obtaining
well-calibrated multi-class probabilities with Dirichlet calibration", NeurIPS, Sec. 4):

    L(W, b) = −1/N Σ_n log q_{n, y_n} + λ · 1/(K(K−1)) Σ_{i≠j} W_ij² + μ · 1/K Σ_j b_j²

(λ on the mean squared off-diagonal entry, μ on the mean squared intercept; the diagonal is not
penalised). The inputs x (N, K) are

* vector scaling (Guo et al. 2017, "On Calibration of Modern Neural Networks", ICML): the logits
  z, with W = diag(v) — q = softmax(v ⊙ z + b); no off-diagonal entries, so only μ applies;
* matrix scaling (Guo et al. 2017): the logits z, full W (MS-ODIR in Kull et al. with λ, μ > 0);
* Dirichlet calibration (Kull et al. 2019): the log-probabilities log softmax(z), full W
  (Dir-ODIR with λ, μ > 0) — the paper's "fully parametrised" Dirichlet map.

Fitting is convex (a multinomial logistic regression with an L2 penalty) and runs in float64
with `torch.optim.LBFGS` (strong-Wolfe line search) from the identity map W = I, b = 0, on the
logits' device. None of the three keeps the argmax in general: a per-class scale or an intercept
can reorder the classes (see `preserves_argmax`).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch

from calibtune._registry import Param

from ._base import PosthocCalibrator

#: L-BFGS stops when the largest gradient entry (in the standardised parametrisation) is below
#: this; the objective is O(1) and float64
GRAD_TOL = 1e-9


def affine_scores(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """x Wᵀ + b, with a (K,) ``w`` meaning diag(w): (N, K) scores."""
    return x * w + b if w.dim() == 1 else x @ w.T + b


def odir_objective(
    x: torch.Tensor,
    y: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor,
    reg_lambda: float,
    reg_mu: float,
) -> torch.Tensor:
    """Mean NLL of softmax(x Wᵀ + b) plus the ODIR penalty (module docstring).

    x (N, K) features, y (N,) labels, w (K,) diagonal or (K, K) full, b (K,). Returns a scalar.
    """
    k = x.shape[1]
    loss = torch.nn.functional.cross_entropy(affine_scores(x, w, b), y)
    if reg_lambda and w.dim() == 2 and k > 1:
        off = w - torch.diag_embed(torch.diagonal(w))
        loss = loss + reg_lambda * (off * off).sum() / (k * (k - 1))
    if reg_mu:
        loss = loss + reg_mu * (b * b).sum() / k
    return loss


def canonical(w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The (W, b) with the smallest ODIR penalty among those giving the same probabilities.

    softmax(x Wᵀ + b) is unchanged by b → b + c·1 and, for a full W, by W → W + 1uᵀ (which adds
    u·x to every score). The penalty is smallest for a zero-mean b and, per column j, zero-mean
    off-diagonal entries; optimising over this representative removes the directions along
    which only the (small) penalty curves, which otherwise stall L-BFGS.
    """
    b = b - b.mean()
    k = b.shape[0]
    if w.dim() == 1 or k < 2:
        return w, b
    off_mean = (w.sum(0) - torch.diagonal(w)) / (k - 1)
    return w - off_mean[None, :], b


def fit_odir(
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    diagonal: bool,
    reg_lambda: float,
    reg_mu: float,
    max_iter: int,
) -> tuple[torch.Tensor, torch.Tensor, float, int]:
    """(W, b, final objective, L-BFGS iterations) minimising `odir_objective` from W = I, b = 0.

    x (N, K) float64 features; W is (K,) when ``diagonal`` else (K, K); b (K,), both
    `canonical`. L-BFGS runs on standardised features x' = (x − m) / s (log-probabilities span
    tens of units, which makes the raw problem ill-conditioned): scores = x' Vᵀ + c with
    W = V / s (column-wise), b = c − W m — the same objective, reparametrised.
    """
    m = x.mean(0)
    s = x.std(0)
    s = torch.where(s > 0, s, torch.ones_like(s))
    v0 = s.clone() if diagonal else torch.diag(s)
    v = v0.requires_grad_(True)
    c = m.clone().requires_grad_(True)  # b = c − W m = 0 at W = I

    def unpack() -> tuple[torch.Tensor, torch.Tensor]:
        w = v / s
        return canonical(w, c - (w * m if diagonal else w @ m))

    opt = torch.optim.LBFGS(
        [v, c],
        lr=1.0,
        max_iter=max_iter,
        max_eval=2 * max_iter,
        tolerance_grad=GRAD_TOL,
        tolerance_change=1e-15,
        history_size=20,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = odir_objective(x, y, *unpack(), reg_lambda, reg_mu)
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        w, b = unpack()
        final = float(odir_objective(x, y, w, b, reg_lambda, reg_mu))
    n_iter = int(opt.state[v].get("n_iter", 0))  # LBFGS keeps its state on the first param
    return w, b, final, n_iter


_REG_LAMBDA = Param(
    "reg_lambda",
    kind="float",
    low=0.0,
    doc="λ: weight of the mean squared off-diagonal entry of W (ODIR)",
)
_REG_MU = Param("reg_mu", kind="float", low=0.0, doc="μ: weight of the mean squared intercept")
_MAX_ITER = Param(
    "max_iter", kind="int", low=1, high=100_000, searchable=False, doc="L-BFGS iterations"
)


class _AffineCalibrator(PosthocCalibrator):
    """Shared fit/calibrate of the three affine maps; subclasses choose the features and W."""

    #: False: a per-class scale, an intercept or off-diagonal weights can reorder the classes
    preserves_argmax: ClassVar[bool] = False
    diagonal: ClassVar[bool] = False
    on_log_probs: ClassVar[bool] = False

    def _configure(self, cfg: dict[str, Any]) -> None:
        self.reg_lambda: float = cfg.get("reg_lambda", 0.0)
        self.reg_mu: float = cfg["reg_mu"]
        self.max_iter: int = cfg["max_iter"]
        self.W: torch.Tensor = torch.empty(0)
        self.b: torch.Tensor = torch.empty(0)
        self.objective: float = math.nan
        self.n_iter: int = 0

    def _features(self, z: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(z, dim=1) if self.on_log_probs else z

    def _fit(self, z: torch.Tensor, y: torch.Tensor) -> None:
        x = self._features(z.to(torch.float64))
        self.W, self.b, self.objective, self.n_iter = fit_odir(
            x,
            y,
            diagonal=self.diagonal,
            reg_lambda=self.reg_lambda,
            reg_mu=self.reg_mu,
            max_iter=self.max_iter,
        )

    def _calibrate(self, z: torch.Tensor) -> torch.Tensor:
        w, b = self.W.to(z.device), self.b.to(z.device)
        x = self._features(z.to(torch.float64))
        return torch.softmax(affine_scores(x, w, b), dim=1).to(z.dtype)

    def _params(self) -> dict[str, float]:
        """Summaries, not the K² entries (a metrics log is no place for a 100×100 matrix; the
        full ``W`` and ``b`` are attributes): the mean diagonal weight, the largest off-diagonal
        and intercept magnitudes, and the final objective (``n_iter`` stays an attribute: it
        may differ between devices)."""
        diag = self.W if self.diagonal else torch.diagonal(self.W)
        out = {"w_diag_mean": float(diag.mean()), "b_absmax": float(self.b.abs().max())}
        if not self.diagonal:
            off = self.W - torch.diag_embed(diag)
            out["w_offdiag_absmax"] = float(off.abs().max())
        return {**out, "objective": self.objective}


class VectorScaling(_AffineCalibrator):
    """q = softmax(v ⊙ z + b) on the logits (Guo et al. 2017), intercept penalty μ/K Σ b².

    Fitted attributes: ``W`` (the per-class scales v, (K,)), ``b`` (K,), ``objective``.
    Can change the argmax (a per-class scale or intercept reorders close classes).
    Shapes: fit(val_logits (N, K), val_labels (N,)); calibrate(logits (M, K)) -> (M, K).
    """

    name = "vector_scaling"
    diagonal = True
    PARAMS = (_REG_MU, _MAX_ITER)

    def __init__(self, reg_mu: float = 0.0, max_iter: int = 500) -> None:
        super().__init__()
        self._configure(self._checked(locals()))


class MatrixScaling(_AffineCalibrator):
    """q = softmax(W z + b) on the logits (Guo et al. 2017); ODIR penalty with λ, μ (Kull et al.
    2019's MS-ODIR); λ = μ = 0 (the default) is Guo's unregularised matrix scaling.

    Fitted attributes: ``W`` (K, K), ``b`` (K,), ``objective``. Can change the argmax.
    Shapes: fit(val_logits (N, K), val_labels (N,)); calibrate(logits (M, K)) -> (M, K).
    """

    name = "matrix_scaling"
    PARAMS = (_REG_LAMBDA, _REG_MU, _MAX_ITER)

    def __init__(self, reg_lambda: float = 0.0, reg_mu: float = 0.0, max_iter: int = 500) -> None:
        super().__init__()
        self._configure(self._checked(locals()))


class DirichletCalibration(_AffineCalibrator):
    """q = softmax(W log p + b), p = softmax(z) (Kull et al. 2019, Dir-ODIR).

    The defaults λ = μ = 1e-3 are the middle of the paper's cross-validation grid
    {1e-1, …, 1e-5} (probmetrics uses the same); λ = μ = 0 is the unregularised map.
    Fitted attributes: ``W`` (K, K), ``b`` (K,), ``objective``. Can change the argmax.
    Shapes: fit(val_logits (N, K), val_labels (N,)); calibrate(logits (M, K)) -> (M, K).
    """

    name = "dirichlet"
    on_log_probs = True
    PARAMS = (_REG_LAMBDA, _REG_MU, _MAX_ITER)

    def __init__(self, reg_lambda: float = 1e-3, reg_mu: float = 1e-3, max_iter: int = 500) -> None:
        super().__init__()
        self._configure(self._checked(locals()))
