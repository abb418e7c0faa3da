"""Accuracy-constrained search: a study's ``search.constraints`` and how a trial is judged.

A constraint bounds a validation metric, either absolutely or relative to a baseline loss::

    search:
      constraints:
        - {metric: val/error, max: 0.02}                    # val/error <= 0.02
        - {metric: val/error, max_over_baseline: 0.005, baseline: cross_entropy}
        - {metric: val/auroc…, min: 0.9}                    # lower bounds: min, min_under_baseline

Each constraint gives one value ``c`` in Optuna's convention (set with
`optuna.trial.Trial.set_constraint`, read by TPE, NSGA-II and GP; feasible iff every ``c <= 0``)::

    upper bound (max, max_over_baseline):   c = m - bound
    lower bound (min, min_under_baseline):  c = bound - m
    relative bound = b + max_over_baseline  (or b - min_under_baseline)

where ``m`` is the trial's value of the metric (its last report) and ``b`` the baseline's value:
the best value of the metric (by its direction, `calibtune.metrics.keys.direction`) over the
baseline loss's finished trials. While the baseline has no finished trial, ``b`` is unknown
(`baseline_best` returns None): the sampler then gets ``c = 0`` (counted as met), and every
judgment is made again later against the baselines known then (`mark_feasibility`, `compare`,
`export`), where a relative constraint without any finished baseline trial is not met.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from calibtune._validate import check_float, check_mapping, fail
from calibtune.metrics import keys as K

__all__ = [
    "KINDS",
    "TAG_FEASIBLE",
    "Constraint",
    "baseline_values",
    "feasible",
    "judge",
    "parse_constraints",
    "violations",
]

#: key of the bound -> (upper "max" or lower "min", relative to a baseline)
KINDS: Mapping[str, tuple[str, bool]] = {
    "max": ("max", False),
    "min": ("min", False),
    "max_over_baseline": ("max", True),
    "min_under_baseline": ("min", True),
}
#: MLflow tag of a finished trial of a constrained study: "yes" or "no"
TAG_FEASIBLE = "calibtune.feasible"


@dataclass(frozen=True)
class Constraint:
    """``metric <= bound`` (``bound == "max"``) or ``>=`` (``"min"``); ``value`` is the bound
    itself, or with ``baseline`` (a loss label of the study) the offset from its best value."""

    metric: str
    bound: str
    value: float
    baseline: str | None = None

    def __str__(self) -> str:
        op = "<=" if self.bound == "max" else ">="
        if self.baseline is None:
            return f"{self.metric} {op} {self.value:g}"
        sign = "+" if self.bound == "max" else "-"
        return f"{self.metric} {op} {self.baseline}'s best {sign} {self.value:g}"


def parse_constraints(raw: Any, labels: Sequence[str], error: type[ValueError]) -> tuple:
    """``search.constraints`` (a list of mappings) as `Constraint` s; ``labels``: the study's
    loss labels (a baseline must be one). Metrics are checked here for form and split only
    (validation or training keys: constraints never look at test or OOD data); whether the
    trials report them is the study config's check."""
    path = "search.constraints"
    if raw is None:
        return ()
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise fail(path, "a list of {metric, max|min|max_over_baseline|...}", raw, error)
    out = tuple(_one(item, f"{path}[{i}]", labels, error) for i, item in enumerate(raw))
    if len(set(out)) != len(out):  # each is an Optuna constraint named by its rule
        raise fail(path, "distinct constraints", [str(c) for c in out], error)
    return out


def _one(item: Any, where: str, labels: Sequence[str], error: type[ValueError]) -> Constraint:
    try:
        d = check_mapping(item, where)
    except ValueError as exc:
        raise error(str(exc)) from None
    unknown = sorted(set(d) - {"metric", "baseline", *KINDS}, key=str)
    if unknown:
        raise fail(f"{where}.{unknown[0]}", f"one of metric, baseline, {', '.join(KINDS)}",
                   unknown[0], error)  # fmt: skip
    metric = d.get("metric")
    if not isinstance(metric, str) or not K.is_selectable(metric):
        raise fail(
            f"{where}.metric",
            "a validation metric such as val/error (constraints never look at test or OOD data)",
            metric,
            error,
        )
    kinds = [k for k in KINDS if k in d]
    if len(kinds) != 1:
        raise fail(where, f"exactly one bound of {', '.join(KINDS)}", sorted(d), error)
    bound, relative = KINDS[kinds[0]]
    try:
        value = check_float(d[kinds[0]], f"{where}.{kinds[0]}", 0.0 if relative else None)
    except ValueError as exc:
        raise error(str(exc)) from None
    baseline = d.get("baseline")
    if relative and baseline not in labels:
        raise fail(f"{where}.baseline", f"a loss of the study ({', '.join(labels)})", baseline,
                   error)  # fmt: skip
    if not relative and baseline is not None:
        raise fail(f"{where}.baseline", f"nothing with {kinds[0]} (a baseline goes with "
                   "max_over_baseline or min_under_baseline)", baseline, error)  # fmt: skip
    if relative:
        try:
            K.direction(metric)
        except ValueError:
            raise fail(f"{where}.metric", "a metric with a direction (its baseline's best)",
                       metric, error) from None  # fmt: skip
    return Constraint(metric, bound, value, baseline)


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def baseline_values(
    constraints: Iterable[Constraint], trials: Iterable[tuple[str, Mapping[str, Any]]]
) -> dict[Constraint, float | None]:
    """Each relative constraint's baseline value ``b``: the best finite value of its metric (by
    the metric's direction) over ``trials`` — ``(loss label, metrics)`` of finished trials —
    of its baseline loss; None while there is none."""
    trials = list(trials)
    out: dict[Constraint, float | None] = {}
    for c in constraints:
        if c.baseline is None:
            continue
        vals = [_number(m.get(c.metric)) for label, m in trials if label == c.baseline]
        vals = [v for v in vals if v is not None]
        pick = min if K.direction(c.metric) == "min" else max
        out[c] = pick(vals) if vals else None
    return out


def violations(
    constraints: Iterable[Constraint],
    metrics: Mapping[str, Any],
    baselines: Mapping[Constraint, float | None],
    unknown: float = 0.0,
) -> list[float]:
    """One value per constraint, feasible iff ``<= 0`` (see the module docstring). A missing or
    non-finite metric gives ``inf``; a relative constraint whose baseline is still unknown gives
    ``unknown`` (0: counted as met, for the sampler; ``inf``: not met, for a final judgment)."""
    out = []
    for c in constraints:
        bound = c.value
        if c.baseline is not None:
            b = baselines.get(c)
            if b is None:
                out.append(unknown)
                continue
            bound = b + c.value if c.bound == "max" else b - c.value
        m = _number(metrics.get(c.metric))
        if m is None:
            out.append(math.inf)
        else:
            out.append(m - bound if c.bound == "max" else bound - m)
    return out


def feasible(values: Iterable[float]) -> bool:
    """Optuna's rule: every constraint value ``<= 0``."""
    return all(v <= 0 for v in values)


def judge(
    constraints: Sequence[Constraint], trials: Sequence[tuple[str, Mapping[str, Any]]]
) -> list[bool]:
    """Whether each of ``trials`` (``(loss label, metrics)`` of finished trials) meets every
    constraint, relative bounds from the baselines among them; a relative constraint whose
    baseline has no finished trial is not met."""
    base = baseline_values(constraints, trials)
    return [feasible(violations(constraints, m, base, unknown=math.inf)) for _, m in trials]
