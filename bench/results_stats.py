"""The results page's statistics: one blocked analysis over every run, its labels and flags.

Design. A seed fixes a network's initial weights and its batch order for every loss, so the seed
is a block: each claim is read from the per-seed differences d_s = A_s − B_s (oriented, < 0 when
the claim holds). `make results` trains each study twice, on two kernel paths
(``ATEN_CPU_CAPABILITY``); the two runs of a seed are replicates within its block and are
averaged before the differences are taken (`pooled`). Over the n seeds: d̄, sd(d), se = sd/√n,
df = n − 1, the 95 % CI d̄ ± t_{0.975, df}·se (the headline) and three t tests:

- difference: H0 d = 0, two-sided (`scipy.stats.ttest_rel` on the pooled values);
- equivalence (TOST): H0 |d| ≥ margin, p = max of the two one-sided p-values (`tost_p`);
- the paper's effect: H0 d = δ_paper, two-sided (where the paper gives both numbers).

Each kind of test is one family over every claim on the page, Holm-adjusted (`holm`). Labels,
decided in this order (`label_of`): **reproduces** (difference rejected after Holm, d < 0);
**opposite** (rejected, d > 0); **equivalent** (TOST rejected after Holm); **smaller than the
paper's** (the paper's effect rejected after Holm, d on the smaller side of it); **underpowered**
otherwise, with the seeds that would resolve it (`seeds_needed`). Welch's test on the pooled
values, as if the arms were independent, is a sensitivity column only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
from results_claims import REFITS, Claim, StudyData, claims

ALPHA = 0.05  # two-sided level of every test, family-wise after Holm
POWER = 0.80  # the power `seeds_needed` plans for
# Equivalence margins (fraction units, as the CSV) fixed before the numbers were looked at:
# calibration errors ±0.25 points, OOD AUROC ±1 point (`margin`; the page says why).
MARGIN_CAL = 0.0025
MARGIN_AUROC = 0.01
LABELS = ("reproduces", "opposite", "equivalent", "smaller than the paper's", "underpowered")


def margin(metric: str) -> float:
    """The equivalence margin of ``metric`` (its unit: a fraction, as the CSV).

    >>> margin("test/ece"), margin("ood/mnist1d_far/auroc")
    (0.0025, 0.01)
    """
    return MARGIN_AUROC if metric.startswith("ood/") else MARGIN_CAL


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (NaN entries kept as NaN and not counted in m):
    sort ascending, p̃_(i) = max_{j ≤ i} min(1, (m − j + 1)·p_(j)).

    >>> holm([0.01, 0.04, 0.03, math.nan])
    [0.03, 0.06, 0.06, nan]
    """
    idx = [i for i, p in enumerate(pvalues) if not math.isnan(p)]
    order = sorted(idx, key=lambda i: pvalues[i])
    m, out, run = len(order), [math.nan] * len(pvalues), 0.0
    for j, i in enumerate(order):
        run = max(run, min(1.0, (m - j) * pvalues[i]))
        out[i] = round(run, 15)
    return out


def tost_p(d: float, se: float, df: float, delta: float) -> float:
    """Two one-sided t tests of H0 d ≤ −δ and H0 d ≥ δ; the larger p (equivalence at α when
    < α, i.e. the (1 − 2α) CI inside ±δ).

    >>> round(tost_p(0.0, 1.0, 4, 3.0), 4), round(tost_p(0.0, 1.0, 4, 1.0), 4)
    (0.02, 0.187)
    """
    from scipy.stats import t

    if not se > 0:
        return 0.0 if abs(d) < delta else 1.0
    return float(max(t.sf((d + delta) / se, df), t.cdf((d - delta) / se, df)))


def t_two_sided(d: float, se: float, df: float) -> float:
    """Two-sided p of t = d/se with ``df`` degrees of freedom (se = 0: 0 if d ≠ 0, else 1)."""
    from scipy.stats import t

    if not se > 0:
        return 0.0 if d != 0 else 1.0
    return float(2 * t.sf(abs(d / se), df))


def seeds_needed(
    sd: float, delta: float, alpha: float = ALPHA, power: float = POWER, m: int = 1
) -> int:
    """Seeds for a paired t test at two-sided level α/m (Holm's first step over a family of
    ``m``: an upper bound on what Holm asks) to detect a difference ``delta`` with ``power``,
    from the spread ``sd`` of the per-seed differences: the smallest n ≥ 2 with
    n ≥ ((t_(1−α/2m, n−1) + t_(power, n−1))·sd/δ)² — whose large-n limit is the normal
    formula ((z_(1−α/2m) + z_(power))·sd/δ)².

    >>> seeds_needed(1.0, 1.0), seeds_needed(0.5, 0.25), seeds_needed(0.1, 1.0, m=51)
    (10, 34, 4)
    """
    from scipy.stats import t

    if not sd > 0:
        return 2
    z = NormalDist().inv_cdf
    n = max(2, math.ceil(((z(1 - alpha / (2 * m)) + z(power)) * sd / delta) ** 2))
    while n < 10**6:  # the t form needs at least the normal form's n: step up from it
        q = t.ppf(1 - alpha / (2 * m), n - 1) + t.ppf(power, n - 1)
        if n >= (q * sd / delta) ** 2:
            return n
        n += 1
    return n


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the t interval of the mean of ``values`` (NaN dropped; fewer than two:
    NaN bounds).

    >>> [round(x, 3) for x in mean_ci([1.0, 2.0, 3.0])]
    [2.0, -0.484, 4.484]
    """
    from scipy.stats import t

    v = np.asarray(values, float)
    v = v[~np.isnan(v)]
    if not len(v):
        return math.nan, math.nan, math.nan
    m = float(v.mean())
    if len(v) < 2:
        return m, math.nan, math.nan
    half = float(t.ppf(0.5 + level / 2, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))
    return m, m - half, m + half


# ----------------------------------------------------------------------------- pooling


def runs_of(s: StudyData) -> list[StudyData]:
    """The runs of a study: itself and, where trained, its second kernel path."""
    return [s] + ([s.alt] if s.alt is not None else [])


def per_seed(s: StudyData, label: str, key: str) -> dict[int, float]:
    """One run's values of an arm's metric by seed (NaN dropped); seeds numbered from 1 in
    order when the run does not record them."""
    values = s.seeds.get(label, {}).get(key, [])
    ids = s.seed_ids.get(label) or list(range(1, len(values) + 1))
    return {int(i): float(v) for i, v in zip(ids, values, strict=False) if not math.isnan(v)}


def pooled(
    s: StudyData, label: str, key: str, runs: Sequence[StudyData] | None = None
) -> dict[int, float]:
    """Per seed, the mean over the runs (default: every kernel path of ``s``) that hold it: the
    replicates of a block averaged (a seed one run lacks keeps the other's value)."""
    acc: dict[int, list[float]] = {}
    for run in runs_of(s) if runs is None else runs:
        for seed, v in per_seed(run, label, key).items():
            acc.setdefault(seed, []).append(v)
    return {k: float(np.mean(v)) for k, v in sorted(acc.items())}


def differences(
    s: StudyData, c: Claim, runs: Sequence[StudyData] | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(a, b, d) over the seeds both arms hold, pooled over ``runs`` (default: every run of
    ``s``): the claimed-better and worse values and the oriented differences."""
    a, b = pooled(s, *c.better, runs), pooled(s, *c.worse, runs)
    seeds = sorted(set(a) & set(b))
    av, bv = np.array([a[k] for k in seeds]), np.array([b[k] for k in seeds])
    d = (bv - av) if c.higher_is_better else (av - bv)
    return av, bv, d


# ----------------------------------------------------------------------------- one claim


@dataclass(frozen=True)
class Effect:
    """One claim's blocked analysis (fraction units; d < 0 supports the claim)."""

    d: float  # mean of the per-seed differences
    sd: float  # their sample sd (ddof 1)
    n: int  # seeds (blocks)
    runs: int  # runs averaged per seed (kernel paths)
    lo: float  # 95 % CI
    hi: float
    p: float  # two-sided paired t test of d = 0
    p_tost: float  # TOST at the metric's margin
    p_paper: float  # two-sided test of d = the paper's effect (NaN: unknown)
    p_welch: float  # sensitivity: Welch's test on the pooled values (NaN: paired claim)
    margin: float

    @property
    def se(self) -> float:
        return self.sd / math.sqrt(self.n) if self.n > 1 else math.nan


def effect(s: StudyData, c: Claim, runs: Sequence[StudyData] | None = None) -> Effect:
    """The claim's `Effect` from the per-seed differences pooled over the runs."""
    from scipy import stats

    a, b, d = differences(s, c, runs)
    n, delta = len(d), margin(c.better[1])
    n_runs = len(runs_of(s)) if runs is None else len(runs)
    if n < 2:
        mean = float(d.mean()) if n else math.nan
        return Effect(mean, math.nan, n, n_runs, *(math.nan,) * 6, delta)
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    se, df = sd / math.sqrt(n), n - 1.0
    half = float(stats.t.ppf(1 - ALPHA / 2, df)) * se
    paper = c.paper_effect / 100 if c.paper_effect is not None else None
    p_paper = t_two_sided(mean - paper, se, df) if paper is not None else math.nan
    welch = math.nan
    if not c.paired and a.std() + b.std() > 0:
        welch = float(stats.ttest_ind(a, b, equal_var=False).pvalue)
    p = t_two_sided(mean, se, df)
    return Effect(
        mean,
        sd,
        n,
        n_runs,
        mean - half,
        mean + half,
        p,
        tost_p(mean, se, df, delta),
        p_paper,
        welch,
        delta,
    )


# ----------------------------------------------------------------------------- every claim


@dataclass(frozen=True)
class Verdict:
    """A claim's effect, its Holm-adjusted p-values and its label (`label_of`)."""

    effect: Effect
    label: str
    p_holm: float
    p_tost_holm: float
    p_paper_holm: float
    seeds_needed: int | None  # to detect the margin (`seeds_needed`)
    smaller: bool = False  # the CI excludes the paper's effect on the smaller side


def label_of(
    e: Effect, p_holm: float, p_tost_holm: float, p_paper_holm: float, paper: float | None
) -> str:
    """The label by the page's rules, in their order (module docstring)."""
    if math.isnan(e.d) or math.isnan(e.sd):
        return "no data"
    if p_holm < ALPHA:
        return "reproduces" if e.d < 0 else "opposite"
    if p_tost_holm < ALPHA:
        return "equivalent"
    if paper is not None and p_paper_holm < ALPHA and e.d > paper / 100:
        return "smaller than the paper's"
    return "underpowered"


Key = tuple[str, int]  # (dataset, claim index)


def evaluate(
    studies: Sequence[StudyData], runs: Mapping[str, Sequence[StudyData]] | None = None
) -> dict[Key, Verdict]:
    """Every claim of every study: its `Effect`, Holm over each family of tests (all claims on
    the page), its label. ``runs`` (dataset -> runs) restricts the pooling (sensitivity)."""
    items = [(s, i, c) for s in studies for i, c in enumerate(claims(s.dataset))]
    effs = [effect(s, c, None if runs is None else runs[s.dataset]) for s, _, c in items]
    ph = holm([e.p for e in effs])
    pt = holm([e.p_tost for e in effs])
    pp = holm([e.p_paper for e in effs])
    out, m = {}, sum(not math.isnan(e.p) for e in effs)
    for k, ((s, i, c), e) in enumerate(zip(items, effs, strict=True)):
        lab = label_of(e, ph[k], pt[k], pp[k], c.paper_effect)
        smaller = c.paper_effect is not None and pp[k] < ALPHA and e.d > c.paper_effect / 100
        need = seeds_needed(e.sd, e.margin, m=m) if not math.isnan(e.sd) else None
        out[(s.dataset, i)] = Verdict(e, lab, ph[k], pt[k], pp[k], need, smaller)
    return out


def welch_labels(
    studies: Sequence[StudyData], v: Mapping[Key, Verdict] | None = None
) -> dict[Key, str]:
    """Sensitivity: the label each loss-vs-loss claim would get were its arms independent
    (Welch's p in place of the paired one, Holm over the same family); ``v``: `evaluate`'s."""
    v = v if v is not None else evaluate(studies)
    keys = list(v)
    ps = [
        v[k].effect.p_welch if not math.isnan(v[k].effect.p_welch) else v[k].effect.p for k in keys
    ]
    adj = holm(ps)
    out = {}
    for k, p in zip(keys, adj, strict=True):
        e, c = v[k].effect, claims(k[0])[k[1]]
        out[k] = label_of(e, p, v[k].p_tost_holm, v[k].p_paper_holm, c.paper_effect)
    return out


def single_run_labels(studies: Sequence[StudyData], which: int) -> dict[Key, str] | None:
    """Sensitivity: the labels from one kernel path alone (0: the first run, 1: the second);
    None when no study has a second run."""
    if all(s.alt is None for s in studies):
        return None
    runs = {s.dataset: [runs_of(s)[min(which, len(runs_of(s)) - 1)]] for s in studies}
    return {k: v.label for k, v in evaluate(studies, runs).items()}


# ----------------------------------------------------------------------------- temperatures


def t_grids(config: Any = None) -> dict[str, tuple[float, float]]:
    """(first, last) value of each grid whose fitted value the page shows, by key: each TS
    method's T (``posthoc/<name>/T``; the trial's post-hoc methods and the re-fits) and focal
    TS's γ_ev (``posthoc/focal_ts/gamma_ev``).

    >>> g = t_grids()
    >>> g["posthoc/ts/T"], g["posthoc/ts_fgrid/T"], g["posthoc/focal_ts/gamma_ev"]
    ((0.1, 10.0), (0.01, 5.0), (-0.5, 5.0))
    """
    from calibtune.posthoc import build_posthoc, t_range

    if config is None:
        trial = {"ts": {"criterion": "ece"}, "focal_ts": {"criterion": "adaece"}}
    else:
        trial = {k: dict(v) for k, v in config.base_config().eval.posthoc.items()}
    methods = {k: (k, v) for k, v in trial.items()} | dict(REFITS)
    out = {}
    for name, (method, params) in methods.items():
        fit = build_posthoc(method, **params)
        if (ends := t_range(fit)) is not None:
            out[f"posthoc/{name}/T"] = ends
        if (gammas := getattr(fit, "gammas", None)) is not None and len(gammas):
            out[f"posthoc/{name}/gamma_ev"] = (float(min(gammas)), float(max(gammas)))
    return out


def edge_count(s: StudyData, label: str, key: str) -> tuple[int, int, str]:
    """(runs whose fitted value of ``key`` is at an end of its grid, runs, which end:
    "minimum"/"maximum"/"ends") for one arm over every run of the study; (0, n, "") when none
    is or the grid is unknown."""
    values = [v for run in runs_of(s) for v in per_seed(run, label, key).values()]
    grids = s.grids or t_grids(s.config)
    if key not in grids:
        return 0, len(values), ""
    lo, hi = grids[key]
    n_lo = sum(math.isclose(v, lo, rel_tol=1e-9) for v in values)
    n_hi = sum(math.isclose(v, hi, rel_tol=1e-9) for v in values)
    end = "ends" if n_lo and n_hi else "minimum" if n_lo else "maximum" if n_hi else ""
    return n_lo + n_hi, len(values), end


def t_ci(s: StudyData, label: str, key: str = "posthoc/ts/T") -> tuple[float, float, float]:
    """(mean, low, high) of an arm's fitted T over seeds (runs pooled per seed), 95 % t CI;
    NaN when no value or when some run's T is at an end of its grid (a bound, not a fit)."""
    if edge_count(s, label, key)[0]:
        return math.nan, math.nan, math.nan
    return mean_ci(list(pooled(s, label, key).values()))


def confidence(s: StudyData, label: str) -> str:
    """ "under-confident" / "over-confident" when the 95 % CI of the arm's TS temperature lies
    below / above 1, "" when it contains 1 or no reading is drawn (grid edge, no data)."""
    _, lo, hi = t_ci(s, label)
    return "under-confident" if hi < 1 else "over-confident" if lo > 1 else ""
