"""Pure loss functions: ``(logits (B, K), targets (B,) int64, hyperparameters, reduction) -> loss``.

Conventions shared by every function here:

* ``log p`` comes from ``log_softmax`` (never ``log(softmax)``) and nothing is clamped: every loss
  and its gradient are finite for any finite logits, including p_y rounding to exactly 1.
* ``reduction="mean"`` (default) averages over the batch; ``"sum"`` and ``"none"`` (shape (B,))
  are also accepted (`calibtune.losses._reduce`). The seed papers' code *sums* over the batch,
  so each of its SGD steps is B times the mean-reduction step at the same learning rate: the
  mean-reduction equivalent of a seed learning rate lr is lr × B (see `calibtune.losses._reduce`).
* Input checks look at shapes and dtypes only (no ``.item()``, no device sync), so they are cheap
  enough for every training step; hyperparameter ranges are checked with "expected X, got Y"
  against the same `Param` rules the loss registry declares. ``validate_args=False`` (keyword,
  as in torchmetrics) skips the hyperparameter and ``reduction`` checks for callers that
  validated them once already — the module adapters, whose hyperparameters the registry checked
  at construction; the shape/dtype checks of ``logits``/``targets`` always run.
* No per-sample Python loops; the γ of sample-dependent losses is chosen by ``torch.bucketize``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from calibtune._registry import Param

from ._kernel import Schedule, compute_view, finish, smoothed_cross_entropy, target_prob_loss
from ._reduce import Reduction, check_reduction, reduce_loss

__all__ = [
    "adadual_focal_loss",
    "adafocal_loss",
    "brier_loss",
    "calfocal_loss",
    "cross_entropy_loss",
    "dual_focal_loss",
    "fcl_loss",
    "flsd_loss",
    "focal_loss",
    "inverse_focal_loss",
    "label_smoothing_loss",
    "mmce_loss",
    "mmce_weighted",
]


def _check_inputs(logits: torch.Tensor, targets: torch.Tensor, fn: str, soft: bool = False) -> None:
    """Shapes and dtypes only (no device read). ``soft``: (B, K) floating-point targets (class
    probabilities, e.g. mixup's) are accepted too; other losses refuse them in one line."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"{fn}: logits: expected a 2-D (B, K) tensor, got {shape}")
    if not logits.is_floating_point():
        raise ValueError(
            f"{fn}: logits: expected a floating-point tensor, got dtype {logits.dtype}"
        )
    b, k = logits.shape
    if b == 0 or k < 2:
        raise ValueError(f"{fn}: logits: expected B >= 1 samples and K >= 2 classes, got {(b, k)}")
    if isinstance(targets, torch.Tensor) and targets.dim() == 2:
        if not soft:
            raise ValueError(
                f"{fn}: targets: expected class indices of shape ({b},) (soft (B, K) targets: "
                f"{', '.join(SOFT_TARGET_LOSSES)} only), got shape {tuple(targets.shape)}"
            )
        if targets.shape != (b, k) or not targets.is_floating_point():
            raise ValueError(
                f"{fn}: targets: expected ({b},) int64 class indices or ({b}, {k}) floating-point "
                f"class probabilities, got shape {tuple(targets.shape)} dtype {targets.dtype}"
            )
        return
    if not isinstance(targets, torch.Tensor) or targets.shape != (b,):
        shape = (
            tuple(targets.shape) if isinstance(targets, torch.Tensor) else type(targets).__name__
        )
        raise ValueError(f"{fn}: targets: expected shape ({b},) to match logits, got {shape}")
    if targets.dtype != torch.long:
        raise ValueError(
            f"{fn}: targets: expected int64 class indices, got dtype {targets.dtype} "
            "(use targets.long())"
        )


#: the functions that take soft (B, K) targets too (their formula is a sum over classes)
SOFT_TARGET_LOSSES: tuple[str, ...] = ("cross_entropy_loss", "focal_loss")

# The rules of the functions' hyperparameters; each function declares them with its default
# (`loss_function`), which its module class registers, so a module and its function check one rule.
GAMMA = Param("gamma", 0.0, low=0.0, doc="focusing parameter γ ≥ 0")
LAM = Param("lam", 0.0, low=0.0, doc="weight λ ≥ 0 of the added term")
ALPHA = Param("alpha", 0.0, low=0.0, doc="label-smoothing α ≥ 0 (at most (K−1)/K)")
_GAMMAS = Param("gammas", 0.0, low=0.0)


def _gamma(default: float, doc: str) -> Param:
    return replace(GAMMA, default=default, doc=doc)


_THRESHOLDS = Param("thresholds", 0.0)


def _check(rule: Param, value: Any, fn: str, validate_args: bool) -> Any:
    """``value`` checked against ``rule`` (errors ``fn: name: expected X, got Y``), or as given."""
    return rule.validate(value, owner=fn) if validate_args else value


def _reduction(reduction: Any, validate_args: bool) -> Reduction:
    return check_reduction(reduction) if validate_args else reduction


def _checked(
    fn: str,
    logits: torch.Tensor,
    targets: torch.Tensor,
    reduction: Any,
    validate_args: bool,
    *rules: tuple[Param, Any],
    soft: bool = False,
) -> tuple[Any, ...]:
    """The boundary of every loss function ``fn``: ``logits``/``targets`` checked (always), then
    each ``(rule, value)`` and ``reduction`` (unless ``validate_args`` is False); returns the
    checked values followed by the reduction."""
    _check_inputs(logits, targets, fn, soft)
    values = (_check(rule, value, fn, validate_args) for rule, value in rules)
    return (*values, _reduction(reduction, validate_args))


_TEMPLATE = """\
def _make(_checked, _kernel, _rules):
    def {name}(logits, targets, {params}reduction="mean", *, validate_args=True):
        return _kernel(logits, targets, *_checked({name!r}, logits, targets, reduction,
                                                  validate_args, {pairs}{soft}))
    return {name}
"""


def loss_function(
    *rules: Param, soft: bool = False
) -> Callable[[Callable[..., torch.Tensor]], Callable[..., torch.Tensor]]:
    """Decorator: ``kernel(logits, targets, *hyperparameters, reduction)``, which trusts its
    inputs, becomes the public loss function of the same name, docstring and module::

        name(logits, targets, <one argument per rule>, reduction="mean", *, validate_args=True)

    which checks ``logits``/``targets`` always and each hyperparameter against its `Param` rule
    and ``reduction`` unless ``validate_args`` is False (`_checked`), then calls the kernel. The
    signature is generated (as `dataclasses` does), so the wrapper costs one call, not a binding.
    ``soft=True``: the kernel also takes (B, K) floating-point targets (`SOFT_TARGET_LOSSES`).

    >>> @loss_function(GAMMA)
    ... def scaled_ce(logits, targets, gamma, reduction):
    ...     return gamma * F.cross_entropy(logits, targets, reduction=reduction)
    >>> scaled_ce(torch.zeros(2, 2), torch.tensor([0, 1]), -1.0)
    Traceback (most recent call last):
    ...
    calibtune._validate.ValidationError: scaled_ce: gamma: expected a number in [0, inf), got -1.0
    """

    def deco(kernel: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        name = kernel.__name__
        names = [rule.name for rule in rules]
        src = _TEMPLATE.format(
            name=name,
            params="".join(f"{n}, " for n in names),
            pairs=", ".join(f"(_rules[{i}], {n})" for i, n in enumerate(names)),
            soft=(", " if names else "") + "soft=True" if soft else "",
        )
        scope: dict[str, Any] = {}
        # the kernel's module globals: doctest finds the function as that module's own
        exec(src, kernel.__globals__, scope)
        fn = scope["_make"](_checked, kernel, rules)
        fn.__doc__, fn.__module__, fn.__qualname__ = kernel.__doc__, kernel.__module__, name
        fn.rules = rules  # the registry entry of its module class declares these
        fn.soft_targets = soft
        ann = kernel.__annotations__
        fn.__annotations__ = {
            **{n: ann.get(n, "Any") for n in ("logits", "targets", *names)},
            **{"reduction": "str", "validate_args": "bool", "return": ann.get("return", "Any")},
        }
        return fn

    return deco


def _as_schedule(
    gammas: torch.Tensor | Sequence[float],
    edges: torch.Tensor | Sequence[float],
    fn: str,
    names: tuple[str, str],
    logits: torch.Tensor,
) -> Schedule:
    """Tensors are used as they are (`Schedule.select` casts them); sequences become tensors.
    Shapes are checked always (no values: that would sync the device), like the logits'."""
    dtype = torch.float32 if logits.dtype in (torch.float16, torch.bfloat16) else logits.dtype
    g, e = (
        x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=dtype, device=logits.device)
        for x in (gammas, edges)
    )
    if g.dim() != 1 or e.dim() != 1 or e.numel() != g.numel() - 1 or g.numel() == 0:
        raise ValueError(
            f"{fn}: expected {names[0]} of shape (M,) and {names[1]} of shape (M-1,), got "
            f"{tuple(g.shape)} and {tuple(e.shape)}"
        )
    return Schedule(g, e)


def _scheduled(
    fn: str,
    logits: torch.Tensor,
    targets: torch.Tensor,
    gammas: torch.Tensor | Sequence[float],
    edges: torch.Tensor | Sequence[float],
    red: Reduction,
    *,
    names: tuple[str, str] = ("gammas", "edges"),
    dual: bool = False,
) -> torch.Tensor:
    """The fused loss with γ per p_y bin (`Schedule`) for ``fn``, whose inputs are checked."""
    sched = _as_schedule(gammas, edges, fn, names, logits)
    return target_prob_loss(logits, targets, sched, dual=dual, reduction=red)


@dataclass(frozen=True)
class _AsGiven:
    """The rule of a tensor argument of `loss_function` (a γ schedule): taken as given, its
    shape is checked by the kernel (`_as_schedule`)."""

    name: str

    def validate(self, value: Any, owner: str) -> Any:
        return value


_SCHEDULE = (_AsGiven("gammas"), _AsGiven("edges"))


# -- p_y-based losses -------------------------------------------------------------------


@loss_function(soft=True)
def cross_entropy_loss(logits: Tensor, targets: Tensor, red: Reduction) -> Tensor:
    """Cross-entropy −log p_y. Shapes: (B, K), (B,) -> scalar, or (B,) for ``"none"``.

    Soft targets t (B, K) (class probabilities, e.g. mixup's λ onehot(y_a) + (1 − λ)
    onehot(y_b)) give −Σ_k t_k log p_k, which is λ CE(y_a) + (1 − λ) CE(y_b) for mixup's.
    Delegates to ``F.cross_entropy``, whose ``mean``/``sum``/``none`` are exactly ours (no class
    weights), so no extra reduction node is added.

    >>> z = torch.tensor([[2.0, 0.0]])
    >>> # ½·(−log σ(2)) + ½·(−log σ(−2)) = ½·(0.12693 + 2.12693)
    >>> round(float(cross_entropy_loss(z, torch.tensor([[0.5, 0.5]]))), 5)
    1.12693
    """
    if targets.dim() == 2:
        return F.cross_entropy(logits, targets.to(logits.dtype), reduction=red)
    return F.cross_entropy(logits, targets, reduction=red)


@loss_function(_gamma(3.0, "focusing parameter γ (0 = cross-entropy)"), soft=True)
def focal_loss(logits: Tensor, targets: Tensor, gamma: float, red: Reduction) -> Tensor:
    """Focal loss −(1 − p_y)^γ log p_y, γ ≥ 0 (γ = 0 is cross-entropy).

    Lin et al. 2017, "Focal Loss for Dense Object Detection"; Mukhoti et al. 2020 for calibration.
    Soft targets t (B, K) give −Σ_k t_k (1 − p_k)^γ log p_k (a one-hot t is the focal loss; a
    mixup t is λ FL(y_a) + (1 − λ) FL(y_b), the mixup criterion), by autograd (`_soft_focal`).
    Shapes: (B, K), (B,) or (B, K) -> scalar, or (B,) for ``"none"``.
    """
    if targets.dim() == 2:
        return _soft_focal(logits, targets, gamma, red)
    return target_prob_loss(logits, targets, gamma, reduction=red)


def _soft_focal(logits: Tensor, targets: Tensor, gamma: float, red: Reduction) -> Tensor:
    """−Σ_k t_k (1 − p_k)^γ log p_k per sample. 1 − p_k = −expm1(log p_k) (exact near p_k = 1),
    floored at the smallest normal number so that (1 − p)^γ has a finite slope for γ < 1."""
    z = compute_view(logits)
    logp = torch.log_softmax(z, dim=1)
    t = targets.to(z.dtype)
    if gamma:
        q = torch.expm1(logp).neg().clamp_min(torch.finfo(z.dtype).tiny)
        t = t * q.pow(gamma)
    return finish(-(t * logp).sum(dim=1), red, logits.dtype)


@loss_function(_gamma(1.0, "exponent of (1+p_y)"))
def inverse_focal_loss(logits: Tensor, targets: Tensor, gamma: float, red: Reduction) -> Tensor:
    """Inverse focal loss −(1 + p_y)^γ log p_y, γ ≥ 0 (Ghosh et al. 2022, Eq. 5 with γ < 0).

    Shapes: (B, K), (B,) -> scalar, or (B,) for ``"none"``.
    """
    return target_prob_loss(logits, targets, -gamma, reduction=red)


def flsd_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    gammas: torch.Tensor | Sequence[float],
    thresholds: torch.Tensor | Sequence[float],
    reduction: str = "mean",
    *,
    validate_args: bool = True,
) -> torch.Tensor:
    """Sample-dependent focal loss (FLSD): γ = gammas[b] for p_y ∈ [t_b, t_{b+1}).

    ``thresholds`` (M−1,) ascending in (0, 1) split [0, 1] into M bins; ``gammas`` (M,) ≥ 0.
    FLSD-53 (Mukhoti et al. 2020, §4): ``gammas=(5, 3), thresholds=(0.2,)``, i.e. γ = 5 for
    p_y ∈ [0, 0.2) and γ = 3 for p_y ∈ [0.2, 1]. The γ choice carries no gradient. See
    `flsd_from_p0` for schedules from Proposition 2. Sequences are checked here; tensors only by
    shape (checking their values would sync the device).
    Shapes: (B, K), (B,) -> scalar, or (B,) for ``"none"``.
    """
    _check_inputs(logits, targets, "flsd_loss")
    if validate_args and not isinstance(gammas, torch.Tensor):
        for g in gammas:
            _GAMMAS.validate(g, "flsd_loss")
    if validate_args and not isinstance(thresholds, torch.Tensor):
        ts = [_THRESHOLDS.validate(t, "flsd_loss") for t in thresholds]
        if any(not 0.0 < t < 1.0 for t in ts) or any(a >= b for a, b in itertools.pairwise(ts)):
            raise ValueError(
                f"flsd_loss: thresholds: expected strictly increasing values in (0, 1), got {ts}"
            )
    args = (logits, targets, gammas, thresholds, _reduction(reduction, validate_args))
    return _scheduled("flsd_loss", *args, names=("gammas", "thresholds"))


@loss_function(*_SCHEDULE)
def adafocal_loss(
    logits: Tensor, targets: Tensor, gammas: Tensor, edges: Tensor, red: Reduction
) -> Tensor:
    """AdaFocal loss (Ghosh et al. 2022, Eq. 5) for fixed per-bin γ.

    Sample n falls in validation bin b when p_y ∈ [e_b, e_{b+1}) (``edges`` (M−1,) are the inner
    edges; the first bin is open below, the last open above). γ_b ≥ 0 gives focal
    −(1 − p_y)^γ_b log p_y, γ_b < 0 inverse focal −(1 + p_y)^|γ_b| log p_y. ``gammas`` (M,) and
    ``edges`` come from `AdaFocalLoss` (state updated from validation bins by Algorithm 1).
    Shapes: (B, K), (B,) -> scalar, or (B,) for ``"none"``.
    """
    return _scheduled("adafocal_loss", logits, targets, gammas, edges, red)


@loss_function(*_SCHEDULE)
def calfocal_loss(
    logits: Tensor, targets: Tensor, gammas: Tensor, edges: Tensor, red: Reduction
) -> Tensor:
    """CalFocal loss (Ghosh et al. 2022, Eq. 3): focal with γ_b = exp(λ(C_val,b − A_val,b)).

    The binning is `adafocal_loss`'s; ``gammas`` (M,) > 0 come from `calfocal_gammas`.
    Shapes: (B, K), (B,) -> scalar, or (B,) for ``"none"``.
    """
    return _scheduled("calfocal_loss", logits, targets, gammas, edges, red)


@loss_function(_gamma(5.0, "focusing parameter γ (Tao et al. Table 13: 5 on CIFAR-10)"))
def dual_focal_loss(logits: Tensor, targets: Tensor, gamma: float, red: Reduction) -> Tensor:
    """Dual focal loss −(1 − p_y + p_j)^γ log p_y (Tao et al. 2023, Eq. 3), γ ≥ 0.

    p_j is the largest probability strictly below p_y (0 when there is none, e.g. when y has the
    smallest probability: then it is plain focal loss); classes tied with p_y are excluded.
    Gradients flow through p_j as in the authors' code. Shapes: (B, K), (B,) -> scalar, or (B,).
    """
    return target_prob_loss(logits, targets, gamma, dual=True, reduction=red)


@loss_function(*_SCHEDULE)
def adadual_focal_loss(
    logits: Tensor, targets: Tensor, gammas: Tensor, edges: Tensor, red: Reduction
) -> Tensor:
    """AdaDualFocal (Tao et al. 2023, §5.2): AdaFocal's per-bin γ on the dual focal form.

    Binning by p_y as in `adafocal_loss`; γ_b ≥ 0 gives −(1 − p_y + p_j)^γ_b log p_y and γ_b < 0
    the mirrored inverse form −(1 + p_y − p_j)^|γ_b| log p_y (the authors' code bins by p_y − p_j
    and raises the dual base to the negative power; it never updates γ).
    Shapes: (B, K), (B,) -> scalar, or (B,) for ``"none"``.
    """
    return _scheduled("adadual_focal_loss", logits, targets, gammas, edges, red, dual=True)


@loss_function(
    _gamma(4.0, "focusing parameter γ"),
    replace(LAM, default=1.5, doc="weight λ of ‖p − onehot(y)‖²"),
)
def fcl_loss(logits: Tensor, targets: Tensor, gamma: float, lam: float, red: Reduction) -> Tensor:
    """Focal Calibration Loss −(1 − p_y)^γ log p_y + λ‖p − onehot(y)‖²₂, γ ≥ 0, λ ≥ 0.

    "Towards Trustworthy Deep Neural Network through Euclidean Distance" (FCL); the squared
    Euclidean (Brier) term makes it strictly proper for λ > 0.
    Shapes: (B, K), (B,) -> scalar, or (B,) for ``"none"``.
    """
    return target_prob_loss(logits, targets, gamma, brier_weight=lam, reduction=red)


@loss_function()
def brier_loss(logits: Tensor, targets: Tensor, red: Reduction) -> Tensor:
    """Brier score Σ_k (p_k − 1{k = y})² per sample (Brier 1950; a baseline in Mukhoti et al.).

    Shapes: (B, K), (B,) -> scalar, or (B,) for ``"none"``.
    """
    return target_prob_loss(logits, targets, None, brier_weight=1.0, reduction=red)


# -- full-distribution losses ------------------------------------------------------------


def label_smoothing_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    alpha: float,
    reduction: str = "mean",
    *,
    validate_args: bool = True,
) -> torch.Tensor:
    """Cross-entropy against s = (1 − α) on y and α/(K − 1) elsewhere (Mukhoti et al. §5).

    (``F.cross_entropy(label_smoothing=ε)`` spreads ε/K over *all* classes: ε = αK/(K − 1) is the
    same target.) α must be ≤ (K − 1)/K (beyond it y would get less mass than the others).
    Computed by the fused `calibtune.losses._kernel.smoothed_cross_entropy` (closed-form gradient
    p − s), which is faster than ``F.cross_entropy(label_smoothing=ε)`` on CPU.
    Shapes: (B, K), (B,) -> scalar, or (B,) for ``"none"``.
    """
    _check_inputs(logits, targets, "label_smoothing_loss")
    k = logits.shape[1]
    alpha = _check(ALPHA, alpha, "label_smoothing_loss", validate_args)
    if alpha > (k - 1) / k:
        raise ValueError(
            "label_smoothing_loss: alpha: expected a number in [0, (K-1)/K] = "
            f"[0, {(k - 1) / k:.4g}] for K={k} classes, got {alpha!r}"
        )
    return smoothed_cross_entropy(logits, targets, alpha, _reduction(reduction, validate_args))


MMCE_NORMALIZATIONS: tuple[str, ...] = ("kumar", "focal_calibration")


def mmce_weighted(
    logits: torch.Tensor,
    targets: torch.Tensor,
    bandwidth: float = 0.4,
    normalization: str = "kumar",
    *,
    validate_args: bool = True,
) -> torch.Tensor:
    """Weighted MMCE of a batch (Kumar et al. 2018, "Trainable Calibration Measures ..."), scalar.

    With r_i the top-label confidence, c_i its correctness, m = #correct, n = #incorrect and the
    Laplacian kernel k(r, r') = exp(−|r − r'|/0.4), ``normalization="kumar"`` (default) is
    Kumar et al.'s estimator::

        MMCE_w² = Σ_{i,j∈C} (1−r_i)(1−r_j)k_ij / m² + Σ_{i,j∈W} r_i r_j k_ij / n²
                  − 2 Σ_{i∈C, j∈W} (1−r_i) r_j k_ij / (mn)  =  vᵀ K v,
        v_i = (1 − r_i)/m for correct i,  −r_i/n for incorrect i.

    ``normalization="focal_calibration"`` is the value of the seed code
    (``Losses/mmce.py::MMCE_weighted`` of Mukhoti et al.'s focal_calibration repository, on
    which their λ = 2 was tuned): each kernel sum is first averaged over its pairs and then
    divided again by m², n², mn — the same vᵀ K v with v_i = (1 − r_i)/m² and −r_i/n² (without
    the code's 1e-5 / 1e-10 guards). The three terms shrink by different factors, so the ratio
    of the two is not a constant 1/B²: it depends on the batch's accuracy and confidences (at
    B = 128 on random logits, Kumar's is 41–47× the seed's with 60 % of the batch correct and
    5–11× with 90 %, see ``tests/test_losses.py``); λ values do not transfer between them.

    It is 0 when either group is empty (as in the authors' code). Cost O(B²) memory and time.
    """
    if validate_args and normalization not in MMCE_NORMALIZATIONS:
        raise ValueError(
            "mmce_weighted: normalization: expected one of "
            f"{', '.join(repr(x) for x in MMCE_NORMALIZATIONS)}, got {normalization!r}"
        )
    probs = torch.softmax(logits, dim=1)
    conf, pred = probs.max(dim=1)
    correct = pred == targets
    n_correct = correct.sum()
    n_wrong = correct.numel() - n_correct
    # an empty group contributes nothing; clamping its count keeps 0/0 out of the unused branch
    m_, n_ = n_correct.clamp(min=1), n_wrong.clamp(min=1)
    if normalization == "focal_calibration":
        m_, n_ = m_ * m_, n_ * n_
    v = torch.where(correct, (1 - conf) / m_, -conf / n_)
    kernel = torch.exp(-(conf.unsqueeze(1) - conf.unsqueeze(0)).abs() / bandwidth)
    sq = v @ kernel @ v
    use = (n_correct > 0) & (n_wrong > 0) & (sq > 0)
    # sqrt has an infinite slope at 0: take it only where sq > 0 and give exact zeros elsewhere
    return torch.where(use, torch.where(use, sq, 1.0).sqrt(), 0.0)


def mmce_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    lam: float,
    reduction: str = "mean",
    normalization: str = "kumar",
    *,
    validate_args: bool = True,
) -> torch.Tensor:
    """Cross-entropy + λ·MMCE_w (Kumar et al. 2018; a baseline in Mukhoti et al. 2020).

    ``normalization`` selects Kumar et al.'s MMCE_w (default) or the seed code's
    (``"focal_calibration"``, on which Mukhoti et al.'s λ = 2 was tuned); see `mmce_weighted`.
    MMCE is a batch-level term: ``"none"`` returns CE_i + λ·MMCE for every sample, so that
    ``"mean"`` = mean CE + λ·MMCE and ``"sum"`` = ``"mean"``·B like every other loss.
    Shapes: (B, K), (B,) -> scalar, or (B,) for ``"none"``.
    """
    lam, red = _checked("mmce_loss", logits, targets, reduction, validate_args, (LAM, lam))
    ce = F.cross_entropy(logits, targets, reduction="none")
    mmce = mmce_weighted(logits, targets, normalization=normalization, validate_args=validate_args)
    return reduce_loss(ce + lam * mmce, red)
