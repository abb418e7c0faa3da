"""Focal calibration map and focal temperature scaling (Komisarenko & Kull 2024).

Komisarenko & Kull, "Improving Calibration by Relating Focal Loss, Temperature Scaling, and
Properness", ECAI 2024. Prop. 4 / Eq. (1): the minimiser q of the focal loss with parameter γ
relates to calibrated probabilities by

    p̂_j(q) = w_j / Σ_k w_k,   w_j = 1 / [(1 − q_j)^γ (γ log q_j / (1 − q_j) − 1/q_j)].

Both factors of the bracket are negative for γ > −1, so multiplying numerator and denominator by
−q_j gives the positive weights used here:

    w_j = q_j (1 − q_j)^(−γ) / h(q_j),   h(q) = 1 − γ q log q / (1 − q),

with q log q / (1 − q) ∈ (−1, 0], hence h ∈ [1, 1 + γ) for γ ≥ 0 and h > 1 − |γ| > 0 for
−1 < γ < 0. γ = 0 is the identity.

Numerics (float32-safe, no NaN):

* only the top class can have q near 1; its 1 − q is computed as the sum of the other
  probabilities (no cancellation) and its weight is kept in log space,
  log w_top = log q_top − γ log(1 − q_top) − log h(q_top), with h → 1 + γ as q_top → 1;
* every other class has q_j ≤ 1/2, where the linear formula is exact and bounded;
* p̂_top = sigmoid(d) with the log-odds d = log w_top − log Σ_{j≠top} w_j, and
  p̂_j = exp(log w_j − L) with L = log Σ_k w_k, so saturated rows ([1 − 1e-8, 1e-8], one-hot
  rows, zero or denormal entries) map to finite probabilities;
* exponents that would produce denormals in Σ_{j≠top} w_j are raised to log(tiny) + 1 where
  that provably cannot change p̂_top (`flush_level`) — denormal exp() is 10x+ slower.

Focal temperature scaling (Sect. 4.2 of the paper): p = p̂_{γ_ev}(softmax(z / T)), with
(γ_ev, T) chosen jointly on validation over γ_ev ∈ {−0.5, −0.25, 0.05, 0.25, 0.37, 0.5, 0.75, 1, 5}
and T ∈ {0.01, 0.02, …, 5.00}; the paper selects on equal-mass ECE with 15 bins (or on log-loss
when reporting log-loss).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch

from calibtune._registry import Param
from calibtune.metrics.validation import ArrayLike, as_tensor, check_probs

from ._base import PosthocCalibrator
from ._grid import binned_criterion_grid, first_minimum
from ._temperature import (
    CRITERION,
    DEFAULT_FOCAL_TEMPERATURES,
    N_BINS,
    TEMPERATURES,
    _beta,
    _shifted,
    temperature_grid,
    ts_probs,
)

DEFAULT_GAMMAS: tuple[float, ...] = (-0.5, -0.25, 0.05, 0.25, 0.37, 0.5, 0.75, 1.0, 5.0)

# Elements per (γ-chunk, T-chunk, row-chunk, K) intermediate: 2**18 float32 = 1 MiB, which
# stays in cache (measured ~1.4x less CPU time than 4 MiB blocks on 5k x 100).
CHUNK_ELEMS = 2**18


@dataclass(frozen=True)
class _Terms:
    """γ-independent pieces of the focal map for probabilities q (..., N, K).

    Non-top lanes: ``qn`` = q with the top lane set to 0, ``lq`` = log q (−inf on the top lane
    and where q = 0), ``b`` = log(1 − q), ``c`` = q log q / (1 − q) (0 where q = 0), and
    ``lq_sum`` = ``lq`` raised to the flush level (see `flush_level`), used only for the sum of
    the non-top weights. Top class, per row (..., N): its index ``top``, ``q_top``, ``lq_top`` =
    log q_top, ``lr_top`` = log(1 − q_top) with 1 − q_top summed from the other classes, and
    ``c_top`` = q_top log q_top / (1 − q_top) (its limit −1 on one-hot rows).
    """

    top: torch.Tensor
    qn: torch.Tensor
    lq: torch.Tensor
    lq_sum: torch.Tensor
    b: torch.Tensor
    c: torch.Tensor
    q_top: torch.Tensor
    lq_top: torch.Tensor
    lr_top: torch.Tensor
    c_top: torch.Tensor


def flush_level(gammas: Any, k: int, dtype: torch.dtype) -> float:
    """Level to which log q of the non-top lanes is raised before summing their weights.

    exp() of arguments below log(tiny) returns denormals, which are 10x+ slower on x86 and
    dominated the grid search at small T. With log q ≥ L = log(tiny) + 1 the exponent
    log q − γ log(1 − q) stays ≥ L − 0.7 |γ| (normal), and each lane gains at most
    e^L 2^max(γ,0) / (1 − max(−γ, 0)). Summed over K lanes, relative to the top weight (at
    least 1/(K(1 + γ)) for γ ≥ 0, tiny^|γ| / K for γ < 0) that stays below 2^-10 ulp of the
    top probability when L ≤ log(eps) − 10 log 2 − 2 log K − γ log 2 − log(1 + γ) (γ ≥ 0) or
    L ≤ log(eps) − 10 log 2 − 2 log K + log(1 − |γ|) + |γ| log(tiny) (γ < 0). If any γ fails
    the bound (γ near −1) nothing is raised (−inf).
    """
    fi = torch.finfo(dtype)
    level = math.log(fi.tiny) + 1.0
    base = math.log(fi.eps) - 10 * math.log(2) - 2 * math.log(max(k, 2))
    for g in torch.as_tensor(gammas, dtype=torch.float64).reshape(-1).tolist():
        if g >= 0:
            bound = base - g * math.log(2) - math.log1p(g)
        else:
            bound = base + math.log1p(g) - g * math.log(fi.tiny)
        if level > bound:
            return -math.inf
    return level


def _top_terms(
    q_top: torch.Tensor, lq_top: torch.Tensor, r_top: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    lr_top = torch.log(r_top.clamp_min(torch.finfo(r_top.dtype).tiny))
    c_top = torch.where(r_top > 0, q_top * lq_top / r_top, -1.0)
    return lr_top, c_top


def _lq_sum(lq: torch.Tensor, flush: float) -> torch.Tensor:
    return lq.clamp_min(flush) if flush > -math.inf else lq


def _terms_from_probs(q: torch.Tensor, flush: float) -> _Terms:
    top = q.argmax(dim=-1)
    idx = top.unsqueeze(-1)
    q_top = q.gather(-1, idx).squeeze(-1)
    qn = q.scatter(-1, idx, 0.0)
    r_top = qn.sum(dim=-1)
    lq = torch.log(qn)
    b = torch.log1p(-qn)
    c = torch.where(qn > 0, qn * lq / (1 - qn), 0.0)
    # near q_top = 1, log1p(−(1 − q_top)) keeps the digits that q_top itself lost
    lq_top = torch.where(q_top > 0.5, torch.log1p(-r_top), torch.log(q_top))
    lr_top, c_top = _top_terms(q_top, lq_top, r_top)
    return _Terms(top, qn, lq, _lq_sum(lq, flush), b, c, q_top, lq_top, lr_top, c_top)


def _terms_from_logits(
    dz: torch.Tensor, top: torch.Tensor, beta: torch.Tensor, flush: float
) -> _Terms:
    """Terms of softmax(β·dz) straight from shifted logits dz = z − max z (top lane exactly 0).

    log q_j = β dz_j − log1p(E) with E = Σ_{j≠top} exp(β dz_j) is exact where q_j underflows,
    and 1 − q_top = E / (1 + E) needs no cancellation. ``beta`` broadcasts against dz, e.g.
    (T, 1, 1) for a chunk of temperatures.
    """
    x = dz * beta
    e = torch.exp(x)
    s = e.sum(dim=-1)  # as in `ts_probs`, so q_top = 1/s is its top probability
    idx = top.expand(e.shape[:-1]).unsqueeze(-1)
    e.scatter_(-1, idx, 0.0)
    big_e = e.sum(dim=-1)
    lse = torch.log1p(big_e)
    qn = e.div_(s.unsqueeze(-1))
    lq = x.sub_(lse.unsqueeze(-1))
    b = torch.log1p(-qn)
    c = (qn * lq).div_(1 - qn)
    lq.scatter_(-1, idx, -torch.inf)
    q_top = s.reciprocal()
    lq_top = -lse
    lr_top, c_top = _top_terms(q_top, lq_top, big_e / s)
    return _Terms(top, qn, lq, _lq_sum(lq, flush), b, c, q_top, lq_top, lr_top, c_top)


def _lane_sum(t: _Terms, g_full: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Σ_{j≠top} w_j (bcast, N) with w_j = exp(log q_j − γ log(1 − q_j)) / (1 − γ c_j).

    ``g_full`` is γ shaped to broadcast against the (..., N, K) terms: 0-dim or (G, 1, …, 1).
    ``out`` optionally receives the (bcast, N, K) weights (a reused buffer).
    """
    w = torch.addcmul(t.lq_sum, t.b, g_full, value=-1, out=out).exp_()
    return w.div_(torch.mul(t.c, -g_full).add_(1)).sum(dim=-1)


def _top_log_weight(t: _Terms, g_row: torch.Tensor) -> torch.Tensor:
    """log w_top = log q_top − γ log(1 − q_top) − log(1 − γ c_top), (bcast, N)."""
    return torch.addcmul(t.lq_top, t.lr_top, g_row, value=-1).sub_(torch.log1p(t.c_top * -g_row))


def _log_w(t: _Terms, g_full: torch.Tensor) -> torch.Tensor:
    """log w_j = log q_j − γ log(1 − q_j) − log(1 − γ c_j) for the non-top lanes (top: −inf)."""
    return torch.addcmul(t.lq, t.b, g_full, value=-1) - torch.log1p(-g_full * t.c)


def _map(t: _Terms, g_full: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """p̂ (bcast, N, K): top lane sigmoid(d) with the top log-odds d = log w_top − log Σ_{j≠top}
    w_j; other lanes exp(log w_j − L), L = log Σ_k w_k = log w_top − log sigmoid(d), in log space.

    The map preserves the order of q (w is increasing in q where it matters), but the top lane
    and the others are rounded along different paths; so lanes tied with the top copy its value
    and the others are capped one ulp below it, which keeps the argmax (first maximum) exactly.
    """
    log_w_top = _top_log_weight(t, g_full.squeeze(-1))
    d = log_w_top - torch.log(_lane_sum(t, g_full))
    big_l = log_w_top - torch.nn.functional.logsigmoid(d)
    p_top = torch.sigmoid(d).unsqueeze(-1)
    out = torch.exp(_log_w(t, g_full) - big_l.unsqueeze(-1))
    out = torch.minimum(out, torch.nextafter(p_top, torch.zeros_like(p_top)))
    out = torch.where(t.qn == t.q_top.unsqueeze(-1), p_top, out)
    idx = t.top.expand(out.shape[:-1]).unsqueeze(-1)
    out.scatter_(-1, idx, p_top)
    return torch.where(g_full == 0, q, out)


def _check_gamma(gamma: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    g = as_tensor(gamma, "gamma")
    if g.ndim > 1:
        raise ValueError(
            f"gamma: expected a scalar or a 1-D (G,) array, got shape {tuple(g.shape)}"
        )
    if g.dtype == torch.bool or g.is_complex():
        raise ValueError(f"gamma: expected real numbers, got dtype {g.dtype}")
    g = g.to(dtype=torch.float64)
    if not bool(torch.isfinite(g).all()) or bool((g <= -1).any()):
        raise ValueError(
            f"gamma: expected finite values > -1 (the map is undefined for γ <= -1), got "
            f"{g.tolist()}"
        )
    return g.to(dtype=dtype, device=device)


def focal_calibration_map(probs: ArrayLike, gamma: Any) -> torch.Tensor:
    """Focal calibration map p̂_γ(q) of Komisarenko & Kull 2024 (Prop. 4, Eq. (1)).

    p̂_j ∝ 1 / [(1 − q_j)^γ (γ log q_j / (1 − q_j) − 1/q_j)], normalised over classes; identity
    at γ = 0. The argmax is unchanged for every γ > −1 (first maximum kept exactly). For γ > 0
    the top probability rises when q_top ≥ 1/2; note that Eq. (1) itself *lowers* it on
    low-confidence rows with many classes (q_j f(q_j) with f decreasing below q ≈ e^-2), e.g.
    q = (0.12, 0.88/9 × 9), γ = 1 gives p̂_top ≈ 0.1195 — Prop. 5's "confidence-raising" holds
    for confident rows and for K ≤ 3, not in general.

    Shapes: ``probs`` (N, K) or (G, N, K); ``gamma`` a scalar or (G,). A (G,) gamma with (N, K)
    probs gives (G, N, K) (one map per γ); with (G, N, K) probs slice g uses gamma[g]. float64
    input gives float64, any other float dtype float32. Rows of ``probs`` must sum to 1.
    """
    q = as_tensor(probs, "probs")
    if q.ndim == 3:
        g_, n, k = q.shape
        q = check_probs(q.reshape(g_ * n, k)).reshape(g_, n, k)
    elif q.ndim == 2:
        q = check_probs(q)
    else:
        raise ValueError(
            f"probs: expected a 2-D (N, K) or 3-D (G, N, K) array, got shape {tuple(q.shape)}"
        )
    q = q.to(torch.float64 if q.dtype == torch.float64 else torch.float32)
    g = _check_gamma(gamma, q.dtype, q.device)
    if g.ndim == 1:
        if q.ndim == 3 and g.numel() not in (1, q.shape[0]):
            raise ValueError(
                f"gamma: expected {q.shape[0]} values (one per slice of probs {tuple(q.shape)}) "
                f"or a scalar, got {g.numel()}"
            )
        g = g.view(-1, 1, 1)
    return _map(_terms_from_probs(q, flush_level(g, q.shape[-1], q.dtype)), g, q)


def _fill_chunk(
    out: torch.Tensor,
    dz: torch.Tensor,
    top: torch.Tensor,
    labels: torch.Tensor,
    betas: torch.Tensor,
    g_all: torch.Tensor,
    flush: float,
    g_step: int,
    want_nll: bool,
) -> None:
    """Write the (G, T_chunk, rows) block of `focal_top_label_grid` into ``out``."""
    t = _terms_from_logits(dz, top, betas[:, None, None], flush)
    # lane sums one γ-chunk at a time (the only (G, T, rows, K)-sized work), row terms batched
    s_all = torch.empty(out.shape, dtype=dz.dtype, device=dz.device)
    buf = None
    for g_lo in range(0, g_all.shape[0], g_step):
        gs = slice(g_lo, g_lo + g_step)
        g_full = g_all[gs]
        if buf is None or buf.shape[0] != g_full.shape[0]:
            buf = torch.empty((g_full.shape[0], *t.lq.shape), dtype=dz.dtype, device=dz.device)
        s_all[gs] = _lane_sum(t, g_full, out=buf)
    g_row = g_all.squeeze(-1)
    log_w_top = _top_log_weight(t, g_row)
    d = log_w_top - torch.log(s_all)
    if want_nll:
        correct = top == labels
        # true-class terms (T_chunk, rows); log q_y is finite even where q_y underflows
        yi = labels.unsqueeze(-1)
        lq_y, b_y, c_y = (
            x.gather(-1, yi.expand((*x.shape[:-1], 1))).squeeze(-1) for x in (t.lq, t.b, t.c)
        )
        log_sig = torch.nn.functional.logsigmoid(d)
        log_w_y = lq_y - g_row * b_y - torch.log1p(-g_row * c_y)
        # log p̂_y: log sigmoid(d) for the top class, log w_y − L otherwise
        vals = torch.where(correct, log_sig, log_w_y - log_w_top + log_sig)
        identity = torch.where(correct, t.lq_top, lq_y)
    else:
        vals, identity = torch.sigmoid(d), t.q_top
    # γ = 0 is the identity map (exactly, as in `_map`)
    out[:] = torch.where(g_row == 0, identity, vals) if bool((g_all == 0).any()) else vals


def focal_top_label_grid(
    logits: torch.Tensor,
    labels: torch.Tensor,
    gammas: torch.Tensor,
    temperatures: torch.Tensor,
    want_nll: bool = False,
) -> Iterator[tuple[slice, torch.Tensor, torch.Tensor]]:
    """Top-label confidence of p̂_γ(softmax(z/T)) for every γ and T, one chunk of T's at a time.

    Yields ``(t_slice, vals, correct)``: ``vals`` (G, T_chunk, N) are the top-label confidences,
    or with ``want_nll`` the log-probabilities of the true class (in log space); ``correct``
    (N,) says whether the argmax (that of the logits, unchanged by the map) is the label. The
    float operations are those of `FocalTemperatureScaling.calibrate`; each intermediate holds
    at most `CHUNK_ELEMS` elements.
    """
    n, k = logits.shape
    dz = _shifted(logits)
    top = dz.argmax(dim=-1)
    correct = top == labels
    betas = _beta(temperatures, logits.dtype).to(logits.device)
    gg, gt = gammas.numel(), temperatures.numel()
    # chunk rows first, then T, then γ, so that each (γ, T, rows, K) block fits in cache
    n_step = max(1, min(n, CHUNK_ELEMS // k))
    t_step = max(1, CHUNK_ELEMS // (n_step * k))
    g_step = max(1, CHUNK_ELEMS // (t_step * n_step * k))
    g_all = gammas.to(logits.dtype).view(-1, 1, 1, 1)
    flush = flush_level(gammas, k, logits.dtype)
    for t_lo in range(0, gt, t_step):
        ts = slice(t_lo, min(t_lo + t_step, gt))
        vals = torch.empty(gg, ts.stop - ts.start, n, dtype=logits.dtype, device=logits.device)
        for n_lo in range(0, n, n_step):
            rows = slice(n_lo, n_lo + n_step)
            _fill_chunk(
                vals[:, :, rows],
                dz[rows],
                top[rows],
                labels[rows],
                betas[ts],
                g_all,
                flush,
                g_step,
                want_nll,
            )
        yield ts, vals, correct


class FocalTemperatureScaling(PosthocCalibrator):
    """p = focal_calibration_map(softmax(z / T), γ_ev), (γ_ev, T) chosen jointly on validation.

    Grid search over ``gammas`` × ``temperatures`` (defaults: the seed's grids, see the module
    docstring). ``criterion``: ``"adaece"`` (default — the seed's equal-mass ECE, 15 bins, as
    `calibtune.metrics.adaece`), ``"ece"`` (equal-width, as `calibtune.metrics.ece`) or ``"nll"``
    (mean −log p̂_y, computed in log space). Ties (1e-12 relative) go to the smallest T, then the
    smallest γ_ev. A γ_ev = 0 entry makes plain temperature scaling one of the candidates.

    Fitted attributes: ``T``, ``gamma_ev``, ``criterion_value``; ``curve`` (n_gammas, n_T)
    float64 CPU tensor of the criterion over the grid, with ``gammas`` and ``temperatures``.
    The argmax is never changed. Reference: Komisarenko & Kull 2024, Sect. 4.2.
    """

    name = "focal_ts"
    PARAMS = (
        replace(
            CRITERION,
            doc="validation criterion: adaece (equal-mass ECE, the seed's), ece (equal-width) or "
            "nll",
        ),
        Param(
            "gammas",
            kind="float_list",
            low=-1.0,
            low_open=True,
            searchable=False,
            doc="grid of γ_ev (> −1); None = the seed's "
            "{−0.5, −0.25, 0.05, 0.25, 0.37, 0.5, 0.75, 1, 5}",
        ),
        replace(TEMPERATURES, doc="grid of T; None = the seed's {0.01, 0.02, …, 5.00}"),
        N_BINS,
    )

    def __init__(
        self,
        criterion: str = "adaece",
        gammas: Any = None,
        temperatures: Any = None,
        n_bins: int = 15,
    ) -> None:
        super().__init__()
        self._configure(self._checked(locals()))

    def _configure(self, cfg: dict[str, Any]) -> None:
        self.criterion: str = cfg["criterion"]
        self.n_bins: int = cfg["n_bins"]
        self.gammas = temperature_grid(cfg["gammas"], DEFAULT_GAMMAS)
        self.temperatures = temperature_grid(cfg["temperatures"], DEFAULT_FOCAL_TEMPERATURES)
        if self.criterion == "nll":
            # the registry entry "focal_ts_nll"; the class attribute stays "focal_ts"
            self.name = "focal_ts_nll"
        self.T: float = math.nan
        self.gamma_ev: float = math.nan
        self.criterion_value: float = math.nan
        self.curve = torch.empty(0, 0, dtype=torch.float64)

    def _fit(self, z: torch.Tensor, y: torch.Tensor) -> None:
        gam = torch.tensor(self.gammas, dtype=torch.float64, device=z.device)
        temps = torch.tensor(self.temperatures, dtype=torch.float64, device=z.device)
        want_nll = self.criterion == "nll"
        gg, gt = gam.numel(), temps.numel()
        curve = torch.empty(gg, gt, dtype=torch.float64, device=z.device)
        for ts, vals, correct in focal_top_label_grid(z, y, gam, temps, want_nll=want_nll):
            if want_nll:
                curve[:, ts] = -vals.to(torch.float64).mean(dim=-1)
                continue
            # every (γ, T) pair of the chunk as one row of a single batched criterion call
            rows = vals.reshape(-1, vals.shape[-1])
            curve[:, ts] = binned_criterion_grid(self.criterion, rows, correct, self.n_bins).view(
                gg, -1
            )
        curve = curve.cpu()
        best = first_minimum(curve.T.reshape(-1))  # T-major order: smallest T first, then γ
        self.T = self.temperatures[best // gg]
        self.gamma_ev = self.gammas[best % gg]
        self.criterion_value = float(curve[best % gg, best // gg])
        self.curve = curve

    def _calibrate(self, z: torch.Tensor) -> torch.Tensor:
        q = ts_probs(z, self.T)
        if self.gamma_ev == 0:
            return q
        dz = _shifted(z)
        beta = _beta(self.T, z.dtype).to(z.device)
        t = _terms_from_logits(
            dz, dz.argmax(dim=-1), beta, flush_level(self.gammas, z.shape[1], z.dtype)
        )
        return _map(t, torch.tensor(self.gamma_ev, dtype=z.dtype, device=z.device), q)

    def _params(self) -> dict[str, float]:
        return {"T": float(self.T), "gamma_ev": float(self.gamma_ev)}
