"""Metric keys: the one owner of the names calibtune reports (build, parse, MLflow, direction).

Grammar (every part matches ``[A-Za-z0-9][A-Za-z0-9_-]*``: no ``.``, ``@`` or ``/`` inside)::

    <name>                                   run-level: epoch, lr, train_time, epoch_time
    <split>/<name>[@<method>]                split: train, val, test, adaptive
    adaptive/<name>/bin_<NN>                 one element of a list value (``adaptive/gammas``)
    ood/<set>[/s<severity>]/<name>[@<method>]
    shift/<set>[/s<severity>]/<name>[@<method>]       calibration on a corrupted test set
    val_shift/<set>[/s<severity>]/<name>[@<method>]   … on the validation split corrupted alike
    posthoc/<method>/<param>                 a fitted post-hoc parameter (posthoc/ts/T)
    posthoc/<method>/T_at_edge               1 when that T lies at an end of its search range
    study/<name>                             a study's counters on its parent run
    … any of the above + "_std"              seed standard deviation of a multi-seed study
    … any of the above + "_ci_low"/"_ci_high" bootstrap confidence interval (test samples)

``<method>`` is a post-hoc method fitted on validation (``test/ece@ts``: ECE on test after
temperature scaling); OOD names are ``<measure>[_<score>]`` (``auroc_msp``; no suffix: the
entropy score). MLflow does not accept ``@`` in metric names, so `to_mlflow` writes it as ``.``
(``test/ece.ts``); since no part may contain ``.``, `from_mlflow` is its exact inverse.

Shift keys without ``/s<severity>`` are the mean over severities (`shift_key`).
Only ``val/``, ``val_shift/`` and ``train/`` keys may select hyperparameters (`is_selectable`;
`selection_refusal` says why not): selection never looks at test or OOD data, nor at a
confidence-interval bound. Whether higher is better comes from `HIGHER_IS_BETTER` (as
torchmetrics' ``Metric.higher_is_better``), never from substrings of a name; a CI bound has its
metric's direction.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: the keys of `calibration_report` (a trial reports each per split and post-hoc method); defined
#: here, not beside the metrics, so that reading metric names back does not import torch
REPORT_KEYS = (
    "ece",
    "adaece",
    "classwise_ece",
    "mce",
    "nll",
    "brier",
    "error",
    "smece",
    "ece_debiased",
    "ece_sweep",
)
#: selective-classification metrics (`calibtune.metrics.selective_report`)
SELECTIVE_KEYS = ("aurc", "augrc")

__all__ = [
    "ADAPTIVE_LISTS",
    "ADAPTIVE_SUMMARY",
    "BOOTSTRAP_KEYS",
    "CI_STATS",
    "FINAL_ONLY_KEYS",
    "GPU_KEYS",
    "HIGHER_IS_BETTER",
    "OOD_MEASURES",
    "OOD_SCORES",
    "REPORT_KEYS",
    "RUN_KEYS",
    "SELECTABLE_PREFIXES",
    "SELECTABLE_SPLITS",
    "SHIFT_METRICS",
    "SHIFT_SPLITS",
    "SPLITS",
    "T_AT_EDGE",
    "MetricKey",
    "adaptive_summary",
    "best_key",
    "ci_keys",
    "direction",
    "element_key",
    "epoch_keys",
    "expected_keys",
    "final_keys",
    "from_mlflow",
    "higher_is_better",
    "is_adaptive_list",
    "is_final_only",
    "is_selectable",
    "is_statistic",
    "key",
    "ood_key",
    "ood_source",
    "parse",
    "parse_ood_source",
    "posthoc_key",
    "selection_refusal",
    "shift_key",
    "shift_keys",
    "std_key",
    "to_mlflow",
]

#: calibration under dataset shift: ``shift`` corrupts the test split (reporting only),
#: ``val_shift`` the validation split the same way (what a study may select on)
SHIFT_SPLITS = ("shift", "val_shift")
SPLITS = ("train", "val", "test", "ood", "posthoc", "adaptive", "study", *SHIFT_SPLITS)
# Selection must never look at test data: objectives are validation (or training) metrics.
SELECTABLE_SPLITS = ("val", "train", "val_shift")
SELECTABLE_PREFIXES = tuple(f"{s}/" for s in SELECTABLE_SPLITS)
#: ``train_time``/``samples_per_s``: the training pass; ``epoch_time``/``epoch_samples_per_s``:
#: the whole epoch (training, evaluation, epoch metrics and the checkpoint, ``checkpoint_time``)
RUN_KEYS = (
    "epoch",
    "lr",
    "train_time",
    "epoch_time",
    "samples_per_s",
    "checkpoint_time",
    "epoch_samples_per_s",
)
#: a GPU trial's training pass per epoch (`calibtune.training.DeviceMonitor`): ``gpu_util`` is
#: device-wide (NVML: % of time any kernel ran, packed trials share it), ``gpu_mem_gib`` this
#: trial process's own peak allocated memory (what its packed-trial cap limits)
GPU_KEYS = ("gpu_util", "gpu_mem_gib")
#: the epoch whose model the final evaluation used (``eval.select_epoch: best``)
SELECTED_EPOCH = "selected_epoch"
#: ``posthoc/<method>/T_at_edge``: 1.0 when the fitted T lies at an end of the range its fit
#: searched (`calibtune.posthoc.t_at_edge`), 0.0 inside it; a multi-seed trial logs the share
T_AT_EDGE = "T_at_edge"
TRAIN_KEYS = ("loss", "error")  # running averages over the epoch's training batches
ADAPTIVE_LISTS = ("gammas", "edges", "gap")  # one element per validation bin
#: per-epoch summaries of the adaptive state (`adaptive_summary`): what MLflow gets by default
ADAPTIVE_SUMMARY = (
    "gamma_min",
    "gamma_mean",
    "gamma_max",
    "inverse_bins",  # bins with γ < 0 (inverse focal)
    "gap_absmax",  # max over bins of |C_val - A_val|
    "updates",  # number of updates in the epoch
)
ADAPTIVE_KEYS = ADAPTIVE_LISTS + ADAPTIVE_SUMMARY
#: OOD detection scores; the first is the default and carries no suffix in the key
OOD_SCORES = ("entropy", "msp")
OOD_MEASURES = ("auroc", "aupr", "fpr95")
#: the post-hoc variant of every OOD metric besides the uncalibrated one
OOD_METHODS = ("", "ts")
#: what a shift set reports per severity, before and after each post-hoc method
SHIFT_METRICS = ("error", "ece", "adaece", "nll")
#: bounds of a bootstrap confidence interval (`calibtune.metrics.bootstrap_report`)
CI_STATS = ("ci_low", "ci_high")
STATS = ("std", *CI_STATS)
#: what the end-of-trial evaluation reports besides `REPORT_KEYS`, for val and test, before and
#: after every post-hoc method: AURC/AUGRC and the NLL after NLL-optimal TS (refinement). Per
#: epoch only when a study selects on one of them (`is_final_only`, ``eval.epoch_selective``):
#: the refinement fit costs ~10× the rest of an epoch's validation metrics
FINAL_ONLY_KEYS = (*SELECTIVE_KEYS, "refinement_nll")
#: metrics a trial bootstraps (``eval.bootstrap``): every report metric but smECE, whose kernel
#: fixed point costs one `relplot` call per resample (`calibtune.metrics.bootstrap_values`)
BOOTSTRAP_KEYS = tuple(m for m in REPORT_KEYS if m != "smece")

#: direction of every metric calibtune reports (by name; OOD names by measure)
HIGHER_IS_BETTER: Mapping[str, bool] = {
    "ece": False,
    "adaece": False,
    "classwise_ece": False,
    "mce": False,
    "nll": False,
    "brier": False,
    "error": False,
    "smece": False,
    "ece_debiased": False,
    "ece_sweep": False,
    "loss": False,
    "aurc": False,
    "augrc": False,
    "refinement_nll": False,
    "fpr95": False,
    "auroc": True,
    "aupr": True,
    "accuracy": True,
}

_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_SEVERITY = re.compile(r"s([0-9]+)")
_BIN = re.compile(r"bin_([0-9]+)")


@dataclass(frozen=True)
class MetricKey:
    """A parsed metric key; ``str(k)`` builds it back (``parse(str(k)) == k``).

    >>> k = parse("ood/digits_noise/s3/auroc_msp@ts")
    >>> (k.split, k.ood, k.severity, k.name, k.method, k.measure, k.score)
    ('ood', 'digits_noise', 3, 'auroc_msp', 'ts', 'auroc', 'msp')
    """

    split: str  # "" for run-level keys (lr, epoch, …)
    name: str
    method: str = ""  # post-hoc method (test/ece@ts; posthoc/ts/T)
    ood: str = ""  # OOD set (ood/ keys only)
    severity: int | None = None
    stat: str = ""  # "std": the seed standard deviation
    bin: int | None = None  # element of a list value (adaptive/gammas/bin_03)
    shift: str = ""  # shift set (shift/ and val_shift/ keys only)

    def __post_init__(self) -> None:
        if self.split and self.split not in SPLITS:
            raise ValueError(
                f"metric key: expected a split in {', '.join(SPLITS)}, got {self.split!r}"
            )
        parts = [self.name, self.method, self.ood, self.shift]
        tails = tuple(f"_{s}" for s in STATS)
        if any(p and (_PART.fullmatch(p) is None or p.endswith(tails)) for p in parts):
            raise ValueError(
                "metric key: expected parts of letters, digits, _- (no ., @, / or _std, "
                f"_ci_low or _ci_high ending), got {parts}"
            )
        ok = (
            bool(self.name)
            and (self.split == "ood") == bool(self.ood)
            and (self.split == "posthoc") <= bool(self.method)
            and (self.split in SHIFT_SPLITS) == bool(self.shift)
            and (self.severity is None or (bool(self.ood or self.shift) and self.severity >= 0))
            and not (self.split in ("", "adaptive") and self.method)
            and self.stat in ("", *STATS)
            and (self.bin is None or (self.split == "adaptive" and self.bin >= 0))
        )
        if not ok:
            raise ValueError(f"metric key: inconsistent parts {self!r}")

    def __str__(self) -> str:
        tail = f"_{self.stat}" if self.stat else ""
        at = f"@{self.method}" if self.method else ""
        if not self.split:
            return self.name + tail
        if self.split == "posthoc":
            return f"posthoc/{self.method}/{self.name}{tail}"
        if self.ood or self.shift:
            sev = "" if self.severity is None else f"/s{self.severity}"
            return f"{self.split}/{self.ood or self.shift}{sev}/{self.name}{at}{tail}"
        element = "" if self.bin is None else f"/bin_{self.bin:02d}"
        return f"{self.split}/{self.name}{element}{at}{tail}"

    @property
    def measure(self) -> str:
        """The metric without its OOD score suffix (``auroc_msp`` -> ``auroc``)."""
        return _measure_score(self.name)[0]

    @property
    def score(self) -> str:
        """The OOD score of an ``ood/`` key (``entropy`` unless suffixed), else ``""``."""
        return _measure_score(self.name)[1] if self.split == "ood" else ""


def _measure_score(name: str) -> tuple[str, str]:
    for score in OOD_SCORES[1:]:
        if name.endswith(f"_{score}"):
            return name[: -len(score) - 1], score
    return name, OOD_SCORES[0]


@functools.cache  # pure, and tables parse the same few hundred names for every trial
def parse(text: str) -> MetricKey:
    """Parse a metric key; raises ``ValueError`` naming the key for anything not in the grammar
    or not in its canonical form (so that ``str(parse(k)) == k`` always)."""
    if not isinstance(text, str) or not text:
        raise ValueError(f"metric key: expected a non-empty string, got {text!r}")
    k = _parse(text)
    if k is None or str(k) != text:
        raise ValueError(
            f"metric key: expected e.g. val/ece, test/ece@ts or ood/svhn/auroc, got {text!r}"
        )
    return k


def _parse(text: str) -> MetricKey | None:
    body, stat = text, ""
    for s in STATS:
        if body.endswith(f"_{s}"):
            body, stat = body[: -len(s) - 1], s
            break
    head, at, method = body.partition("@")
    parts = head.split("/")
    try:
        if at and not method:
            raise ValueError("empty method")
        if len(parts) == 1:
            return MetricKey("", parts[0], method, stat=stat)
        split = parts[0]
        if split == "posthoc" and len(parts) == 3 and not method:
            return MetricKey("posthoc", parts[2], parts[1], stat=stat)
        if split in ("ood", *SHIFT_SPLITS) and len(parts) in (3, 4):
            sev = None
            if len(parts) == 4:
                m = _SEVERITY.fullmatch(parts[2])
                if m is None:
                    raise ValueError(f"severity {parts[2]!r}")
                sev = int(m.group(1))
            where = {"ood": parts[1]} if split == "ood" else {"shift": parts[1]}
            return MetricKey(split, parts[-1], method, severity=sev, stat=stat, **where)
        if split == "adaptive" and len(parts) == 3 and (m := _BIN.fullmatch(parts[2])):
            return MetricKey(split, parts[1], method, stat=stat, bin=int(m.group(1)))
        if len(parts) == 2 and split not in ("ood", "posthoc", *SHIFT_SPLITS):
            return MetricKey(split, parts[1], method, stat=stat)
    except ValueError:
        pass
    return None


# ----------------------------------------------------------------------------- builders


def key(split: str, name: str, method: str = "") -> str:
    """``split/name[@method]`` (``key("test", "ece", "ts") == "test/ece@ts"``)."""
    return str(MetricKey(split, name, method))


def posthoc_key(method: str, param: str) -> str:
    """``posthoc/<method>/<param>``: a fitted post-hoc parameter (``posthoc/ts/T``)."""
    return str(MetricKey("posthoc", param, method))


def ood_source(ood: str, severity: int | None = None) -> str:
    """The OOD source part of a key: ``svhn`` or ``digits_noise/s3``."""
    return ood if severity is None else f"{ood}/s{severity}"


def parse_ood_source(source: str) -> tuple[str, int | None]:
    """Inverse of `ood_source`."""
    k = parse(f"ood/{source}/auroc")
    return k.ood, k.severity


def ood_key(source: str, measure: str, score: str = OOD_SCORES[0], method: str = "") -> str:
    """``ood/<source>/<measure>[_<score>][@<method>]`` (``source`` from `ood_source`)."""
    if score not in OOD_SCORES:
        raise ValueError(f"ood_key: expected a score in {', '.join(OOD_SCORES)}, got {score!r}")
    ood, sev = parse_ood_source(source)
    name = measure if score == OOD_SCORES[0] else f"{measure}_{score}"
    return str(MetricKey("ood", name, method, ood=ood, severity=sev))


def shift_key(
    split: str, shift: str, name: str, method: str = "", severity: int | None = None
) -> str:
    """``<split>/<set>[/s<severity>]/<name>[@<method>]`` for ``split`` in `SHIFT_SPLITS`;
    no severity: the mean over the set's severities.

    >>> shift_key("val_shift", "digits_noise", "ece", "ts", 3)
    'val_shift/digits_noise/s3/ece@ts'
    """
    if split not in SHIFT_SPLITS:
        raise ValueError(f"shift_key: expected a split in {', '.join(SHIFT_SPLITS)}, got {split!r}")
    return str(MetricKey(split, name, method, severity=severity, shift=shift))


def best_key(objective: str) -> str:
    """The study parent run's key for the best value of ``objective``: its parts joined by
    ``_`` under ``study/best_`` (``val/ece@ts`` -> ``study/best_val_ece@ts``,
    ``val_shift/digits_noise/s3/nll`` -> ``study/best_val_shift_digits_noise_s3_nll``)."""
    k = parse(objective)
    sev = "" if k.severity is None else f"s{k.severity}"
    where = "_".join(p for p in (k.split, k.ood, k.shift, sev, k.name) if p)
    return key("study", f"best_{where}", k.method)


def element_key(metric: str, index: int) -> str:
    """The key of element ``index`` of a list value (``adaptive/gammas`` -> ``…/bin_03``): how
    list values are logged to MLflow, which takes scalars only."""
    k = parse(metric)
    return str(MetricKey(k.split, k.name, k.method, stat=k.stat, bin=index))


def ci_keys(metric: str) -> tuple[str, str]:
    """Keys of ``metric``'s bootstrap CI bounds (``test/ece@ts`` -> ``test/ece@ts_ci_low``,
    ``test/ece@ts_ci_high``)."""
    k = parse(metric)
    if k.stat:
        raise ValueError(f"ci_keys: expected a metric, got the statistic {metric!r}")
    low, high = (MetricKey(k.split, k.name, k.method, k.ood, k.severity, s) for s in CI_STATS)
    return str(low), str(high)


def is_statistic(metric: str) -> bool:
    """True for a seed standard deviation or a CI bound (``…_std``, ``…_ci_low/high``)."""
    try:
        return bool(parse(metric).stat)
    except ValueError:
        return False


def std_key(metric: str) -> str:
    """The key of ``metric``'s seed standard deviation (``val/ece@ts`` -> ``val/ece@ts_std``)."""
    k = parse(metric)
    if k.stat:
        raise ValueError(f"std_key: expected a metric, got the statistic {metric!r}")
    return str(dataclasses.replace(k, stat="std"))


# ----------------------------------------------------------------------------- MLflow


def to_mlflow(metric: str) -> str:
    """MLflow-safe name of a calibtune key (``test/ece@ts`` -> ``test/ece.ts``).

    >>> to_mlflow("ood/svhn/auroc_msp@ts")
    'ood/svhn/auroc_msp.ts'
    """
    return str(parse(metric)).replace("@", ".")


@functools.cache  # pure, and every trial logs the same few hundred names
def from_mlflow(name: str) -> str:
    """Inverse of `to_mlflow` (names MLflow holds that calibtune did not write pass unchanged).

    >>> from_mlflow("test/ece.ts")
    'test/ece@ts'
    """
    if name.count(".") != 1:
        return name
    candidate = name.replace(".", "@")
    try:
        parse(candidate)
    except ValueError:
        return name
    return candidate


# ----------------------------------------------------------------------------- meaning


def is_selectable(metric: str) -> bool:
    """True for keys a study may select on: ``val/``, ``val_shift/`` and ``train/`` (never test,
    test-side shift or OOD data), and never a bootstrap CI bound (a statement about sampling
    noise, not a model's quality)."""
    return selection_refusal(metric) is None


def selection_refusal(metric: str) -> str | None:
    """Why a study may not select on ``metric`` (one line), or None if it may.

    >>> selection_refusal("shift/digits_noise/ece@ts")  # doctest: +ELLIPSIS
    'expected a validation metric (shift/ is the corrupted test split: use val_shift/...)'
    """
    try:
        k = parse(metric)
    except ValueError:
        return "expected a metric key such as val/ece@ts"
    if k.stat in CI_STATS:
        return "expected a metric, not a bootstrap CI bound (_ci_low/_ci_high)"
    if k.split in SELECTABLE_SPLITS:
        return None
    if k.split == "shift":
        alike = dataclasses.replace(k, split="val_shift")
        return f"expected a validation metric (shift/ is the corrupted test split: use {alike})"
    return "expected a validation metric (val/..., val_shift/...; never test or OOD data)"


def higher_is_better(metric: str) -> bool:
    """Whether larger values of ``metric`` are better; ``ValueError`` for keys with no
    direction (run-level values, fitted parameters, adaptive state, standard deviations). A CI
    bound has its metric's direction."""
    k = parse(metric)
    value = None
    if k.split in ("train", "val", "test", "ood", *SHIFT_SPLITS) and k.stat in ("", *CI_STATS):
        value = HIGHER_IS_BETTER.get(k.measure if k.split == "ood" else k.name)
    if value is None:
        raise ValueError(
            f"metric key: expected a metric with a direction (e.g. val/ece, ood/svhn/auroc), "
            f"got {metric!r}"
        )
    return value


def direction(metric: str) -> str:
    """``"max"`` if higher is better, else ``"min"`` (Optuna/Tune's ``mode``)."""
    return "max" if higher_is_better(metric) else "min"


def adaptive_summary(
    gammas: Sequence[float], gap: Sequence[float], updates: int
) -> dict[str, float]:
    """`ADAPTIVE_SUMMARY` of one epoch's adaptive state: γ min/mean/max over the ``B`` bins,
    the number of bins on inverse focal (γ < 0, AdaFocal's switch), max |C_val − A_val| over
    the non-empty bins (an equal-mass bin emptied by tied confidences has a NaN gap) and the
    number of updates; keys ``adaptive/<name>``.

    >>> adaptive_summary([1.0, 2.0], [float("nan"), -0.25], 3)["adaptive/gap_absmax"]
    0.25
    """
    g = [float(x) for x in gammas]
    out: dict[str, float] = {key("adaptive", "updates"): float(updates)}
    if g:
        out[key("adaptive", "gamma_min")] = min(g)
        out[key("adaptive", "gamma_mean")] = sum(g) / len(g)
        out[key("adaptive", "gamma_max")] = max(g)
        out[key("adaptive", "inverse_bins")] = float(sum(x < 0 for x in g))
    seen = [abs(float(x)) for x in gap if not math.isnan(float(x))]
    if seen:
        out[key("adaptive", "gap_absmax")] = max(seen)
    return out


def is_final_only(metric: str) -> bool:
    """True for a validation `FINAL_ONLY_KEYS` metric (``val/aurc``, ``val/refinement_nll@ts``):
    a study that selects on one needs it in every epoch's report (``eval.epoch_selective``).

    >>> is_final_only("val/augrc@ts"), is_final_only("val/ece@ts")
    (True, False)
    """
    try:
        k = parse(metric)
    except ValueError:
        return False
    return k.split == "val" and k.name in FINAL_ONLY_KEYS


def is_adaptive_list(metric: str) -> bool:
    """True for ``adaptive/{gammas,edges,gap}``: per-bin lists (MLflow gets their elements only
    with ``eval.log_adaptive_bins``)."""
    try:
        k = parse(metric)
    except ValueError:
        return False
    return k.split == "adaptive" and k.name in ADAPTIVE_LISTS and k.bin is None


# ----------------------------------------------------------------------------- what a trial reports


def epoch_keys(
    *,
    epoch_posthoc: Iterable[str] = (),
    adaptive: bool = False,
    epoch_shift: Iterable[tuple[str, Sequence[int]]] = (),
    report: Sequence[str] = REPORT_KEYS,
    selective: bool = False,
    gpu: bool = False,
) -> frozenset[str]:
    """Keys of the per-epoch reports (``calibtune.training.train_epochs``): run-level values,
    ``train/{loss,error}``, ``val/<m>``, ``val/<m>@<method>`` for ``epoch_posthoc``, ``test/<m>``
    (at least in the last epoch), with ``selective`` (``eval.epoch_selective``: a study selects
    on one, `is_final_only`) ``val/{aurc,augrc,refinement_nll}[@<method>]``, for an adaptive
    loss ``adaptive/*`` (epochs in which it updated) and, for ``epoch_shift``
    ``(set, severities)``, its `shift_keys` on ``val_shift`` uncalibrated and after
    ``epoch_posthoc``; with ``gpu`` (``scaling.use_gpu``) the `GPU_KEYS`."""
    out = set(RUN_KEYS) | (set(GPU_KEYS) if gpu else set())
    out |= {key("train", n) for n in TRAIN_KEYS}
    out |= {key(s, m) for s in ("val", "test") for m in report}
    out |= {key("val", m, p) for m in report for p in epoch_posthoc}
    if selective:  # Optuna and ASHA read every report
        out |= {key("val", m, p) for m in FINAL_ONLY_KEYS for p in ("", *epoch_posthoc)}
    if adaptive:
        out |= {key("adaptive", n) for n in ADAPTIVE_KEYS}
    for name, severities in epoch_shift:
        out |= shift_keys("val_shift", name, severities, epoch_posthoc)
    return frozenset(out)


def shift_keys(
    split: str, shift: str, severities: Iterable[int], posthoc: Iterable[str] = ()
) -> frozenset[str]:
    """Every key of one shift set on one side: `SHIFT_METRICS` per severity and their mean over
    severities, uncalibrated and after each ``posthoc`` method."""
    methods = ("", *posthoc)
    return frozenset(
        shift_key(split, shift, m, p, sev)
        for sev in (None, *severities)
        for m in SHIFT_METRICS
        for p in methods
    )


def final_keys(
    *,
    posthoc: Iterable[str] = (),
    posthoc_params: Mapping[str, Iterable[str]] | None = None,
    ood: Iterable[str] = (),
    shift: Iterable[tuple[str, str, Sequence[int]]] = (),
    report: Sequence[str] = REPORT_KEYS,
    bootstrap: bool = False,
    select_best: bool = False,
) -> frozenset[str]:
    """Keys of the end-of-trial evaluation (``calibtune.training.evaluate_final``).

    ``posthoc``: method names; ``posthoc_params``: method -> fitted parameter names (omitted:
    no ``posthoc/`` keys); ``ood``: OOD sources (`ood_source`: ``svhn``, ``digits_noise/s3``);
    ``shift``: ``(split, set, severities)`` of every shift set evaluated (`shift_keys`);
    ``bootstrap``: CI bounds of the test `BOOTSTRAP_KEYS` before and after every method;
    ``select_best``: `SELECTED_EPOCH` (``eval.select_epoch: best``).
    """
    posthoc = list(posthoc)
    out = {key("test", m) for m in report} | ({SELECTED_EPOCH} if select_best else set())
    out |= {key(s, m, p) for s in ("val", "test") for m in report for p in posthoc}
    out |= {key(s, m, p) for s in ("val", "test") for m in FINAL_ONLY_KEYS for p in ("", *posthoc)}
    if bootstrap:
        for p in ("", *posthoc):
            out |= {c for m in BOOTSTRAP_KEYS if m in report for c in ci_keys(key("test", m, p))}
    for method, names in (posthoc_params or {}).items():
        out |= {posthoc_key(method, n) for n in names}
    for source in ood:
        out |= {
            ood_key(source, measure, score, method)
            for measure in OOD_MEASURES
            for score in OOD_SCORES
            for method in OOD_METHODS
        }
    for split, name, severities in shift:
        out |= shift_keys(split, name, severities, posthoc)
    return frozenset(out)


#: the `expected_keys` settings that go to `epoch_keys` (under that function's name for them);
#: every other one goes to `final_keys`
_EPOCH_SETTINGS = {
    "epoch_posthoc": "epoch_posthoc",
    "adaptive": "adaptive",
    "epoch_shift": "epoch_shift",
    "epoch_selective": "selective",
    "gpu": "gpu",
}


def expected_keys(*, report: Sequence[str] = REPORT_KEYS, **settings: Any) -> frozenset[str]:
    """Every key a trial with these settings reports: `epoch_keys` ∪ `final_keys`, both for
    ``report``; ``epoch_posthoc``, ``adaptive``, ``epoch_shift`` and ``epoch_selective``
    (`epoch_keys`' ``selective``) are `epoch_keys`' settings, the others (``posthoc``,
    ``posthoc_params``, ``ood``, ``shift``, ``bootstrap``) `final_keys`'.

    >>> sorted(expected_keys(adaptive=True) - expected_keys())[:2]
    ['adaptive/edges', 'adaptive/gamma_max']
    """
    epoch = {_EPOCH_SETTINGS[k]: v for k, v in settings.items() if k in _EPOCH_SETTINGS}
    final = {k: v for k, v in settings.items() if k not in _EPOCH_SETTINGS}
    return epoch_keys(report=report, **epoch) | final_keys(report=report, **final)
