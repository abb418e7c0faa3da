"""The mixup family (issue 23): a batch transform the training loop applies, and the losses of
RegMixup and RankMixup over the batch it produced.

**The transform** (`mixup_batch`) draws, for each of M copies, one mixing coefficient
λ_m ~ Beta(α, α) and one permutation π_m of the batch (as the papers' code: one λ per batch and
copy), and returns the *combined* batch::

    x_all = [x ; λ_1 x + (1 − λ_1) x[π_1] ; … ; λ_M x + (1 − λ_M) x[π_M]]     ((1 + M)·B rows)

with `MixedTargets` (the clean labels, π and λ). The clean rows come first and unchanged, so the
loop's accounting (train/error) reads the first B logits against the clean labels. Everything
is drawn from the input's device RNG (Beta as a ratio of two Gamma draws: PyTorch's Beta sampler
has no kernel on every device and validates with a host read) and nothing is read on the host.

**The losses** take logits ((1 + M)·B, K) of that batch and return one value per *clean* sample
i (its own terms and those of its M mixed copies), so ``"mean"`` averages over the B clean
samples, ``"sum"`` = ``"mean"``·B and ``"none"`` is (B,), as for every loss. The soft target of
copy m, row i is t_mi = λ_m onehot(y_i) + (1 − λ_m) onehot(y_{π_m(i)}). Called with plain labels
(B,) (no transform applied: e.g. a caller outside the training loop) they are cross-entropy —
the clean part alone.

Why not torch-uncertainty's ``RegMixup`` transform (Apache-2.0, the same mixing): importing it
imports Lightning and timm (``torch_uncertainty/__init__`` and ``transforms/mixup.py``), it
samples λ on the CPU and copies it to the device every step, and it has no RankMixup; the
mixing itself is three lines here (docs/losses.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from calibtune._registry import Param

from ._functional import _check_inputs, cross_entropy_loss
from ._kernel import compute_view, finish
from ._reduce import check_reduction

__all__ = [
    "MixedTargets",
    "mixup_batch",
    "rankmixup_loss",
    "rankmixup_mrl_loss",
    "regmixup_loss",
]

# the rules of the hyperparameters; each loss's defaults are its function's
# (`defaults_from_signature`)
MIX_ALPHA = Param("alpha", low=0.0, low_open=True, doc="Beta(α, α) concentration of the mixing λ")
ETA = Param("eta", low=0.0, doc="weight η ≥ 0 of the mixed samples' cross-entropy")
RANK_WEIGHT = Param("weight", low=0.0, doc="weight w ≥ 0 of the ranking term")
RANK_MARGIN = Param("margin", low=0.0, doc="margin m ≥ 0 of the ranking hinge (on logits)")
NUM_MIXUP = Param(
    "num_mixup", kind="int", low=1, searchable=False, doc="mixed copies M of the batch per step"
)


@dataclass(frozen=True)
class MixedTargets:
    """What `mixup_batch` hands the loss with the combined batch: ``labels`` (B,) int64 (the
    clean rows'), ``partner`` (M, B) int64 (copy m, row i mixes x_i with x_{partner[m, i]})
    and ``lam`` (M,) float (copy m is λ_m x_i + (1 − λ_m) x_partner)."""

    labels: Tensor
    partner: Tensor
    lam: Tensor

    @property
    def copies(self) -> int:
        return self.partner.shape[0]

    def partner_labels(self) -> Tensor:
        """y_{π_m(i)}, (M, B)."""
        return self.labels[self.partner]

    def soft(self, k: int, dtype: torch.dtype) -> Tensor:
        """The soft targets t_mi = λ_m onehot(y_i) + (1 − λ_m) onehot(y_{π_m(i)}), (M, B, K).

        >>> t = MixedTargets(torch.tensor([0, 2]), torch.tensor([[1, 0]]), torch.tensor([0.7]))
        >>> t.soft(3, torch.float32)[0]
        tensor([[0.7000, 0.0000, 0.3000],
                [0.3000, 0.0000, 0.7000]])
        """
        m, b = self.partner.shape
        lam = self.lam.to(dtype).view(m, 1, 1).expand(m, b, 1)
        out = torch.zeros(m, b, k, dtype=dtype, device=self.labels.device)
        # scatter, not F.one_hot: one_hot checks the labels' range with a host read
        out.scatter_add_(2, self.labels.expand(m, b).unsqueeze(2), lam)
        return out.scatter_add_(2, self.partner_labels().unsqueeze(2), 1 - lam)


def mixup_batch(x: Tensor, y: Tensor, alpha: float, copies: int = 1) -> tuple[Tensor, MixedTargets]:
    """The combined batch ``[x ; M mixed copies]`` ((1 + M)·B, ...) and its `MixedTargets`.

    λ_m ~ Beta(α, α) = G₁/(G₁ + G₂), G ~ Gamma(α, 1); π_m a uniform permutation (argsort of
    uniforms). All drawn on ``x.device`` from its default generator; no host read.

    >>> _ = torch.manual_seed(0)
    >>> x, y = torch.arange(4.0).view(4, 1), torch.tensor([0, 1, 2, 3])
    >>> xa, t = mixup_batch(x, y, alpha=10.0)
    >>> xa.shape, t.partner.shape, t.lam.shape
    (torch.Size([8, 1]), torch.Size([1, 4]), torch.Size([1]))
    >>> bool(torch.allclose(xa[4:, 0], t.lam * x[:, 0] + (1 - t.lam) * x[t.partner[0], 0]))
    True
    """
    b, dev = x.shape[0], x.device
    dtype = x.dtype if x.is_floating_point() else torch.float32
    conc = torch.full((2, copies), float(alpha), dtype=torch.float32, device=dev)
    g = torch.distributions.Gamma(conc, torch.ones_like(conc), validate_args=False).sample()
    lam = g[0] / (g[0] + g[1])
    partner = torch.rand(copies, b, device=dev).argsort(dim=1)
    lx = lam.to(dtype).view(copies, 1, *([1] * (x.dim() - 1)))
    mixed = (x.unsqueeze(0) * lx + x[partner] * (1 - lx)).flatten(0, 1)
    return torch.cat([x, mixed.to(x.dtype)]), MixedTargets(y, partner, lam)


def _split(logits: Tensor, targets: MixedTargets, fn: str) -> tuple[Tensor, Tensor, Tensor]:
    """Clean logits (B, K), mixed logits (M, B, K) and the clean labels, shapes checked."""
    y = targets.labels
    _check_inputs(logits[: y.shape[0]], y, fn)
    b, m = y.shape[0], targets.copies
    if logits.shape[0] != (1 + m) * b or targets.partner.shape != (m, b):
        raise ValueError(
            f"{fn}: logits: expected (1 + M)·B = {(1 + m) * b} rows for B={b} clean samples and "
            f"M={m} mixed copies, got {logits.shape[0]}"
        )
    return logits[:b], logits[b:].view(m, b, -1), y


def _plain(logits: Tensor, targets: Tensor, red: str, fn: str) -> Tensor:
    _check_inputs(logits, targets, fn)
    return cross_entropy_loss(logits, targets, red, validate_args=False)


def _reduction(reduction: str, validate_args: bool) -> str:
    return check_reduction(reduction) if validate_args else reduction


def regmixup_loss(
    logits: Tensor,
    targets: MixedTargets | Tensor,
    alpha: float = 10.0,
    eta: float = 1.0,
    reduction: str = "mean",
    *,
    validate_args: bool = True,
) -> Tensor:
    """RegMixup (Pinto et al., "Using Mixup as a Regularizer Can Surprisingly Improve Accuracy
    and Out-of-Distribution Robustness", NeurIPS 2022, Eq. 3)::

        ℓ_i = CE(z_i, y_i) + η · (1/M) Σ_m CE(z̃_mi, t_mi),   CE(z, t) = −Σ_k t_k log p_k

    on the combined batch of `mixup_batch` (M = 1 in the paper; ``alpha`` is the transform's,
    unused here). The soft-target CE is `cross_entropy_loss` with (B, K) targets, which equals
    λ CE(z̃, y_i) + (1 − λ) CE(z̃, y_π(i)) — the authors' ``regmixup_criterion``. The authors'
    code averages over all 2B rows, i.e. half of this loss at η = 1 (docs/losses.md).
    Shapes: ((1 + M)·B, K), `MixedTargets` -> scalar, or (B,) for ``"none"``.

    >>> z = torch.tensor([[2.0, 0.0], [0.0, 0.0]])         # row 0 clean (y = 0), row 1 mixed
    >>> t = MixedTargets(torch.tensor([0]), torch.tensor([[0]]), torch.tensor([0.5]))
    >>> # CE(clean) = log(1 + e^-2) = 0.12693; mixed p = (½, ½): CE = log 2 = 0.69315
    >>> round(float(regmixup_loss(z, t, eta=1.0)), 5)
    0.82008
    """
    red = _reduction(reduction, validate_args)
    if validate_args:
        ETA.validate(eta, "regmixup_loss")
    if isinstance(targets, Tensor):
        return _plain(logits, targets, red, "regmixup_loss")
    clean, mixed, y = _split(logits, targets, "regmixup_loss")
    m, b, k = mixed.shape
    soft = targets.soft(k, compute_view(logits).dtype).flatten(0, 1)
    ce = cross_entropy_loss(compute_view(clean), y, "none", validate_args=False)
    mix = cross_entropy_loss(compute_view(mixed).flatten(0, 1), soft, "none", validate_args=False)
    return finish(ce + eta * mix.view(m, b).mean(0), red, logits.dtype)


def _rank_parts(
    logits: Tensor, targets: MixedTargets, fn: str
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Clean logits (B, K) and their CE (B,), mixed logits (M, B, K), and whether copy m of
    row i mixes two samples of one class (M, B) — its soft target is one-hot."""
    clean, mixed, y = _split(logits, targets, fn)
    ce = cross_entropy_loss(compute_view(clean), y, "none", validate_args=False)
    same = targets.partner_labels() == y.unsqueeze(0)
    return compute_view(clean), ce, compute_view(mixed), same


def rankmixup_mrl_loss(
    logits: Tensor,
    targets: MixedTargets | Tensor,
    alpha: float = 1.0,
    margin: float = 0.1,
    weight: float = 0.1,
    reduction: str = "mean",
    *,
    validate_args: bool = True,
) -> Tensor:
    """RankMixup, mixup ranking loss M-RL (Noh et al., "RankMixup: Ranking-Based Mixup Training
    for Network Calibration", ICCV 2023, Eq. 6)::

        ℓ_i = CE(z_i, y_i) + w · (1/M) Σ_m 1[y_π(i) ≠ y_i] · max(0, max_k z̃_mik − max_k z_ik + m)

    The mixed sample's top score must sit a margin below its clean source's. The paper writes
    it with confidences; the authors' code (``RankMixup_MRL.get_logit_diff``, the probability
    version commented out) uses the logits, on which its m = 0.1, w = 0.1 were set, and skips
    copies whose soft target is one-hot (it tests ``t == 1.0``; here the labels, exactly). Its
    (B,) mask times the (B, 1) hinges broadcasts to (B, B), so its mean is the fraction of
    two-class copies times the mean of *all* hinges; here each copy is masked by itself.
    Shapes: ((1 + M)·B, K), `MixedTargets` -> scalar, or (B,) for ``"none"``.

    >>> z = torch.tensor([[1.0, 0.0], [1.5, 0.0]])        # the mixed row is more confident
    >>> t = MixedTargets(torch.tensor([0]), torch.tensor([[0]]), torch.tensor([0.6]))
    >>> # same class (partner = itself): no ranking term, CE = log(1 + e^-1) = 0.31326
    >>> round(float(rankmixup_mrl_loss(z, t)), 5)
    0.31326
    >>> t2 = MixedTargets(torch.tensor([0, 1]), torch.tensor([[1, 0]]), torch.tensor([0.6]))
    >>> z2 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.5, 0.0], [0.0, 0.5]])
    >>> # CE 0.31326 each; hinges max(0, 1.5 − 1 + 0.1) = 0.6 and max(0, 0.5 − 1 + 0.1) = 0
    >>> round(float(rankmixup_mrl_loss(z2, t2, margin=0.1, weight=0.1)), 5)
    0.34326
    """
    red = _reduction(reduction, validate_args)
    if validate_args:
        RANK_MARGIN.validate(margin, "rankmixup_mrl_loss")
        RANK_WEIGHT.validate(weight, "rankmixup_mrl_loss")
    if isinstance(targets, Tensor):
        return _plain(logits, targets, red, "rankmixup_mrl_loss")
    clean, ce, mixed, same = _rank_parts(logits, targets, "rankmixup_mrl_loss")
    top = clean.amax(dim=1)
    hinge = torch.relu(mixed.amax(dim=2) - top + margin).masked_fill(same, 0.0)
    return finish(ce + weight * hinge.mean(0), red, logits.dtype)


def rankmixup_loss(
    logits: Tensor,
    targets: MixedTargets | Tensor,
    alpha: float = 1.0,
    weight: float = 0.1,
    num_mixup: int = 3,
    reduction: str = "mean",
    *,
    validate_args: bool = True,
) -> Tensor:
    """RankMixup, M-NDCG (Noh et al., ICCV 2023, Eq. 7–9): CE on the clean samples plus
    w·(1 − NDCG) of the confidences of each clean sample and its M mixed copies ranked by
    their label mass::

        ℓ_i = CE(z_i, y_i) + w · (1 − N_i)
        r_i0 = 1, r_im = max_k t_mik (= max(λ_m, 1 − λ_m), 1 for a same-class pair)
        c_i0 = max_k p_ik, c_im = max_k p̃_mik; order the copies by r descending (clean first)
        DCG_i = Σ_j c_i(j) / log₂(j + 2),  IDCG_i = Σ_j r_i(j) / log₂(j + 2)  (j = 0..M)
        N_i = DCG_i / IDCG_i if IDCG_i > DCG_i else IDCG_i / DCG_i

    as the authors' ``RankMixup_MNDCG.get_indcg`` (which sorts the copies by r and uses that
    order for both sums; ties keep any order: equal r, so only the sum of their c matters in
    IDCG, and DCG changes by less than the tie's gain difference). ``num_mixup`` is M, used by
    the transform. Shapes: ((1 + M)·B, K), `MixedTargets` -> scalar, or (B,) for ``"none"``.

    >>> z = torch.tensor([[0.0, 0.0], [0.0, 0.0]])        # clean c = ½, one copy c = ½
    >>> t = MixedTargets(torch.tensor([0]), torch.tensor([[0]]), torch.tensor([0.7]))
    >>> # r = (1, 1) (same class): IDCG = 1 + 1/log₂3 = 1.63093, DCG = ½·IDCG → N = ½
    >>> # CE = log 2 = 0.69315; + 0.1·(1 − ½)
    >>> round(float(rankmixup_loss(z, t, weight=0.1, num_mixup=1)), 5)
    0.74315
    """
    red = _reduction(reduction, validate_args)
    if validate_args:
        RANK_WEIGHT.validate(weight, "rankmixup_loss")
    if isinstance(targets, Tensor):
        return _plain(logits, targets, red, "rankmixup_loss")
    clean, ce, mixed, same = _rank_parts(logits, targets, "rankmixup_loss")
    lam = targets.lam.to(clean.dtype).view(-1, 1)
    rel = torch.where(same, 1.0, torch.maximum(lam, 1 - lam)).t()  # (B, M)
    conf = torch.softmax(mixed, dim=2).amax(dim=2).t()  # (B, M)
    order = rel.argsort(dim=1, descending=True)
    top = torch.softmax(clean, dim=1).amax(dim=1, keepdim=True)
    gains = torch.cat([top, conf.gather(1, order)], 1)  # (B, 1 + M), clean first
    ideal = torch.cat([torch.ones_like(top), rel.gather(1, order)], 1)
    pos = torch.arange(gains.shape[1], dtype=gains.dtype, device=gains.device)
    disc = torch.log2(pos + 2)
    dcg, idcg = (gains / disc).sum(1), (ideal / disc).sum(1)
    ndcg = torch.where(idcg > dcg, dcg / idcg, idcg / dcg)
    return finish(ce + weight * (1 - ndcg), red, logits.dtype)
