"""One fused autograd function for every loss built from p_y (and p_j, and a Brier term).

Per sample, with ``nlp = −log p_y`` taken from ``log_softmax`` and ``q = 1 − p_y`` computed as
``−expm1(−nlp)`` (exact when p_y rounds to 1)::

    ℓ = b^|γ| · nlp  +  λ_B · ‖p − onehot(y)‖²₂
    b = q + p_j               for γ ≥ 0   (p_j = 0 unless ``dual``)
    b = 2 − (q + p_j)         for γ < 0   (the "inverse" form 1 + p_y − p_j)

which covers focal (γ ≥ 0), inverse focal (γ < 0; AdaFocal's sign convention), dual focal
(``dual=True``), FCL (``brier_weight=λ``) and Brier (``gamma=None``). γ may be a scalar or a
`Schedule` over p_y (FLSD, CalFocal, AdaFocal); the γ choice carries no gradient.

Why a custom ``backward``: the closed-form gradient is finite at p_y = 1 for every γ ≥ 0, whereas
autograd through ``(1 − p)**γ`` gives ``inf · 0 = NaN`` there for 0 < γ < 1 (the seed code adds
1e-20 to hide it); and the per-sample arithmetic runs once, in one graph node. Gradients w.r.t.
the logits (``dnlp/dz = p − onehot(y)``, ``dp_j/dz = p_j(onehot(j) − p)``,
``d‖p − e_y‖²/dz_k = 2p_k(p_k − y_k) − 2p_k Σ_i p_i(p_i − y_i)``)::

    dℓ/dnlp = w + γ·w·p_y·nlp/b        dℓ/dp_j = γ·w·nlp/b        (w = b^|γ|)

``nlp/b`` is 0/0 only where b = 0 (p_y == 1 exactly and p_j = 0); there it is multiplied by w = 0
(γ > 0) or by γ = 0, so any finite stand-in gives the exact gradient. Without a Brier term the
logit gradient ``c·(p − e_y) + a_j·(e_j − p)`` is handed to ATen's log-softmax backward (one
vectorised pass; see `_log_softmax_grad`); with one, p is materialised anyway and column y is
written from m = p_y − 1 = ``expm1(−nlp)`` rather than ``exp(log p_y) − 1``, which cancels.
16-bit logits are computed in float32 and the result and gradient are cast back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ._reduce import Reduction, expand_reduced_grad, reduce_loss

_HALF = (torch.float16, torch.bfloat16)


def compute_view(logits: torch.Tensor) -> torch.Tensor:
    """The logits in the dtype the fused losses compute in: float32 for 16-bit logits."""
    return logits.float() if logits.dtype in _HALF else logits


def _log_probs(logits: torch.Tensor) -> torch.Tensor:
    """log_softmax over classes, in the compute dtype (`compute_view`)."""
    return torch.log_softmax(compute_view(logits), dim=1)


def finish(loss: torch.Tensor, reduction: Reduction, dtype: torch.dtype) -> torch.Tensor:
    """Per-sample ``loss`` reduced and cast back to the logits' ``dtype``."""
    out = reduce_loss(loss, reduction)
    return out if out.dtype == dtype else out.to(dtype)


def _as(grad: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return grad if grad.dtype == dtype else grad.to(dtype)


@dataclass(frozen=True)
class Schedule:
    """Piecewise-constant γ over p_y: ``values`` (M,), inner ``edges`` (M−1,) ascending.

    Sample with true-class probability p_y gets ``values[b]`` for p_y ∈ [e_b, e_{b+1}); the first
    bin is open below and the last open above (``torch.bucketize(..., right=True)``).
    """

    values: torch.Tensor
    edges: torch.Tensor

    def select(self, p_y: torch.Tensor) -> torch.Tensor:
        idx = torch.bucketize(p_y, self.edges.to(p_y), right=True)
        return self.values.to(p_y)[idx]


GammaSpec = float | Schedule | None


def _power_weight(
    nlp: torch.Tensor, base: torch.Tensor, gamma: float | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``w = b^|γ|`` and ``w·nlp/b``, with ``b = base`` (γ ≥ 0) or ``2 − base`` (γ < 0)."""
    if isinstance(gamma, torch.Tensor):
        b = torch.where(gamma < 0, 2 - base, base)
        w = b.pow(gamma.abs())
    else:
        b = base if gamma >= 0 else 2 - base
        w = b.pow(abs(gamma))
    # 0/0 only at p_y == 1 exactly, where the ratio is multiplied by 0 (see module docstring)
    return w, torch.div(nlp, b).nan_to_num_(1.0).mul_(w)


def _col(x: torch.Tensor) -> torch.Tensor:
    """(B,) -> (B, 1) for row-wise broadcasting; a 0-dim scalar broadcasts as it is."""
    return x.unsqueeze(1) if x.dim() == 1 else x


_CHUNK = 64  # `_smallest_gap`'s two-level search: classes per chunk, used from 4 chunks up


def _smallest_gap(logp: torch.Tensor, nlp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """min over k of log p_y − log p_k among classes strictly below p_y, and its class j (B,).

    The gap is +inf for y, ties and classes above (``threshold`` avoids a bool mask, whose
    mixed-dtype ops are slow on CPU; in place, as a fresh (B, K) buffer costs as much as the
    pass). An index-returning ``min(dim=1)`` costs ~14× ``amin`` on CPU, so for K ≥ 4·`_CHUNK`
    the search is two-level: ``amin`` per chunk of `_CHUNK` classes (the row padded with +inf),
    the index-returning min over the chunk minima, then ``argmin`` inside the winning chunk —
    the same value and the same (first) index.
    """
    b, k = logp.shape
    if k < 4 * _CHUNK:
        gap = F.threshold_(torch.sub(-nlp.unsqueeze(1), logp), 0.0, float("inf"))
        return gap.min(dim=1)
    n_chunks = -(-k // _CHUNK)
    buf = torch.empty(b, n_chunks * _CHUNK, dtype=logp.dtype, device=logp.device)
    torch.sub(-nlp.unsqueeze(1), logp, out=buf[:, :k])
    buf[:, k:] = float("inf")
    chunks = F.threshold_(buf, 0.0, float("inf")).view(b, n_chunks, _CHUNK)
    gap_j, chunk = chunks.amin(dim=2).min(dim=1)
    within = chunks[torch.arange(b, device=logp.device), chunk].argmin(dim=1)
    return gap_j, chunk * _CHUNK + within


def _log_softmax_grad(
    logp: torch.Tensor,
    targets: torch.Tensor,
    c: torch.Tensor,
    j: torch.Tensor | None,
    at_j: torch.Tensor | None,
) -> torch.Tensor:
    """``c·(p − onehot(y)) + at_j·(onehot(j) − p)`` per row, through log_softmax's own backward.

    With G = −c·onehot(y) + at_j·onehot(j) (two entries per row), the log-softmax backward
    ``G − p·Σ_k G_k`` is exactly that gradient; ATen's kernel computes p = exp(log p) and the
    product in one vectorised pass (on CPU 1.7× faster than ``exp`` + ``mul_`` at 1024 × 1000,
    and fewer ops at small batches). Column y carries the rounding of c·p_y − c, the same
    absolute error (≤ ulp(c)) as `F.cross_entropy`'s own gradient.
    """
    grad_in = torch.zeros_like(logp).scatter_(1, targets.unsqueeze(1), _col(c.neg()))
    if at_j is not None:
        assert j is not None
        grad_in.scatter_add_(1, j.unsqueeze(1), _col(at_j))
    return torch._log_softmax_backward_data(grad_in, logp, 1, logp.dtype)


class _TargetProbLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits, targets, gamma, dual, brier_weight, reduction, need_grad):  # type: ignore[override]
        in_dtype, logp = logits.dtype, _log_probs(logits)
        nlp = F.nll_loss(logp, targets, reduction="none")
        m = torch.expm1(-nlp)  # p_y − 1, exact near p_y = 1 where 1 − exp(·) cancels
        p_y = m + 1
        loss = d_nlp = d_pj = j = p = s2 = None
        if brier_weight:
            p = logp.exp()
        if gamma is not None:
            g = gamma.select(p_y) if isinstance(gamma, Schedule) else gamma
            if dual:
                gap_j, j = _smallest_gap(logp, nlp)
                p_j = torch.exp(-nlp - gap_j)  # 0 when nothing is below p_y
                base = p_j - m
            else:
                base = -m
            w, wr = _power_weight(nlp, base, g)
            loss = w * nlp
            if need_grad:
                if isinstance(g, torch.Tensor):
                    d_nlp = torch.addcmul(w, wr.mul_(g), p_y)  # wr is now γ·w·nlp/b
                else:
                    d_nlp = torch.addcmul(w, wr, p_y, value=g)
                    if dual:
                        wr.mul_(g)
                if dual:
                    d_pj = wr.mul_(p_j)
        if brier_weight:
            assert p is not None
            s2 = torch.linalg.vecdot(p, p)
            brier = torch.add(s2, m, alpha=-2.0).sub_(1.0)  # Σ p_k² − 2 p_y + 1
            if loss is None:
                loss = brier.mul_(brier_weight)
            else:
                loss.add_(brier, alpha=brier_weight)
        assert loss is not None
        if need_grad:
            ctx.save_for_backward(logp if p is None else p, targets, m, d_nlp, d_pj, j, s2)
            ctx.setup = (reduction, brier_weight, in_dtype, p is not None)
        return finish(loss, reduction, in_dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        saved, targets, m, d_nlp, d_pj, j, s2 = ctx.saved_tensors
        reduction, brier_weight, in_dtype, _ = ctx.setup
        g = expand_reduced_grad(grad_out.to(saved.dtype), reduction, saved.shape[0])
        if not brier_weight:
            grad = _log_softmax_grad(
                saved, targets, d_nlp * g, j, None if d_pj is None else d_pj * g
            )
            return _as(grad, in_dtype), *(None,) * 6
        p = saved  # forward saved the probabilities
        # grad_k = row·p_k + Brier term for k ≠ y; column y is then overwritten with its value
        # computed from m = p_y − 1 (no cancellation), and column j gets + at_j (dual only)
        p_y = m + 1
        row = at_y = at_j = None
        if d_nlp is not None:
            c = d_nlp * g
            row, at_y = c, c * m
            if d_pj is not None:
                at_j = d_pj * g
                row = c - at_j
                at_y.sub_(at_j * p_y)
        gb = g * (2.0 * brier_weight)
        t = s2 - p_y  # Σ_i p_i (p_i − y_i)
        shift = -gb * t if row is None else row - gb * t
        grad = (p * _col(gb)).add_(_col(shift)).mul_(p)  # p ⊙ (row + gb·(p − t))
        brier_y = (m - t).mul_(p_y).mul_(gb)  # gb·p_y·(p_y − 1 − t)
        at_y = brier_y if at_y is None else at_y.add_(brier_y)
        grad.scatter_(1, targets.unsqueeze(1), at_y.unsqueeze(1))
        if at_j is not None:
            grad.scatter_add_(1, j.unsqueeze(1), at_j.unsqueeze(1))
        return _as(grad, in_dtype), *(None,) * 6


def target_prob_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    gamma: GammaSpec,
    *,
    dual: bool = False,
    brier_weight: float = 0.0,
    reduction: Reduction = "mean",
) -> torch.Tensor:
    """Fused ``b^|γ|·(−log p_y) + λ_B·Brier`` (see the module docstring); inputs are not checked."""
    need_grad = torch.is_grad_enabled() and logits.requires_grad
    return _TargetProbLoss.apply(logits, targets, gamma, dual, brier_weight, reduction, need_grad)


class _SmoothedCrossEntropy(torch.autograd.Function):
    """``−Σ_k s_k log p_k`` with s = (1 − α) on y and a = α/(K − 1) elsewhere; see
    `smoothed_cross_entropy`."""

    @staticmethod
    def forward(ctx: Any, logits, targets, alpha: float, reduction, need_grad):  # type: ignore[override]
        in_dtype, logp = logits.dtype, _log_probs(logits)
        a = alpha / (logp.shape[1] - 1)
        c_y = 1.0 - alpha - a  # s_y − a: the extra weight of −log p_y
        # −Σ_k s_k log p_k = c_y·(−log p_y) − a·Σ_k log p_k
        loss = F.nll_loss(logp, targets, reduction="none").mul_(c_y)
        loss.sub_(logp.sum(dim=1), alpha=a)
        if need_grad:
            ctx.save_for_backward(logp, targets)
            ctx.setup = (reduction, a, c_y, in_dtype)
        return finish(loss, reduction, in_dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        logp, targets = ctx.saved_tensors
        reduction, a, c_y, in_dtype = ctx.setup
        g = expand_reduced_grad(grad_out.to(logp.dtype), reduction, logp.shape[0])
        # dℓ/dz = p − s: log-softmax's backward of −s (ΣG = −1), scaled by the incoming gradient
        neg_s = torch.full_like(logp, -a)
        at_y: float | torch.Tensor = -a - c_y
        if torch.compiler.is_compiling():  # inductor rounds a scalar scatter value to float32
            at_y = neg_s.new_full((logp.shape[0], 1), at_y)
        neg_s.scatter_(1, targets.unsqueeze(1), at_y)
        grad = torch._log_softmax_backward_data(neg_s, logp, 1, logp.dtype).mul_(_col(g))
        return _as(grad, in_dtype), *(None,) * 4


def smoothed_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, alpha: float, reduction: Reduction = "mean"
) -> torch.Tensor:
    """Cross-entropy against s = (1 − α) on y and α/(K − 1) on every other class, fused.

    Per sample ``ℓ = (1 − α − a)(−log p_y) − a Σ_k log p_k`` with ``a = α/(K − 1)``, gradient
    ``p − s``: one log_softmax and one row sum forward, one fill, one log-softmax backward and one
    scaling backward — one graph node instead of ``F.cross_entropy(label_smoothing=…)``'s several.
    Inputs are not checked; α ∈ [0, (K − 1)/K] is the caller's
    (`calibtune.losses.functional.label_smoothing_loss`).
    """
    need_grad = torch.is_grad_enabled() and logits.requires_grad
    return _SmoothedCrossEntropy.apply(logits, targets, alpha, reduction, need_grad)
