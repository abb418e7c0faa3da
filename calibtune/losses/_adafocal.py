"""AdaFocal (Ghosh et al. 2022, Algorithm 1), CalFocal (Eq. 3) and AdaDualFocal (Tao et al. §5.2).

The pure parts — validation binning and the γ update rules — are functions; the loss modules hold
the explicit state (per-bin ``gammas``, inner ``edges``, an update ``history``) that the training
loop updates from cached validation probabilities with ``update()``.

Conventions:

* Initial bins are equal-width with inner edges exactly i/M (i/M divided in float64 and rounded
  once to p_y's dtype, as the metrics' edges; Algorithm 1, line 3) and γ = ``gamma_init``.
* Training samples are binned by their true-class probability p_y: bin b = [e_b, e_{b+1}), the
  first open below and the last open above (so p_y equal to an edge goes to the upper bin).
* ``update`` re-bins the validation set into equal-mass groups of top-label confidence with
  exactly `calibtune.metrics.adaece`'s grouping (sort by confidence, ``numpy.array_split``
  sizes, tied confidences kept in one group, every sample counted), so the bins depend on the
  confidences alone — not on the labels or the order of the validation set; the inner edge
  between groups b−1 and b is the smallest confidence in group b. E_b = C_val,b − A_val,b (mean
  confidence − accuracy) drives the rule. A group emptied by ties (its run of tied confidences
  started in an earlier group) has zero width, C_val = A_val = NaN in the record and E_b = 0, so
  its γ is only subject to the sign switch; no training sample falls in it.
* State and arithmetic are float64; ``state_dict()`` round-trips exactly and loads with
  ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import copy
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from calibtune._registry import Param
from calibtune.metrics.binning import bin_stats, equal_mass_sort, equal_mass_starts
from calibtune.metrics.validation import ArrayLike, check_probs_labels

from . import _functional as F
from ._base import CalibrationLoss
from ._registry import register_loss

__all__ = [
    "AdaDualFocalLoss",
    "AdaFocalLoss",
    "CalFocalLoss",
    "ValidationBins",
    "adafocal_gamma_update",
    "calfocal_gammas",
    "initial_edges",
    "validation_bins",
]

_F64 = torch.float64
_STATE_VERSION = 1


class ValidationBins(NamedTuple):
    """Equal-mass validation bins: inner ``edges`` (M−1,), per-bin ``conf`` = C_val, ``acc`` =
    A_val and ``counts`` (M,), all float64 on the device of the probabilities."""

    edges: torch.Tensor
    conf: torch.Tensor
    acc: torch.Tensor
    counts: torch.Tensor


def initial_edges(n_bins: int) -> torch.Tensor:
    """Inner edges (n_bins−1,) of the equal-width initial bins: 1/M, 2/M, …, (M−1)/M (float64)."""
    return torch.arange(1, n_bins, dtype=_F64) / n_bins


def validation_bins(probs: ArrayLike, labels: ArrayLike, n_bins: int) -> ValidationBins:
    """Bin validation predictions into ``n_bins`` equal-mass groups of top-label confidence.

    The grouping is `calibtune.metrics.adaece`'s (ties kept together); edge b (between groups
    b−1 and b) is the smallest confidence in group b (for an empty group: where the next
    non-empty one starts, or 1). Needs N ≥ n_bins. O(N log N). Empty groups have count 0 and
    NaN ``conf``/``acc``.
    Shapes: ``probs`` (N, K) probabilities (softmax of the logits), ``labels`` (N,).
    """
    p, y = check_probs_labels(probs, labels, n_bins)
    n = p.shape[0]
    if n < n_bins:
        raise ValueError(
            f"validation_bins: expected at least n_bins={n_bins} validation samples (one per "
            f"equal-mass bin), got {n}"
        )
    conf, pred = p.max(dim=1)
    correct = pred == y
    order, ids = equal_mass_sort(conf, n_bins)
    conf64 = conf.to(_F64)
    counts, conf_sum, acc_sum = bin_stats(ids, conf64, correct.to(_F64), n_bins)
    edges = equal_mass_starts(conf64[order], ids[order], n_bins)[1:]
    return ValidationBins(edges, conf_sum / counts, acc_sum / counts, counts)


def adafocal_gamma_update(
    gammas: torch.Tensor,
    gap: torch.Tensor,
    lam: float,
    gamma_max: float,
    gamma_min: float,
    switch_threshold: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One γ update of Algorithm 1 (Ghosh et al. 2022), vectorised over bins.

    With E_b = ``gap`` = C_val,b − A_val,b (M,)::

        γ_b ≥ 0:  γ ← min(γ_max, γ·exp(λE_b));   if |γ| < S_th: γ ← −S_th   (to inverse focal)
        γ_b < 0:  γ ← max(γ_min, γ·exp(−λE_b));  if |γ| < S_th: γ ← S_th    (back to focal)

    Returns the new γ (M,) and a bool mask (M,) of the bins whose sign switched.
    """
    focal = gammas >= 0
    scaled = gammas * torch.exp(torch.where(focal, lam * gap, -lam * gap))
    new = torch.where(focal, scaled.clamp(max=gamma_max), scaled.clamp(min=gamma_min))
    switched = new.abs() < switch_threshold
    flipped = torch.where(focal, -1.0, 1.0).to(new.dtype) * switch_threshold
    return torch.where(switched, flipped, new), switched


def calfocal_gammas(gap: torch.Tensor, lam: float) -> torch.Tensor:
    """CalFocal's per-bin γ_b = exp(λ(C_val,b − A_val,b)) (Ghosh et al. 2022, Eq. 3)."""
    return torch.exp(lam * gap)


def _check_update_every(value: Any, owner: str) -> str | int:
    if value == "epoch" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ValueError(
        f"{owner}: update_every: expected 'epoch' or an integer number of training batches "
        f">= 1, got {value!r}"
    )


def _bins_param() -> Param:
    return Param("n_bins", 15, kind="int", low=1, doc="number of equal-mass validation bins M")


def _update_every_param() -> Param:
    return Param(
        "update_every",
        "epoch",
        kind="any",
        doc="'epoch' or an int: update γ every that many training batches (Ghosh et al. App. I)",
    )


def _ada_params() -> list[Param]:
    return [
        _bins_param(),
        Param("lam", 1.0, kind="float", low=0.0, doc="λ in γ·exp(λE)"),
        Param(
            "gamma_init", 1.0, kind="float", doc="initial γ of every bin, in [gamma_min, gamma_max]"
        ),
        Param("gamma_max", 20.0, kind="float", low=0.0, low_open=True, doc="upper bound γ_max > 0"),
        Param(
            "gamma_min", -2.0, kind="float", high=0.0, high_open=True, doc="lower bound γ_min < 0"
        ),
        Param(
            "switch_threshold",
            0.2,
            kind="float",
            low=0.0,
            low_open=True,
            doc="S_th: switch focal/inverse focal when |γ| < S_th",
        ),
        _update_every_param(),
    ]


class _BinnedGammaLoss(CalibrationLoss):
    """Per-validation-bin γ with state updated by ``update()``; subclasses define the rule."""

    adaptive = True
    gammas: torch.Tensor
    edges: torch.Tensor

    def _configure(self) -> None:
        self.n_bins: int = self.hparams["n_bins"]
        self.update_every: str | int = _check_update_every(self.hparams["update_every"], self.name)
        self.register_buffer("gammas", torch.full((self.n_bins,), self._gamma_init(), dtype=_F64))
        self.register_buffer("edges", initial_edges(self.n_bins))
        self.history: list[dict[str, Any]] = []
        # history records every rank holds identically (see broadcast_state)
        self._synced_len = 0

    def _gamma_init(self) -> float:
        raise NotImplementedError

    def _next_gammas(self, gap: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    @torch.no_grad()
    def update(
        self, val_probs: ArrayLike, val_labels: ArrayLike, step: int | None = None
    ) -> dict[str, Any]:
        """Re-bin the validation set and update every bin's γ (Algorithm 1, lines 14-23).

        ``val_probs`` (N, K) are softmax probabilities of the current model on the validation set
        (N ≥ n_bins), ``val_labels`` (N,). ``step`` labels the record (default: the number of
        updates so far, counting this one). Returns the record appended to ``history``: a dict
        of plain Python values with keys ``step``, ``edges`` (M−1), ``c_val``, ``a_val``,
        ``counts``, ``gammas`` (after the update) and ``switched`` (M bools).
        """
        try:
            bins = validation_bins(val_probs, val_labels, self.n_bins)
        except ValueError as exc:
            raise ValueError(f"{self.name}.update(val_probs, val_labels): {exc}") from None
        # an empty bin carries no evidence: E_b = 0 (NaN would poison its γ for good)
        gap = torch.nan_to_num(bins.conf - bins.acc, nan=0.0).to(self.gammas.device)
        new, switched = self._next_gammas(gap)
        self.gammas.copy_(new)
        self.edges.copy_(bins.edges)
        record = {
            "step": int(step) if step is not None else len(self.history) + 1,
            "edges": bins.edges.tolist(),
            "c_val": bins.conf.tolist(),
            "a_val": bins.acc.tolist(),
            "counts": [int(c) for c in bins.counts.tolist()],
            "gammas": self.gammas.tolist(),
            "switched": switched.tolist(),
        }
        self.history.append(record)
        return copy.deepcopy(record)

    def _config(self) -> dict[str, Any]:
        return dict(self.hparams)

    def get_extra_state(self) -> dict[str, Any]:
        return {
            "version": _STATE_VERSION,
            "loss": self.name,
            "config": self._config(),
            "history": copy.deepcopy(self.history),
        }

    def set_extra_state(self, state: Any) -> None:
        expected = {"version": _STATE_VERSION, "loss": self.name, "config": self._config()}
        got = {k: state.get(k) for k in expected} if isinstance(state, dict) else state
        if got != expected:
            raise ValueError(
                f"{self.name}.load_state_dict: expected state saved by {expected}, got {got}"
            )
        self.history = copy.deepcopy(state["history"])
        self._synced_len = len(self.history)

    def broadcast_state(self, src: int = 0) -> None:
        """Make ``gammas``, ``edges`` and ``history`` on every rank identical to rank ``src``'s.

        A collective: when ``torch.distributed`` is initialised every rank must call it (no-op
        otherwise). Call it after the validation update — either every rank calls ``update`` on
        the full validation set, or only ``src`` does — so that all Ray Train workers bin and
        weight their samples identically. Only the history records added since the previous
        broadcast travel (as Python objects via ``broadcast_object_list``).
        """
        if not (dist.is_available() and dist.is_initialized()):
            return
        payload: list[Any] = [None]
        if dist.get_rank() == src:
            payload[0] = {
                "gammas": self.gammas.tolist(),
                "edges": self.edges.tolist(),
                "start": self._synced_len,
                "tail": self.history[self._synced_len :],
            }
        dist.broadcast_object_list(payload, src=src)
        state = payload[0]
        if state["start"] != self._synced_len:
            raise RuntimeError(
                f"{self.name}.broadcast_state: expected rank {src} to have synced "
                f"{self._synced_len} history records like this rank, got {state['start']}; call "
                "broadcast_state on every rank after every update"
            )
        self.gammas.copy_(torch.tensor(state["gammas"], dtype=_F64, device=self.gammas.device))
        self.edges.copy_(torch.tensor(state["edges"], dtype=_F64, device=self.edges.device))
        self.history = self.history[: state["start"]] + state["tail"]
        self._synced_len = len(self.history)


class _AdaFocalRule(_BinnedGammaLoss):
    def _configure(self) -> None:
        super()._configure()
        h = self.hparams
        if not h["gamma_min"] <= h["gamma_init"] <= h["gamma_max"]:
            raise ValueError(
                f"{self.name}: gamma_init: expected a number in [gamma_min, gamma_max] = "
                f"[{h['gamma_min']:g}, {h['gamma_max']:g}], got {h['gamma_init']!r}"
            )

    def _gamma_init(self) -> float:
        return self.hparams["gamma_init"]

    def _next_gammas(self, gap: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.hparams
        return adafocal_gamma_update(
            self.gammas, gap, h["lam"], h["gamma_max"], h["gamma_min"], h["switch_threshold"]
        )


@register_loss(
    "adafocal",
    params=_ada_params(),
    summary="AdaFocal: per-validation-bin γ, focal/inverse focal (Ghosh et al. 2022, Alg. 1)",
)
class AdaFocalLoss(_AdaFocalRule):
    """AdaFocal (`calibtune.losses.functional.adafocal_loss` with state from Algorithm 1).

    State: ``gammas`` (n_bins,), inner ``edges`` (n_bins−1,), ``history``. Call
    ``update(val_probs, val_labels)`` every ``update_every`` ("epoch" or n training batches) and,
    when several workers train one model, ``broadcast_state()`` after it.
    """

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.adafocal_loss(
            logits, targets, self.gammas, self.edges, self.reduction, validate_args=False
        )


@register_loss(
    "adadual_focal",
    params=_ada_params(),
    summary="AdaDualFocal: AdaFocal's per-bin γ on the dual focal form (Tao et al. 2023, §5.2)",
)
class AdaDualFocalLoss(_AdaFocalRule):
    """AdaDualFocal (`calibtune.losses.functional.adadual_focal_loss`); state as `AdaFocalLoss`.

    Unlike the authors' code (whose γ never changes), γ is updated by Algorithm 1.
    """

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.adadual_focal_loss(
            logits, targets, self.gammas, self.edges, self.reduction, validate_args=False
        )


@register_loss(
    "calfocal",
    params=[
        _bins_param(),
        Param("lam", 10.0, kind="float", low=0.0, doc="λ in γ_b = exp(λ(C_val,b − A_val,b))"),
        _update_every_param(),
    ],
    summary="CalFocal: focal with γ_b = exp(λ(C_val,b − A_val,b)) (Ghosh et al. 2022, Eq. 3)",
)
class CalFocalLoss(_BinnedGammaLoss):
    """CalFocal (`calibtune.losses.functional.calfocal_loss`); γ_b = 1 until the first update."""

    def _gamma_init(self) -> float:
        return 1.0

    def _next_gammas(self, gap: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return calfocal_gammas(gap, self.hparams["lam"]), torch.zeros_like(gap, dtype=torch.bool)

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.calfocal_loss(
            logits, targets, self.gammas, self.edges, self.reduction, validate_args=False
        )
