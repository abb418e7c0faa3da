"""Metric keys: the one owner of the names calibtune reports (build, parse, MLflow, direction).

Grammar (every part matches ``[A-Za-z0-9][A-Za-z0-9_-]*``: no ``.``, ``@`` or ``/`` inside)::

    <name>                                   run-level: epoch, lr, train_time, epoch_time
    <split>/<name>[@<method>]                split: train, val, test, adaptive
    adaptive/<name>/bin_<NN>                 one element of a list value (``adaptive/gammas``)
    ood/<set>[/s<severity>]/<name>[@<method>]
    posthoc/<method>/<param>                 a fitted post-hoc parameter (posthoc/ts/T)
    study/<name>                             a study's counters on its parent run
    … any of the above + "_std"              seed standard deviation of a multi-seed study

``<method>`` is a post-hoc method fitted on validation (``test/ece@ts``: ECE on test after
temperature scaling); OOD names are ``<measure>[_<score>]`` (``auroc_msp``; no suffix: the
entropy score). MLflow does not accept ``@`` in metric names, so `to_mlflow` writes it as ``.``
(``test/ece.ts``); since no part may contain ``.``, `from_mlflow` is its exact inverse.

Only ``val/`` and ``train/`` keys may select hyperparameters (`is_selectable`): selection never
looks at test or OOD data. Whether higher is better comes from `HIGHER_IS_BETTER` (as
torchmetrics' ``Metric.higher_is_better``), never from substrings of a name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

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

__all__ = [
    "ADAPTIVE_LISTS",
    "ADAPTIVE_SUMMARY",
    "HIGHER_IS_BETTER",
    "OOD_MEASURES",
    "OOD_SCORES",
    "REPORT_KEYS",
    "RUN_KEYS",
    "SELECTABLE_PREFIXES",
    "SELECTABLE_SPLITS",
    "SPLITS",
    "MetricKey",
    "adaptive_summary",
    "direction",
    "element_key",
    "epoch_keys",
    "expected_keys",
    "final_keys",
    "from_mlflow",
    "higher_is_better",
    "is_adaptive_list",
    "is_selectable",
    "key",
    "ood_key",
    "ood_source",
    "parse",
    "parse_ood_source",
    "posthoc_key",
    "std_key",
    "to_mlflow",
]

SPLITS = ("train", "val", "test", "ood", "posthoc", "adaptive", "study")  # study: parent run
# Selection must never look at test data: objectives are validation (or training) metrics.
SELECTABLE_SPLITS = ("val", "train")
SELECTABLE_PREFIXES = tuple(f"{s}/" for s in SELECTABLE_SPLITS)
RUN_KEYS = ("epoch", "lr", "train_time", "epoch_time")
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
STATS = ("std",)

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

    def __post_init__(self) -> None:
        if self.split and self.split not in SPLITS:
            raise ValueError(
                f"metric key: expected a split in {', '.join(SPLITS)}, got {self.split!r}"
            )
        parts = [self.name, self.method, self.ood]
        if any(p and (_PART.fullmatch(p) is None or p.endswith("_std")) for p in parts):
            raise ValueError(
                f"metric key: expected parts of letters, digits, _- (no ., @, / or _std), "
                f"got {parts}"
            )
        ok = (
            bool(self.name)
            and (self.split == "ood") == bool(self.ood)
            and (self.split == "posthoc") <= bool(self.method)
            and (self.severity is None or (self.split == "ood" and self.severity >= 0))
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
        if self.split == "ood":
            sev = "" if self.severity is None else f"/s{self.severity}"
            return f"ood/{self.ood}{sev}/{self.name}{at}{tail}"
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
        if split == "ood" and len(parts) in (3, 4):
            sev = None
            if len(parts) == 4:
                m = _SEVERITY.fullmatch(parts[2])
                if m is None:
                    raise ValueError(f"severity {parts[2]!r}")
                sev = int(m.group(1))
            return MetricKey("ood", parts[-1], method, ood=parts[1], severity=sev, stat=stat)
        if split == "adaptive" and len(parts) == 3 and (m := _BIN.fullmatch(parts[2])):
            return MetricKey(split, parts[1], method, stat=stat, bin=int(m.group(1)))
        if len(parts) == 2 and split not in ("ood", "posthoc"):
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


def element_key(metric: str, index: int) -> str:
    """The key of element ``index`` of a list value (``adaptive/gammas`` -> ``…/bin_03``): how
    list values are logged to MLflow, which takes scalars only."""
    k = parse(metric)
    return str(MetricKey(k.split, k.name, k.method, stat=k.stat, bin=index))


def std_key(metric: str) -> str:
    """The key of ``metric``'s seed standard deviation (``val/ece@ts`` -> ``val/ece@ts_std``)."""
    k = parse(metric)
    if k.stat:
        raise ValueError(f"std_key: expected a metric, got the statistic {metric!r}")
    return str(MetricKey(k.split, k.name, k.method, k.ood, k.severity, "std", k.bin))


# ----------------------------------------------------------------------------- MLflow


def to_mlflow(metric: str) -> str:
    """MLflow-safe name of a calibtune key (``test/ece@ts`` -> ``test/ece.ts``).

    >>> to_mlflow("ood/svhn/auroc_msp@ts")
    'ood/svhn/auroc_msp.ts'
    """
    return str(parse(metric)).replace("@", ".")


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
    """True for keys a study may select on: ``val/`` and ``train/`` (never test or OOD data)."""
    try:
        return parse(metric).split in SELECTABLE_SPLITS
    except ValueError:
        return False


def higher_is_better(metric: str) -> bool:
    """Whether larger values of ``metric`` are better; ``ValueError`` for keys with no
    direction (run-level values, fitted parameters, adaptive state, standard deviations)."""
    k = parse(metric)
    value = None
    if k.split in ("train", "val", "test", "ood") and not k.stat:
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
    the number of bins on inverse focal (γ < 0, AdaFocal's switch), max |C_val − A_val| and the
    number of updates; keys ``adaptive/<name>``."""
    g = [float(x) for x in gammas]
    out: dict[str, float] = {key("adaptive", "updates"): float(updates)}
    if g:
        out[key("adaptive", "gamma_min")] = min(g)
        out[key("adaptive", "gamma_mean")] = sum(g) / len(g)
        out[key("adaptive", "gamma_max")] = max(g)
        out[key("adaptive", "inverse_bins")] = float(sum(x < 0 for x in g))
    if gap:
        out[key("adaptive", "gap_absmax")] = max(abs(float(x)) for x in gap)
    return out


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
    report: Sequence[str] = REPORT_KEYS,
) -> frozenset[str]:
    """Keys of the per-epoch reports (``calibtune.training.train_epochs``): run-level values,
    ``train/{loss,error}``, ``val/<m>``, ``val/<m>@<method>`` for ``epoch_posthoc``, ``test/<m>``
    (at least in the last epoch) and, for an adaptive loss, ``adaptive/*`` (epochs in which it
    updated)."""
    out = set(RUN_KEYS)
    out |= {key("train", n) for n in TRAIN_KEYS}
    out |= {key(s, m) for s in ("val", "test") for m in report}
    out |= {key("val", m, p) for m in report for p in epoch_posthoc}
    if adaptive:
        out |= {key("adaptive", n) for n in ADAPTIVE_KEYS}
    return frozenset(out)


def final_keys(
    *,
    posthoc: Iterable[str] = (),
    posthoc_params: Mapping[str, Iterable[str]] | None = None,
    ood: Iterable[str] = (),
    report: Sequence[str] = REPORT_KEYS,
) -> frozenset[str]:
    """Keys of the end-of-trial evaluation (``calibtune.training.evaluate_final``).

    ``posthoc``: method names; ``posthoc_params``: method -> fitted parameter names (omitted:
    no ``posthoc/`` keys); ``ood``: OOD sources (`ood_source`: ``svhn``, ``digits_noise/s3``).
    """
    posthoc = list(posthoc)
    out = {key("test", m) for m in report}
    out |= {key(s, m, p) for s in ("val", "test") for m in report for p in posthoc}
    for method, names in (posthoc_params or {}).items():
        out |= {posthoc_key(method, n) for n in names}
    for source in ood:
        out |= {
            ood_key(source, measure, score, method)
            for measure in OOD_MEASURES
            for score in OOD_SCORES
            for method in OOD_METHODS
        }
    return frozenset(out)


def expected_keys(
    *,
    posthoc: Iterable[str] = (),
    posthoc_params: Mapping[str, Iterable[str]] | None = None,
    epoch_posthoc: Iterable[str] = (),
    ood: Iterable[str] = (),
    adaptive: bool = False,
    report: Sequence[str] = REPORT_KEYS,
) -> frozenset[str]:
    """Every key a trial with these settings reports: `epoch_keys` ∪ `final_keys`."""
    return epoch_keys(epoch_posthoc=epoch_posthoc, adaptive=adaptive, report=report) | final_keys(
        posthoc=posthoc, posthoc_params=posthoc_params, ood=ood, report=report
    )
