"""Temperature scaling: p = softmax(z / T) with one scalar T > 0 fitted on validation logits.

Protocols of the seed papers, all on the grid T ∈ {0.1, 0.2, …, 10.0} with ties going to the
smallest T: Mukhoti et al. 2020 (§5, "Temperature Scaling") keep the T minimising the validation
ECE (15 equal-width bins, ``criterion="ece"``, the default); Ghosh et al. 2022 (§6 and Table 1)
the T minimising the validation ECE_EM (15 equal-mass bins, ``criterion="adaece"``; their
appendix tables select on equal-width ECE). Komisarenko & Kull 2024 (§5.1) compare focal TS with
TS "selected over the same values grid and same choice criteria": ``t_grid="focal_ts"``
({0.01, 0.02, …, 5.00}) with ``criterion="adaece"`` or ``"nll"``. ``criterion="nll"`` without a
grid minimises the validation NLL continuously over log T (Guo et al. 2017). Temperature scaling
never changes the argmax.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch
from scipy.optimize import minimize_scalar

from calibtune._registry import Param
from calibtune.metrics.validation import ArrayLike, logits_labels

from ._base import PosthocCalibrator
from ._grid import binned_criterion_grid, first_minimum

# T = k/10, k = 1..100, each the double nearest to k/10 (not accumulated by repeated += 0.1).
DEFAULT_TEMPERATURES: tuple[float, ...] = tuple(k / 10 for k in range(1, 101))
# T = k/100, k = 1..500 (Komisarenko & Kull's "0.01 to 5 with a step of 0.01"), exact k/100.
DEFAULT_FOCAL_TEMPERATURES: tuple[float, ...] = tuple(k / 100 for k in range(1, 501))
# The named grids a study may select with ``t_grid:`` (focal TS's default grid is "focal_ts").
TEMPERATURE_GRIDS: dict[str, tuple[float, ...]] = {
    "ts": DEFAULT_TEMPERATURES,
    "focal_ts": DEFAULT_FOCAL_TEMPERATURES,
}

# Rules shared by the temperature-scaling methods' declarations (each adds its own doc).
CRITERION = Param("criterion", kind="categorical", choices=("ece", "adaece", "nll"))
N_BINS = Param("n_bins", kind="int", low=1, searchable=False, doc="bins of the ECE criterion")
TEMPERATURES = Param("temperatures", kind="float_list", low=0.0, low_open=True, searchable=False)

# Elements of the (chunk, N, K) intermediate per grid chunk: 2**20 float32 = 4 MiB, small
# enough to stay in cache (measured ~3x faster than 32 MiB chunks on 5k x 100).
CHUNK_ELEMS = 2**20


def _shifted(z: torch.Tensor) -> torch.Tensor:
    """z − max_k z: every entry ≤ 0 and the (first) top entry exactly 0."""
    return z - z.amax(dim=-1, keepdim=True)


def _beta(t: float | torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # Multiply by 1/T instead of dividing by T: a product rounds the same way whether the factor
    # is a 0-dim scalar or a broadcast (G, 1, 1) tensor, so the grid search reproduces
    # `ts_probs` bit for bit.
    return (1.0 / torch.as_tensor(t, dtype=torch.float64)).to(dtype)


def ts_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / T), (N, K) -> (N, K), computed as exp((z − max z)/T) / Σ_k exp(·)."""
    e = torch.exp(_shifted(logits) * _beta(temperature, logits.dtype).to(logits.device))
    return e / e.sum(dim=-1, keepdim=True)


def ts_top_label_grid(
    logits: torch.Tensor, labels: torch.Tensor, temperatures: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-label confidence and correctness of ``ts_probs(logits, T)`` for every T at once.

    Shapes: logits (N, K), labels (N,), temperatures (G,) -> conf (G, N) in logits' dtype,
    correct (G, N) bool. The confidence is max_k softmax = 1 / Σ_k exp((z_k − max z)/T), the
    same float operations as `ts_probs` followed by ``max``; the grid is processed in chunks of
    at most `CHUNK_ELEMS` elements.
    """
    n, k = logits.shape
    dz = _shifted(logits)
    betas = _beta(temperatures, logits.dtype).to(logits.device)
    pred = dz.argmax(dim=-1)
    # The argmax of softmax(z/T) is the argmax of z unless the runner-up's probability rounds up
    # to the top one; find those rows once (the largest T is the worst case) and redo their
    # argmax per T exactly as `metrics.ece` would see it.
    runner_up = dz.scatter(-1, pred[:, None], -torch.inf).amax(dim=-1)
    eps = torch.finfo(logits.dtype).eps
    near = torch.nonzero(torch.exp(runner_up * betas.min()) >= 1 - 4 * eps).flatten()
    g = temperatures.numel()
    conf = torch.empty(g, n, dtype=logits.dtype, device=logits.device)
    preds = pred.expand(g, n).clone()
    step = max(1, CHUNK_ELEMS // (n * k))
    for lo in range(0, g, step):
        b = betas[lo : lo + step, None, None]
        e = torch.exp(dz * b)
        s = e.sum(dim=-1)
        conf[lo : lo + step] = s.reciprocal()
        if near.numel():
            p_near = e[:, near] / s[:, near, None]
            preds[lo : lo + step, near] = p_near.argmax(dim=-1)
    return conf, preds == labels


def ts_nll(logits64: torch.Tensor, labels: torch.Tensor, log_t: float) -> float:
    """Mean NLL of softmax(z / exp(log_t)) in float64."""
    lp = torch.log_softmax(logits64 * math.exp(-log_t), dim=-1)
    return float(-lp.gather(1, labels[:, None]).mean())


def fit_temperature_nll(
    logits: torch.Tensor, labels: torch.Tensor, t_min: float, t_max: float
) -> tuple[float, float]:
    """argmin_T NLL over log T ∈ [log t_min, log t_max] (bounded Brent); returns (T, NLL).

    NLL is convex in 1/T, hence unimodal in log T, so a bounded scalar search finds the global
    minimum; optimising log T keeps T positive by construction.
    """
    z64 = logits.to(torch.float64)
    res = minimize_scalar(
        lambda u: ts_nll(z64, labels, u),
        bounds=(math.log(t_min), math.log(t_max)),
        method="bounded",
        options={"xatol": 1e-9},
    )
    return math.exp(float(res.x)), float(res.fun)


def nll_grid(
    logits: torch.Tensor, labels: torch.Tensor, temperatures: torch.Tensor
) -> torch.Tensor:
    """Mean validation NLL of softmax(z / T) for every T: (N, K), (N,), (G,) -> (G,) float64.

    Computed in float64 like `ts_nll`, at most `CHUNK_ELEMS` elements per chunk of T's.
    """
    z64 = logits.to(torch.float64)
    betas = 1.0 / temperatures.to(torch.float64)
    n, k = z64.shape
    out = torch.empty(betas.numel(), dtype=torch.float64, device=z64.device)
    step = max(1, CHUNK_ELEMS // (n * k))
    idx = labels[None, :, None]
    for lo in range(0, betas.numel(), step):
        lp = torch.log_softmax(z64 * betas[lo : lo + step, None, None], dim=-1)
        out[lo : lo + step] = -lp.gather(-1, idx.expand(lp.shape[0], n, 1)).mean(dim=(1, 2))
    return out


def temperature_grid(temperatures: Any, default: tuple[float, ...]) -> tuple[float, ...]:
    """Sorted, de-duplicated grid so that the first minimum is the smallest T."""
    return tuple(sorted(set(default if temperatures is None else temperatures)))


class TemperatureScaling(PosthocCalibrator):
    """p = softmax(z / T), T chosen on validation.

    ``criterion="ece"`` (default, Mukhoti et al.'s protocol): T from the grid minimising the
    15-bin equal-width ECE of `calibtune.metrics.ece`; ``criterion="adaece"``: the equal-mass
    ECE of `calibtune.metrics.adaece` (Ghosh et al.'s ECE_EM). The grid is ``temperatures`` if
    given, else the named ``t_grid`` (default "ts" = {0.1, …, 10.0}, T = k/10 exactly). Ties
    (within a 1e-12 relative tolerance) go to the smallest T. ``criterion="nll"``: T minimising
    the validation NLL — over the grid when ``t_grid`` or ``temperatures`` is given (Komisarenko &
    Kull's "same grid and same choice criteria"), else continuously over log T ∈ [t_min, t_max].

    Fitted attributes: ``T`` (float), ``criterion_value`` (validation criterion at ``T``),
    ``grid`` and ``curve`` (grid searches: the candidate T's and their criterion, float64 CPU
    tensors; empty for the continuous nll search).

    Shapes: fit(val_logits (N, K), val_labels (N,)); calibrate(logits (M, K)) -> (M, K).
    References: Guo et al. 2017; Mukhoti et al. 2020 (grid, validation ECE); Ghosh et al. 2022
    (ECE_EM); Komisarenko & Kull 2024, §5.1.
    """

    name = "ts"
    PARAMS = (
        replace(
            CRITERION,
            doc="validation criterion: ece (equal-width, grid), adaece (equal-mass, grid), "
            "nll (continuous over log T)",
        ),
        N_BINS,
        Param(
            "t_grid",
            kind="categorical",
            choices=tuple(TEMPERATURE_GRIDS),
            searchable=False,
            doc="named grid of T: ts = {0.1, …, 10.0} (Mukhoti, Ghosh), focal_ts = {0.01, …, 5.00} "
            "(Komisarenko & Kull); None = ts for ece/adaece, continuous for nll",
        ),
        replace(
            TEMPERATURES,
            doc="explicit grid of T (instead of t_grid); with nll it makes the search a grid "
            "search",
        ),
        Param("t_min", low=0.0, low_open=True, searchable=False, doc="lower bound of T (nll)"),
        Param("t_max", low=0.0, low_open=True, searchable=False, doc="upper bound of T (nll)"),
    )

    def __init__(
        self,
        criterion: str = "ece",
        n_bins: int = 15,
        t_grid: str | None = None,
        temperatures: Any = None,
        t_min: float = 0.01,
        t_max: float = 100.0,
    ) -> None:
        super().__init__()
        self._configure(self._checked(locals()))

    def _configure(self, cfg: dict[str, Any]) -> None:
        owner = type(self).__name__
        if cfg["t_min"] >= cfg["t_max"]:
            raise ValueError(
                f"{owner}: expected t_min < t_max, got t_min={cfg['t_min']!r}, "
                f"t_max={cfg['t_max']!r}"
            )
        if cfg["t_grid"] is not None and cfg["temperatures"] is not None:
            raise ValueError(
                f"{owner}: expected at most one of t_grid and temperatures, got t_grid="
                f"{cfg['t_grid']!r} and temperatures"
            )
        self.criterion: str = cfg["criterion"]
        self.n_bins: int = cfg["n_bins"]
        # nll without a grid: continuous search; every other case: a grid search
        self.t_grid: str | None = cfg["t_grid"]
        self.on_grid = self.criterion != "nll" or (
            cfg["t_grid"] is not None or cfg["temperatures"] is not None
        )
        default = TEMPERATURE_GRIDS[cfg["t_grid"] or "ts"]
        self.temperatures = temperature_grid(cfg["temperatures"], default)
        self.t_min: float = cfg["t_min"]
        self.t_max: float = cfg["t_max"]
        if self.criterion == "nll":
            # the registry entry "ts_nll"; the class attribute stays "ts"
            self.name = "ts_nll"
        self.T: float = math.nan
        self.criterion_value: float = math.nan
        self.grid = torch.empty(0, dtype=torch.float64)
        self.curve = torch.empty(0, dtype=torch.float64)

    def _fit(self, z: torch.Tensor, y: torch.Tensor) -> None:
        if not self.on_grid:
            self.T, self.criterion_value = fit_temperature_nll(z, y, self.t_min, self.t_max)
            return
        temps = torch.tensor(self.temperatures, dtype=torch.float64, device=z.device)
        if self.criterion == "nll":
            curve = nll_grid(z, y, temps).cpu()
        else:
            conf, correct = ts_top_label_grid(z, y, temps)
            curve = binned_criterion_grid(self.criterion, conf, correct, self.n_bins).cpu()
        best = first_minimum(curve)
        self.T = self.temperatures[best]
        self.criterion_value = float(curve[best])
        self.grid, self.curve = temps.cpu(), curve

    def _calibrate(self, z: torch.Tensor) -> torch.Tensor:
        return ts_probs(z, self.T)

    def _params(self) -> dict[str, float]:
        return {"T": float(self.T)}


def refinement_nll(
    logits: ArrayLike,
    labels: ArrayLike,
    t_min: float = 0.01,
    t_max: float = 100.0,
    *,
    validate_args: bool = True,
) -> float:
    """min over T ∈ [t_min, t_max] of the mean NLL of softmax(logits / T) on these samples.

    Shapes: logits (N, K) (log-probabilities work too: TS is shift-invariant per row), labels
    (N,). The fit is `fit_temperature_nll` (bounded Brent over log T;
    NLL is convex in 1/T). Berta et al. 2025: refinement error = NLL after optimal re-calibration.
    """
    z, y = logits_labels(logits, labels, validate_args=validate_args)
    return fit_temperature_nll(z, y, t_min, t_max)[1]
