"""Cross-entropy plus a calibration regulariser: MbLS, LogitNorm, MDCA and DCA (issue 14).

Each is ``(logits (B, K), targets (B,) int64, hyperparameters, reduction) -> loss`` with the
conventions of `calibtune.losses._functional` (finite loss and gradient for any finite logits,
``"mean"``/``"sum"``/``"none"``, shape/dtype checks always, hyperparameter checks unless
``validate_args=False``); −log p_y is never log(softmax) (see `_softmax_nll`).

**Batch-level terms.** MDCA and DCA compare batch averages, so their regulariser R is one number
per batch. As for ``mmce_loss``, ``"none"`` returns CE_i + β·R for every sample, so ``"mean"`` =
mean CE + β·R (the papers' loss, what the training loop minimises) and ``"sum"`` = ``"mean"``·B
like every other loss; the gradient of ``"none"`` under upstream weights w is Σ_i w_i ∂CE_i +
(Σ_i w_i)·β ∂R. R depends on the batch, so per-sample values are not independent of each other.

**Fused backward.** Each loss is one autograd node whose ``backward`` writes the closed-form
gradient (written out in each ``_Fn.backward``), so forward+backward costs a few passes over the
(B, K) logits more than ``F.cross_entropy`` instead of one autograd node per elementwise op.
The cross-entropy part is always ``dCE_i/dz_i = p_i − onehot(y_i)``. 16-bit logits are computed in
float32 and the result and gradient are cast back (as in `calibtune.losses._kernel`).

**Buffers.** The (B, K) tensors (p, the relu or scaled logits, the gradient) live in per-thread
buffers reused across calls (`_reused`); backward consumes what forward left in its ctx and writes
the gradient into one of them, returned as a detached alias. Whatever still refers to a buffer (a
live graph, a kept ``.grad``) makes the next call take a fresh one, so reuse never changes a value;
it saves the page faults of fresh 4 MB buffers, which cost about as much as a pass over them.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from calibtune._registry import Param

from ._functional import LAM, loss_function
from ._kernel import compute_view, finish
from ._reduce import Reduction, expand_reduced_grad

__all__ = ["dca_loss", "logitnorm_loss", "mbls_loss", "mdca_loss"]

# the rules of the hyperparameters; each function declares them with its default and doc
MARGIN = Param("margin", 0.0, low=0.0, doc="logit-distance margin m ≥ 0")
BETA = Param("beta", 0.0, low=0.0, doc="weight β ≥ 0 of the batch calibration term")
TAU = Param("tau", 1.0, low=0.0, low_open=True, doc="temperature τ > 0 of the normalised logits")
MBLS_LAM = replace(LAM, doc="weight λ ≥ 0 of the margin penalty")
# LogitNorm's official code adds this to ‖z‖ so that an all-zero logit row stays finite
LOGITNORM_EPS = 1e-7


class _Pool(threading.local):
    def __init__(self) -> None:
        self.bufs: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}


_POOL = _Pool()


def _in_use(buf: torch.Tensor) -> bool:
    """Whether anything but the pool refers to ``buf`` or its memory: a Python reference (a ctx
    attribute, a caller's name), a C++ one (``save_for_backward``), or another tensor on its
    storage (the detached alias a backward returned, kept as ``.grad`` or by a hook)."""
    # getrefcount: the pool's reference, `_reused`'s ``buf``, this parameter and getrefcount's
    # argument; the storage count: buf and the temporary storage object
    return (
        sys.getrefcount(buf) > 4
        or buf._use_count() > 1
        or torch._C._storage_Use_Count(buf.untyped_storage()._cdata) > 2
    )


def _reused(like: torch.Tensor, slot: str) -> torch.Tensor:
    """An uninitialised contiguous tensor shaped like ``like``, reused across calls on this thread
    while nothing else refers to it (`_in_use`). A fresh (B, K) buffer each training step costs
    page faults (the allocator hands large freed blocks back to the OS), about as much as a pass.

    A busy buffer makes the call take a fresh one (which then replaces it in the pool), so a ctx
    may keep one as an attribute and a backward may return one as a detached alias (`_as_grad`);
    one per slot, dtype and device.
    """
    if torch.compiler.is_compiling():  # traced (`compile_loss`): the allocator is inductor's
        return torch.empty(like.shape, dtype=like.dtype, device=like.device)
    key = (slot, like.dtype, like.device)
    buf = _POOL.bufs.get(key)
    if buf is None or buf.shape != like.shape or _in_use(buf):
        buf = _POOL.bufs[key] = torch.empty(like.shape, dtype=like.dtype, device=like.device)
    return buf


def _as_grad(buf: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A backward's result from a pooled buffer: a detached alias (autograd may keep it as
    ``.grad`` without a copy, and the pool sees it on the storage), cast to the logits' dtype."""
    return buf.detach() if buf.dtype == dtype else buf.to(dtype)


def _softmax_nll(
    z: torch.Tensor, targets: torch.Tensor, *, reuse: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """p = softmax(z), −log p_y, max_k z_k and max_k p_k (the last two as (B, 1) columns); p in
    a `_reused` buffer if ``reuse``.

    One exp pass: −log p_y = max z − z_y − log max p, because max p = 1/Σ_k exp(z_k − max z)
    (in [1/K, 1], so the log is exact where log p_y itself would underflow).
    """
    p = _softmax(z, reuse)
    zmax = z.amax(dim=1, keepdim=True)
    pmax = p.amax(dim=1, keepdim=True)
    nlp = (zmax - z.gather(1, targets.unsqueeze(1))).sub_(pmax.log()).squeeze(1)
    return p, nlp, zmax, pmax


def _softmax(z: torch.Tensor, reuse: bool) -> torch.Tensor:
    if reuse:  # ATen's softmax kernel itself, writing into the buffer: the same p
        return torch.ops.aten._softmax.out(z, 1, False, out=_reused(z, "p"))
    return torch.softmax(z, dim=1)


def _top_mask(p: torch.Tensor, pmax: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """1[p ≥ max p] into ``out`` (may be ``p``): 1 at the classes of a row that tie for max p, 0
    elsewhere. A tie is in p, so logits closer than p's rounding tie too (the same classes as
    floor(p / max p), which is 1 only at p = max p). Where the gradient of a row maximum goes:
    ``mask / mask.sum(1)`` (shared among ties, as ``torch.amax``'s); callers fold that division
    into the row coefficient they scale it by.
    """
    return torch.ge(p, pmax, out=out)


def _take(ctx: Any, name: str, rebuild: Callable[[], torch.Tensor]) -> torch.Tensor:
    """The (B, K) buffer forward left in ``ctx.<name>`` for the first backward to consume (and
    overwrite); dropping it frees the pool's buffer for the next step even while the caller keeps
    the graph. A second backward (``retain_graph``) gets ``rebuild()``, a fresh copy."""
    buf = getattr(ctx, name)
    setattr(ctx, name, None)
    return rebuild() if buf is None else buf


def _over_margin(
    z: torch.Tensor, zmax: torch.Tensor, margin: float, out: torch.Tensor
) -> torch.Tensor:
    """relu(max_j z_ij − z_ik − m) into ``out``."""
    return torch.sub(zmax - margin, z, out=out).clamp_min_(0.0)


def _upstream(
    grad_out: torch.Tensor, reduction: Reduction, b: int, dtype: torch.dtype
) -> torch.Tensor:
    """The weight a_i of each per-sample loss in the upstream gradient, as a (B, 1) column or a
    0-dim scalar."""
    a = expand_reduced_grad(grad_out.to(dtype), reduction, b)
    return a.unsqueeze(1) if a.dim() == 1 else a


def _total(a: torch.Tensor, b: int) -> torch.Tensor:
    """Σ_i a_i of `_upstream`'s weights: the weight of a batch-level term every sample carries."""
    return a.sum() if a.dim() else a * b


def _minus_onehot(grad: torch.Tensor, targets: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """``grad − a_i·onehot(y_i)``, in place: the −onehot part of the cross-entropy gradient."""
    col = (-a).expand(grad.shape[0], 1)
    return grad.scatter_add_(1, targets.unsqueeze(1), col)


# x ↦ g·1[x > threshold] in one pass (ReLU's own backward kernel), written into ``grad_input``
_masked = torch.ops.aten.threshold_backward.grad_input


class _MbLS(torch.autograd.Function):
    """ℓ_i = CE_i + (λ/K) Σ_k relu(d_ik − m), d_ik = max_j z_ij − z_ik.

    With u_ik = 1[d_ik > m], n_i = Σ_k u_ik and t_ik = `_top_mask` / its row sum (1 at the
    argmax): ∂ℓ_i/∂z_ik = p_ik − 1[k = y_i] − (λ/K) u_ik + (λ/K) n_i t_ik.
    Two pooled (B, K) buffers: p (which backward turns into the tie mask) and the relu's, which
    backward turns into a_i·(−(λ/K) u_ik) (ReLU's backward kernel: one pass), then the gradient.
    """

    @staticmethod
    def forward(ctx: Any, logits, targets, margin, lam, reduction, need_grad):  # type: ignore[override]
        z = compute_view(logits)
        p, nlp, zmax, pmax = _softmax_nll(z, targets, reuse=need_grad)
        over = _over_margin(z, zmax, margin, _reused(z, "grad") if need_grad else None)
        k = z.shape[1]
        loss = torch.add(nlp, over.sum(dim=1), alpha=lam / k)
        if need_grad:
            ctx.save_for_backward(targets, pmax, z, zmax)
            ctx.setup = (lam / k, margin, reduction, logits.dtype)
            ctx.p, ctx.over = p, over
        return finish(loss, reduction, logits.dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):  # type: ignore[override]
        targets, pmax, z, zmax = ctx.saved_tensors
        coef, margin, reduction, dtype = ctx.setup
        p = _take(ctx, "p", lambda: torch.softmax(z, dim=1))
        over = _take(ctx, "over", lambda: _over_margin(z, zmax, margin, None))
        a = _upstream(grad_out, reduction, p.shape[0], p.dtype)
        grad = _masked(a * -coef, over, 0.0, grad_input=over)
        na = grad.sum(dim=1, keepdim=True)  # −(λ/K)·a_i·n_i
        grad.addcmul_(p, a)
        top = _top_mask(p, pmax, out=p)
        grad.addcmul_(top, na.div_(top.sum(dim=1, keepdim=True)), value=-1.0)
        return _as_grad(_minus_onehot(grad, targets, a), dtype), None, None, None, None, None


def _logitnorm_nlp(
    s: torch.Tensor, p: torch.Tensor, targets: torch.Tensor, tau: float
) -> torch.Tensor:
    """−log p_y of the normalised logits s. |s_k| < 1/τ, so p_y ≥ exp(−2/τ)/K: where that bound
    stays a normal number with room to spare, log p_y is read from p itself (no pass over s or
    p); otherwise from the maxima as in `_softmax_nll`."""
    k = s.shape[1]
    if 2.0 / tau + math.log(k) <= _SAFE_LOG[s.dtype]:
        return p.gather(1, targets.unsqueeze(1)).log_().neg_().squeeze(1)
    smax = s.amax(dim=1, keepdim=True)
    pmax = p.amax(dim=1, keepdim=True)
    return (smax - s.gather(1, targets.unsqueeze(1))).sub_(pmax.log()).squeeze(1)


# −log of the smallest normal number, less a margin: p_y above exp(−this) is exact enough to log
_SAFE_LOG = {torch.float32: 80.0, torch.float64: 700.0}


class _LogitNorm(torch.autograd.Function):
    """ℓ_i = CE(s_i, y_i), s_i = r_i z_i, r_i = 1/(τ(‖z_i‖ + ε)).

    With n_i = ‖z_i‖ and g_i = p_i(s_i) − onehot(y_i) (the CE gradient in s):
    ∂ℓ_i/∂z_i = r_i (g_i − z_i (g_i·z_i) / (n_i (n_i + ε))).
    Two pooled (B, K) buffers: p, and s's, which backward reuses for p ⊙ z and then the gradient.
    """

    @staticmethod
    def forward(ctx: Any, logits, targets, tau, reduction, need_grad):  # type: ignore[override]
        z = compute_view(logits)
        n = torch.linalg.vector_norm(z, dim=1, keepdim=True)
        r = (n + LOGITNORM_EPS).mul_(tau).reciprocal_()
        s = torch.mul(z, r, out=_reused(z, "grad") if need_grad else None)
        p = _softmax(s, need_grad)
        nlp = _logitnorm_nlp(s, p, targets, tau)
        if need_grad:
            ctx.save_for_backward(z, targets, n, r)
            ctx.setup = (reduction, logits.dtype)
            ctx.p, ctx.s = p, s
        return finish(nlp, reduction, logits.dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):  # type: ignore[override]
        z, targets, n, r = ctx.saved_tensors
        reduction, dtype = ctx.setup
        p = _take(ctx, "p", lambda: torch.softmax(z * r, dim=1))
        buf = _take(ctx, "s", lambda: torch.empty_like(p))
        a = _upstream(grad_out, reduction, z.shape[0], z.dtype)
        pz = torch.mul(p, z, out=buf).sum(dim=1, keepdim=True)
        gz = (pz - z.gather(1, targets.unsqueeze(1))).mul_(a)  # g_i·z_i
        # z_i·(g_i·z_i) is 0 when n_i = 0 (z_i = 0): any positive denominator gives that 0
        denom = (n * (n + LOGITNORM_EPS)).clamp_min_(torch.finfo(z.dtype).tiny)
        ar = a * r
        grad = _minus_onehot(torch.mul(p, ar, out=buf), targets, ar)
        grad.addcmul_(z, gz.div_(denom).mul_(r), value=-1.0)
        return _as_grad(grad, dtype), None, None, None, None


class _MDCA(torch.autograd.Function):
    """ℓ_i = CE_i + β R, R = (1/K) Σ_k |p̄_k − f_k|, p̄ = mean_i p_i, f_k = mean_i 1[y_i = k].

    With G_k = β sign(p̄_k − f_k) / (K B) (a (K,) vector) and c = Σ_i a_i:
    ∂(Σ_i a_i ℓ_i)/∂z_i = a_i (p_i − onehot(y_i)) + c p_i ⊙ (G − p_i·G).
    """

    @staticmethod
    def forward(ctx: Any, logits, targets, beta, reduction, need_grad):  # type: ignore[override]
        z = compute_view(logits)
        b, k = z.shape
        p, nlp, _, _ = _softmax_nll(z, targets, reuse=need_grad)
        ones = torch.ones((), dtype=z.dtype, device=z.device).expand(b)
        freq = torch.zeros(k, dtype=z.dtype, device=z.device).index_add_(0, targets, ones)
        diff = p.mean(dim=0).sub_(freq.div_(b))
        if need_grad:
            ctx.save_for_backward(z, targets, diff)
            ctx.setup = (beta / (k * b), reduction, logits.dtype)
            ctx.p = p
        return finish(nlp + beta * diff.abs().sum() / k, reduction, logits.dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):  # type: ignore[override]
        z, targets, diff = ctx.saved_tensors
        coef, reduction, dtype = ctx.setup
        p = _take(ctx, "p", lambda: torch.softmax(z, dim=1))
        a = _upstream(grad_out, reduction, p.shape[0], p.dtype)
        g = diff.sign().mul_(_total(a, p.shape[0]) * coef)  # c·G
        row = a - (p @ g).unsqueeze(1)
        grad = torch.add(row, g, out=_reused(p, "grad")).mul_(p)
        return _as_grad(_minus_onehot(grad, targets, a), dtype), None, None, None, None


class _DCA(torch.autograd.Function):
    """ℓ_i = CE_i + β |C − A|, C = mean_i max_k p_ik, A = mean_i 1[z_iy = max_k z_ik].

    A is piecewise constant (no gradient). With q_i = max_k p_ik, t_ik = `_top_mask` / its row
    sum (1 at the argmax) and h = c β sign(C − A) / B (c = Σ_i a_i), using
    ∂q_i/∂z_i = q_i (t_i − p_i):
    ∂(Σ_i a_i ℓ_i)/∂z_i = a_i (p_i − onehot(y_i)) + h q_i (t_i − p_i).
    One pooled (B, K) buffer: p, into which the first backward writes the gradient.
    """

    @staticmethod
    def forward(ctx: Any, logits, targets, beta, reduction, need_grad):  # type: ignore[override]
        z = compute_view(logits)
        p, nlp, zmax, pmax = _softmax_nll(z, targets, reuse=need_grad)  # p becomes the gradient
        correct = z.gather(1, targets.unsqueeze(1)) == zmax  # a tie for the top counts as correct
        gap = pmax.mean() - correct.to(z.dtype).mean()
        if need_grad:
            ctx.save_for_backward(z, targets, pmax, gap)
            ctx.setup = (beta / z.shape[0], reduction, logits.dtype)
            ctx.p = p
        return finish(nlp + beta * gap.abs(), reduction, logits.dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):  # type: ignore[override]
        z, targets, pmax, gap = ctx.saved_tensors
        coef, reduction, dtype = ctx.setup
        a = _upstream(grad_out, reduction, z.shape[0], z.dtype)
        hq = pmax * (gap.sign() * _total(a, z.shape[0]) * coef)  # h q_i, (B, 1)
        p = _take(ctx, "p", lambda: torch.softmax(z, dim=1))
        top = _top_mask(p, pmax, out=_reused(p, "top"))
        grad = p.mul_(a - hq).addcmul_(top, hq.div_(top.sum(dim=1, keepdim=True)))
        return _as_grad(_minus_onehot(grad, targets, a), dtype), None, None, None, None


def _need_grad(logits: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and logits.requires_grad


@loss_function(
    replace(MARGIN, default=6.0, doc="margin m on max_j z_j − z_k (Liu et al.: 6 on CIFAR)"),
    replace(MBLS_LAM, default=0.1, doc="weight λ of the class-averaged margin penalty"),
)
def mbls_loss(logits: Tensor, targets: Tensor, margin: float, lam: float, red: Reduction) -> Tensor:
    """Margin-based label smoothing (MbLS; Liu et al., "The Devil is in the Margin", CVPR 2022)::

        ℓ_i = −log p_iy + (λ/K) Σ_k max(0, max_j z_ij − z_ik − m)

    The paper writes λ Σ_k; the authors' code (``LogitMarginL1``) averages the penalty over the
    K classes, and its λ = 0.1 (with m = 6 or 10) is what the paper reports, so the sum is
    divided by K here (paper λ = ours / K). Gradients flow through max_j z_ij as in that code.
    Shapes: (B, K), (B,) -> scalar, or (B,) for ``"none"``.

    >>> z, y = torch.tensor([[8.0, 1.0, 0.0]]), torch.tensor([0])
    >>> # distances 0, 7, 8; above m = 6: 1 and 2 → penalty (1 + 2)/3 = 1; CE = 0.00125
    >>> round(float(mbls_loss(z, y, margin=6.0, lam=0.1)), 5)
    0.10125
    """
    return _MbLS.apply(logits, targets, margin, lam, red, _need_grad(logits))


@loss_function(replace(TAU, default=0.04, doc="temperature τ (Wei et al.: 0.04 on CIFAR-10)"))
def logitnorm_loss(logits: Tensor, targets: Tensor, tau: float, red: Reduction) -> Tensor:
    """Logit normalisation (LogitNorm; Wei et al., ICML 2022)::

        ℓ_i = −log softmax(z_i / (τ(‖z_i‖₂ + ε)))_y,   ε = 1e-7 (as in the authors' code)

    The paper uses τ = 0.04 on CIFAR-10. Shapes: (B, K), (B,) -> scalar, or (B,) for ``"none"``.

    >>> z, y = torch.tensor([[3.0, 4.0]]), torch.tensor([1])
    >>> # z/‖z‖ = (0.6, 0.8); /τ = 1 → CE of (0.6, 0.8) at class 1 = log(1 + e^−0.2) = 0.59814
    >>> round(float(logitnorm_loss(z, y, tau=1.0)), 5)
    0.59814
    """
    return _LogitNorm.apply(logits, targets, tau, red, _need_grad(logits))


@loss_function(replace(BETA, default=1.0, doc="weight β of MDCA (Hebbalaguppe et al.: 1 with CE)"))
def mdca_loss(logits: Tensor, targets: Tensor, beta: float, red: Reduction) -> Tensor:
    """Cross-entropy + β·MDCA (Hebbalaguppe et al., "A Stitch in Time Saves Nine", CVPR 2022)::

        ℓ_i = −log p_iy + β (1/K) Σ_k |(1/B) Σ_j p_jk − (1/B) Σ_j 1[y_j = k]|

    MDCA is a batch-level term (module docstring: ``"none"`` gives CE_i + β·MDCA per sample).
    Shapes: (B, K), (B,) -> scalar, or (B,) for ``"none"``.

    >>> z, y = torch.zeros(2, 2), torch.tensor([0, 0])
    >>> # p̄ = (0.5, 0.5), f = (1, 0): MDCA = (0.5 + 0.5)/2 = 0.5; CE = log 2 = 0.69315
    >>> round(float(mdca_loss(z, y, beta=1.0)), 5)
    1.19315
    """
    return _MDCA.apply(logits, targets, beta, red, _need_grad(logits))


@loss_function(replace(BETA, default=5.0, doc="weight β of DCA (5 in Liang et al.'s code)"))
def dca_loss(logits: Tensor, targets: Tensor, beta: float, red: Reduction) -> Tensor:
    """Cross-entropy + β·DCA (Liang et al., "Improved Trainable Calibration Method for Neural
    Networks on Medical Imaging Classification", BMVC 2020)::

        ℓ_i = −log p_iy + β |(1/B) Σ_j max_k p_jk − (1/B) Σ_j 1[argmax_k p_jk = y_j]|

    DCA is a batch-level term (module docstring: ``"none"`` gives CE_i + β·DCA per sample); the
    accuracy part is piecewise constant and carries no gradient.
    Shapes: (B, K), (B,) -> scalar, or (B,) for ``"none"``.

    >>> z, y = torch.tensor([[2.0, 0.0], [0.0, 0.0]]), torch.tensor([1, 0])
    >>> # confidences 0.8808, 0.5 (mean 0.6904); predictions 0, 0 → accuracy 0.5; DCA = 0.1904
    >>> # CE = (2.1269 + 0.6931)/2 = 1.4100 → 1.4100 + 0.1904
    >>> round(float(dca_loss(z, y, beta=1.0)), 4)
    1.6004
    """
    return _DCA.apply(logits, targets, beta, red, _need_grad(logits))
