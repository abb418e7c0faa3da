"""The metric keys a trial config will report: `calibtune.metrics.keys.expected_keys` filled in
from the config (its post-hoc methods, OOD and shift sets and severities from `calibtune.data`,
whether its loss is adaptive). Lives in the trial layer because the core must not know
`TrialConfig`.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import torch

from calibtune import data as D
from calibtune.metrics import keys as K
from calibtune.posthoc import POSTHOC, build_posthoc, fitted_values

# ``cfg``: a `calibtune.trial.TrialConfig` (typed Any: the config module imports this one)
TrialConfig = Any

__all__ = ["metric_keys", "shift_sets"]


@lru_cache(maxsize=64)
def _param_names(method: str, params: tuple[tuple[str, Any], ...]) -> tuple[str, ...]:
    """Names of the parameters ``method`` reports once fitted (``posthoc/<method>/<name>``).

    Post-hoc methods declare their constructor parameters, not their fitted ones (spline's
    depend on ``n_knots``), so fit once on a small fixed random problem (20 × 2 logits) and read
    them off: the names never depend on the data. Search grids the user left at their default
    (``float_list`` parameters) shrink to one point so that this takes milliseconds."""
    given = dict(params)
    for p in POSTHOC.get(method).params:
        if p.kind == "float_list" and p.name not in given:
            given[p.name] = (1.0,)
    g = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(20, 2, generator=g)
    labels = torch.randint(0, 2, (20,), generator=g)
    return tuple(fitted_values(build_posthoc(method, **given).fit(logits, labels)))


def ood_sources(cfg: TrialConfig) -> list[str]:
    """``svhn``, ``digits_noise/s1`` …: every OOD set (and severity) the trial evaluates."""
    names = cfg.data.ood if cfg.data.ood is not None else tuple(D.default_ood(cfg.data.name))
    return [K.ood_source(n, s) for n in names for s in (D.ood_severities(n) or (None,))]


def shift_sets(cfg: TrialConfig) -> list[str]:
    """The shift sets the trial evaluates (``data.shift``, else the dataset's defaults)."""
    return list(D.default_shift(cfg.data.name) if cfg.data.shift is None else cfg.data.shift)


def epoch_shift_sets(cfg: TrialConfig) -> list[tuple[str, Any]]:
    """``(set, severities)`` of the validation-side shift sets every epoch reports
    (``eval.epoch_shift``), else none."""
    if not cfg.eval.epoch_shift:
        return []
    sides = [(n, D.shift_severities(n)) for n in shift_sets(cfg)]
    return [(n, sev["val_shift"]) for n, sev in sides if "val_shift" in sev]


def metric_keys(cfg: TrialConfig, *, posthoc_params: bool = True) -> frozenset[str]:
    """Every metric key a trial run with ``cfg`` reports (its epoch reports and its final
    metrics); ``posthoc_params=False`` leaves out ``posthoc/<method>/<param>`` (no fitting)."""
    loss = cfg.loss.build()
    params: Mapping[str, tuple[str, ...]] | None = None
    if posthoc_params:
        params = {
            m: _param_names(m, tuple(sorted(dict(p).items()))) for m, p in cfg.eval.posthoc.items()
        }
    shift = [(side, n, sev) for n in shift_sets(cfg) for side, sev in D.shift_severities(n).items()]
    return K.expected_keys(
        select_best=cfg.eval.select_epoch == "best",
        gpu=cfg.scaling.use_gpu,
        posthoc=cfg.eval.posthoc,
        posthoc_params=params,
        epoch_posthoc=cfg.eval.epoch_posthoc,
        ood=ood_sources(cfg),
        shift=shift,
        epoch_shift=epoch_shift_sets(cfg),
        adaptive=bool(getattr(loss, "adaptive", False)),
        bootstrap=cfg.eval.bootstrap > 0,
        epoch_selective=cfg.eval.epoch_selective,
    )
