"""The results page's text: numbers in (`StudyData`, `results_stats`), markdown out.

Pure functions of the studies read back (or from the per-seed CSVs): every number printed is
computed here from the per-seed values, the studies' validated configs or the data registry —
none is typed into the text. The decision rules are written on the page before the numbers
(`RULES`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from results_claims import PAPERS, REFITS, Claim, StudyData, claims
from results_stats import (
    ALPHA,
    LABELS,
    Verdict,
    confidence,
    edge_count,
    evaluate,
    pooled,
    runs_of,
    single_run_labels,
    t_ci,
    t_grids,
    welch_labels,
)

# Per-seed metric columns of the full tables: (title, metric key, T key or None).
COLUMNS = [
    ("Error", "test/error", None),
    ("ECE", "test/ece", None),
    ("ECE TS (T)", "test/ece@ts", "posthoc/ts/T"),
    ("AdaECE", "test/adaece", None),
    ("AdaECE TS_EM (T)", "test/adaece@ts_em", "posthoc/ts_em/T"),
    ("AdaECE TS fgrid (T)", "test/adaece@ts_fgrid", "posthoc/ts_fgrid/T"),
    ("AdaECE focal TS (T, γ_ev)", "test/adaece@focal_ts", "posthoc/focal_ts/T"),
    ("NLL", "test/nll", None),
]
SCALE_PAIR = ("mnist1d", "mnist1d_large")  # the first regime and the second
FEW_ERRORS = 10  # fewer mean test errors per model than this: a set says nothing of small effects


def _values(s: StudyData, label: str, key: str) -> np.ndarray:
    return np.array(list(pooled(s, label, key).values()), float)


def _ms(values: Sequence[float], scale: float = 100.0, digits: int = 2) -> str:
    """mean ± sample sd (ddof 1) of scaled values over seeds."""
    v = np.asarray(values, float)
    v = v[~np.isnan(v)] * scale
    if not len(v):
        return "—"
    sd = v.std(ddof=1) if len(v) > 1 else 0.0
    return f"{v.mean():.{digits}f} ± {sd:.{digits}f}"


def _scale(metric: str) -> float:
    return 1.0 if metric.endswith("nll") or metric.startswith("posthoc/") else 100.0


def _p(p: float) -> str:
    return f"{p:.2g}"


def _pts(x: float) -> str:
    return f"{100 * x:+.2f}"


# ----------------------------------------------------------------------------- data sets


def split_sizes(dataset: str, val_fraction: float) -> tuple[int, int, int]:
    """(train, validation, test) sizes of a registered data set at ``val_fraction``, from the
    registry's summary (its first "train/val/test" triple: train + val is split again)."""
    from calibtune.data import DATASETS

    m = re.search(r"([\d,]+)/([\d,]+)/([\d,]+)", DATASETS.get(dataset).summary)
    tr, va, te = (int(x.replace(",", "")) for x in m.groups())
    val = round((tr + va) * val_fraction)
    return tr + va - val, val, te


def _sizes(s: StudyData) -> tuple[int, int, int] | None:
    if s.config is None:
        return None
    data = s.config.base_config().data
    return split_sizes(data.name, data.val_fraction)


def test_errors(s: StudyData) -> tuple[float, float] | None:
    """(fewest, most) mean test errors per model over the arms: error rate × test size."""
    sizes = _sizes(s)
    if sizes is None:
        return None
    per = [float(np.mean(_values(s, lab, "test/error"))) * sizes[2] for lab in s.seeds]
    per = [x for x in per if not math.isnan(x)]
    return (min(per), max(per)) if per else None


def few_errors_note(s: StudyData) -> str:
    """A sentence when a set's models make too few test errors for small effects."""
    errs, sizes = test_errors(s), _sizes(s)
    if errs is None or errs[1] >= FEW_ERRORS:
        return ""
    step = 100 / sizes[2]
    return (
        f"{s.dataset} is uninformative for small effects: its models make {errs[0]:.1f}–"
        f"{errs[1]:.1f} test errors each (of {sizes[2]:,} test samples; one sample moves an "
        f"error or calibration rate by up to {step:.2f} points)"
    )


# ----------------------------------------------------------------------------- flags


def edge_note(s: StudyData, label: str, key: str) -> str:
    """ "its <method> T (or γ_ev) is at the grid's minimum (0.1) in k of n runs" when any run's
    fitted value is at an end of its grid: a bound, not a fit, so no conclusion is drawn."""
    k, n, end = edge_count(s, label, key)
    if not k:
        return ""
    lo, hi = (s.grids or t_grids(s.config))[key]
    where = {"minimum": f"minimum ({lo:g})", "maximum": f"maximum ({hi:g})"}.get(
        end, f"ends ({lo:g}, {hi:g})"
    )
    what = "γ_ev" if key.endswith("gamma_ev") else "T"
    return f"its {key.split('/')[1]} {what} is at the grid's {where} in {k} of {n} runs"


def _t_text(s: StudyData, label: str) -> str:
    m, lo, hi = t_ci(s, label)
    return f"T = {m:.2f} [{lo:.2f}, {hi:.2f}]"


def arm_caveat(s: StudyData, label: str, role: str, methods: Sequence[str] = ()) -> str:
    """The ⚠ an arm of a claim carries: under-confident (the 95 % CI of its TS temperature
    below 1 — no arm of the papers is) or a fitted T (the trial's ``ts`` and ``methods``) at an
    end of its grid in some run. Over-confidence (CI above 1) is the papers' own regime and is
    not flagged. Empty when nothing applies."""
    edge = [
        e for k in dict.fromkeys(("ts", *methods)) if (e := edge_note(s, label, f"posthoc/{k}/T"))
    ]
    under = confidence(s, label) == "under-confident"
    bad = [f"under-confident ({_t_text(s, label)} < 1)"] if under else []
    parts = bad + edge
    return f"⚠ {role} `{label}`: " + "; ".join(parts) if parts else ""


def caveat(s: StudyData, c: Claim) -> str:
    """The flags of a claim: each arm by `arm_caveat`; for a paired claim (two post-hoc methods
    on the same models) a fitted T or focal TS's γ_ev at an end of its grid."""
    method = {
        side: m.split("@", 1)[1]
        for side, (_, m) in zip("bw", (c.better, c.worse), strict=True)
        if "@" in m
    }
    if c.paired:
        keys = [f"posthoc/{k}/T" for k in dict.fromkeys(method.values())]
        keys += [f"posthoc/{k}/gamma_ev" for k in dict.fromkeys(method.values())]
        notes = [n for k in keys if (n := edge_note(s, c.better[0], k))]
        return f"⚠ `{c.better[0]}`: " + "; ".join(notes) if notes else ""
    notes = [
        arm_caveat(s, c.better[0], "claimed-better arm", [method[k] for k in "b" if k in method]),
        arm_caveat(s, c.worse[0], "partner", [method[k] for k in "w" if k in method]),
    ]
    return "; ".join(n for n in notes if n)


def _short_caveat(s: StudyData, c: Claim) -> str:
    """The arms a claim's ⚠ names, for the tallies and lists (the full text is in its row)."""
    note = caveat(s, c)
    return "⚠ " + ", ".join(re.findall(r"`[^`]+`", note)[:2]) if note else ""


# ----------------------------------------------------------------------------- claims


def claim_rows(s: StudyData, verdicts: Mapping | None = None) -> list[tuple[Claim, str, Verdict]]:
    """Each claim of the study with its arms' numbers (a vs b, pooled mean ± sd in %) and its
    `Verdict` (``verdicts``: from `evaluate` over every study on the page; default: this one
    alone)."""
    verdicts = verdicts if verdicts is not None else evaluate([s])
    rows = []
    for i, c in enumerate(claims(s.dataset)):
        a, b = _values(s, *c.better), _values(s, *c.worse)
        rows.append((c, f"{_ms(a)} vs {_ms(b)}", verdicts[(s.dataset, i)]))
    return rows


def effect_cell(v: Verdict) -> str:
    """The headline: d with its 95 % CI, in points."""
    e = v.effect
    if math.isnan(e.d):
        return "no data"
    if math.isnan(e.lo):
        return f"d = {_pts(e.d)} ({e.n} seed, no spread)"
    return f"d = {_pts(e.d)} [{_pts(e.lo)}, {_pts(e.hi)}]"


def label_cell(v: Verdict) -> str:
    """The label with the p-value that decided it (Holm-adjusted) and Welch's sensitivity p."""
    e = v.effect
    if v.label == "no data":
        return "no data"
    welch = f"; Welch p = {_p(e.p_welch)}" if not math.isnan(e.p_welch) else ""
    if v.label in ("reproduces", "opposite"):
        why = f"Holm p = {_p(v.p_holm)}"
        why += "; smaller than the paper's effect" if v.smaller and v.label == "reproduces" else ""
    elif v.label == "equivalent":
        why = f"TOST ±{100 * e.margin:g}, Holm p = {_p(v.p_tost_holm)}"
    elif v.label == "smaller than the paper's":
        why = f"paper's effect rejected, Holm p = {_p(v.p_paper_holm)}"
    else:
        why = f"Holm p = {_p(v.p_holm)}; ~{v.seeds_needed} seeds to detect ±{100 * e.margin:g}"
    return f"**{v.label}** ({why}{welch})"


def render_summary(studies: Sequence[StudyData], verdicts: Mapping | None = None) -> list[str]:
    """The Summary table: per claim the paper's number and effect, and per data set our effect
    with its CI (the headline), the arms' numbers, the label and the flags."""
    verdicts = verdicts if verdicts is not None else evaluate(studies)
    head = "| paper | claim | paper's number (CIFAR-10 ResNet-50 unless said) | paper's effect |"
    sep = "|---|---|---|---|"
    for s in studies:
        head += f" {s.dataset}: effect [95 % CI] (better vs worse, %) | {s.dataset}: label |"
        sep += "---|---|"
    rows = {s.dataset: claim_rows(s, verdicts) for s in studies}
    lines = [head, sep]
    for i, c in enumerate(claims(studies[0].dataset)):
        paper = f"{c.paper_effect:+.2f}" if c.paper_effect is not None else "—"
        cells = [c.paper, c.claim, c.paper_number, paper]
        for s in studies:
            _, ours, v = rows[s.dataset][i]
            note = caveat(s, c)
            head = effect_cell(v) + (f" ({ours})" if v.label != "no data" else "")
            cells += [head, label_cell(v) + (f"; {note}" if note else "")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render_counts(studies: Sequence[StudyData], verdicts: Mapping | None = None) -> list[str]:
    """Per paper and data set, how many claims get each label (after Holm), and how many of
    each carry a ⚠ flag; then the totals."""
    verdicts = verdicts if verdicts is not None else evaluate(studies)
    names = " / ".join(LABELS)
    out = [f"In short (claims per paper: {names}; in brackets, how many of each carry a ⚠):", ""]
    rows = {s.dataset: claim_rows(s, verdicts) for s in studies}
    for paper in PAPERS:
        parts = []
        for s in studies:
            vs = [(v.label, bool(caveat(s, c))) for c, _, v in rows[s.dataset] if c.paper == paper]
            n = [sum(k == x for x, _ in vs) for k in LABELS]
            w = [sum(k == x and warn for x, warn in vs) for k in LABELS]
            parts.append(f"{s.dataset} {' / '.join(map(str, n))} (⚠ {' / '.join(map(str, w))})")
        out.append(f"- {paper}: " + "; ".join(parts))
    total = [sum(v.label == k for v in verdicts.values()) for k in LABELS]
    tally = ", ".join(f"{k} {n}" for k, n in zip(LABELS, total, strict=True))
    out += ["", f"Totals over the page: {tally}."]
    return out


def render_multiplicity(studies: Sequence[StudyData], verdicts: Mapping | None = None) -> list[str]:
    """The families Holm runs over, and the sensitivity of the labels: Welch's test in place of
    the paired one, and each kernel path alone in place of both pooled."""
    verdicts = verdicts if verdicts is not None else evaluate(studies)
    m = sum(not math.isnan(v.effect.p) for v in verdicts.values())
    mp = sum(not math.isnan(v.effect.p_paper) for v in verdicts.values())
    line = (
        f"**Multiplicity.** Holding the family-wise error at {100 * ALPHA:g} % (Holm): "
        f"{m} tests of no difference, {m} equivalence tests and {mp} tests of the paper's "
        "effect, each family over every claim on the page (all three data sets); the labels "
        "and tallies above are the adjusted ones."
    )
    welch = welch_labels(studies, verdicts)
    diff = [k for k in verdicts if welch[k] != verdicts[k].label]
    sens = [
        f"**Sensitivity.** Were the arms independent (Welch's test on the same pooled values, "
        f"Holm over the same family), {len(diff)} of {len(verdicts)} labels would differ"
        + (
            ": "
            + "; ".join(
                f"{k[0]}: {claims(k[0])[k[1]].claim} ({verdicts[k].label} → {welch[k]})"
                for k in diff
            )
            if diff
            else ""
        )
        + "."
    ]
    for which, name in ((0, "the first kernel path"), (1, "the second kernel path")):
        one = single_run_labels(studies, which)
        if one is not None:
            n = sum(one[k] != verdicts[k].label for k in verdicts)
            sens.append(
                f"From {name} alone (no replicate per seed), {n} of {len(verdicts)} labels "
                "would differ from the pooled ones."
            )
    return [line, "", " ".join(sens)]


# ----------------------------------------------------------------------------- second regime


def _config_factors(small: StudyData, large: StudyData) -> list[str]:
    """Every setting the second regime's study changes, read from the two validated configs."""
    a, b = small.config.base_config(), large.config.base_config()

    def model(t: Any) -> str:
        p = ", ".join(f"{k}={v}" for k, v in dict(t.model.params or {}).items())
        return f"`{t.model.name}`" + (f" ({p})" if p else "")

    pairs = [
        ("data set", f"`{a.data.name}`", f"`{b.data.name}`"),
        ("model", model(a), model(b)),
        ("weight decay", f"{a.optimizer.weight_decay:g}", f"{b.optimizer.weight_decay:g}"),
        ("epochs", str(a.train.epochs), str(b.train.epochs)),
        (
            "LR milestones",
            str(list(a.schedule.milestones or [])),
            str(list(b.schedule.milestones or [])),
        ),
        ("validation share", f"{a.data.val_fraction:g}", f"{b.data.val_fraction:g}"),
    ]
    sa, sb = _sizes(small), _sizes(large)
    if sa and sb:
        pairs.append(
            (
                "train / validation / test",
                " / ".join(f"{x:,}" for x in sa),
                " / ".join(f"{x:,}" for x in sb),
            )
        )
    return [f"{k} {x} → {y}" for k, x, y in pairs if x != y]


def _regime(s: StudyData) -> str:
    """CE's and focal γ=3's fitted TS temperature (with its CI) and test ECE in one phrase."""
    parts = []
    for label, name in (("cross_entropy", "CE"), ("focal_g3", "focal γ=3")):
        ece = _values(s, label, "test/ece")
        if not len(ece):
            parts.append(f"{name} no data")
            continue
        k, n, end = edge_count(s, label, "posthoc/ts/T")
        t = f"T at the grid's {end} in {k} of {n} runs" if k else _t_text(s, label)
        parts.append(f"{name} {t}, ECE {100 * ece.mean():.2f} %")
    return "; ".join(parts)


def render_scale(studies: Sequence[StudyData], verdicts: Mapping | None = None) -> list[str]:
    """The second regime (`SCALE_PAIR`): every setting it changes, why it was chosen, and every
    claim's label in both regimes side by side; [] unless both studies are on the page."""
    by = {s.dataset: s for s in studies}
    if not all(d in by for d in SCALE_PAIR):
        return []
    verdicts = verdicts if verdicts is not None else evaluate(studies)
    small, large = (by[d] for d in SCALE_PAIR)
    rows = [claim_rows(small, verdicts), claim_rows(large, verdicts)]
    factors = _config_factors(small, large) if small.config and large.config else []
    lines = [
        f"## A second regime, not a larger scale: {SCALE_PAIR[1]} beside {SCALE_PAIR[0]}",
        "",
        f"`{SCALE_PAIR[1]}` changes {len(factors)} settings at once"
        + (": " + "; ".join(factors) if factors else "")
        + ". It was chosen after seeing CE's calibration on "
        f"`{SCALE_PAIR[0]}` and on the networks tried with weight decay (Deviations), so that "
        "CE is over-confident as on CIFAR: its labels are an exploratory second regime, not a "
        "test of scale — no label change below can be attributed to any one of these settings. "
        f"Measured — {SCALE_PAIR[0]}: {_regime(small)}; {SCALE_PAIR[1]}: {_regime(large)} "
        "(the paper: CE T = 2.5, ECE 4.35 %; FL-3 T = 1.1, ECE 1.48 %).",
        "",
        f"| paper | claim | {SCALE_PAIR[0]} | {SCALE_PAIR[1]} | changes |",
        "|---|---|---|---|---|",
    ]
    changed, n_v = [], 0
    for (c, _, v0), (_, _, v1) in zip(*rows, strict=True):
        n_v += v0.label != v1.label
        w0, w1 = _short_caveat(small, c), _short_caveat(large, c)
        cells = [f"{v.label}{f' ({w})' if w else ''}" for v, w in ((v0, w0), (v1, w1))]
        what = [
            *(["label"] if v0.label != v1.label else []),
            *(["⚠ " + ("gone" if not w1 else "added" if not w0 else "other arms")] * (w0 != w1)),
        ]
        if what:
            changed.append(f"{c.paper}: {c.claim} ({cells[0]} → {cells[1]})")
        lines.append(
            f"| {c.paper} | {c.claim} | {cells[0]} | {cells[1]} | {', '.join(what) or '—'} |"
        )
    lines += [
        "",
        f"{n_v} of {len(rows[0])} labels change; {len(changed) - n_v} more change only their ⚠"
        + (":" if changed else "."),
        *[f"- {line}" for line in changed],
    ]
    return lines


# ----------------------------------------------------------------------------- per paper


def render_temperatures(studies: Sequence[StudyData]) -> list[str]:
    """Each arm's fitted TS temperature with its 95 % CI over seeds; called over-/under-confident
    only where the CI excludes 1; an arm with a run at an end of the grid is flagged, not read."""
    out = []
    for s in studies:
        ts = []
        for label in s.seeds:
            if not len(_values(s, label, "posthoc/ts/T")):
                continue
            k, n, end = edge_count(s, label, "posthoc/ts/T")
            if k:
                mean = float(np.mean(_values(s, label, "posthoc/ts/T")))
                ts.append(f"{label} {mean:.2f} (⚠ at the grid's {end} in {k} of {n} runs)")
                continue
            state = confidence(s, label)
            ts.append(f"{label} {_t_text(s, label)[4:]}" + (f" {state}" if state else ""))
        out.append(
            f"- {s.dataset}: optimal TS temperature, mean [95 % CI] over seeds; over-confident "
            "(T > 1) or under-confident (T < 1) only where the CI excludes 1; ⚠: a T at an end "
            f"of the grid is a bound, not a fit: {', '.join(ts)}. The paper: CE 2.5, FLSD-53 "
            "1.1, FL-3 1.1."
        )
    return out


def _edge_reading(s: StudyData, labels: Sequence[str]) -> str:
    """The reading that replaces a T-based one when an arm's T sits at an end of its grid."""
    hits = [(lab, edge_count(s, lab, "posthoc/ts/T")) for lab in labels]
    hits = [f"`{lab}` in {k} of {n} runs" for lab, (k, n, _) in hits if k]
    if not hits:
        return ""
    return (
        f"- Reading ({s.dataset}): the fitted TS temperature is at an end of its grid for "
        f"{', '.join(hits)} (a bound, not a fitted value): no reading of these arms' "
        "confidence is drawn from T."
    )


def reading(paper: str, studies: Sequence[StudyData]) -> list[str]:
    """Remarks where an arm's own miscalibration explains a label, each read off the 95 % CI of
    its TS temperature (`confidence`); none from a T at an end of its grid."""
    out = []
    for s in studies:
        involved = ["cross_entropy", "focal_g3"] + (["flsd53"] if paper == PAPERS[1] else [])
        if paper in PAPERS[:4] and (note := _edge_reading(s, involved)):
            out.append(note)
            continue
        ce, fl = confidence(s, "cross_entropy"), confidence(s, "focal_g3")
        if math.isnan(t_ci(s, "cross_entropy")[0]) or math.isnan(t_ci(s, "focal_g3")[0]):
            continue
        ts = f"CE {_t_text(s, 'cross_entropy')}, focal {_t_text(s, 'focal_g3')}"
        ce_state = ce or "calibrated within the seed spread"
        if paper == PAPERS[0]:
            if fl != "under-confident":
                regime = "the same direction as the paper's temperatures"
            elif ce != "over-confident":
                regime = (
                    f"CE is {ce_state} here, and focal loss overshoots into under-confidence — "
                    "not the paper's regime (CE over-confident at T = 2.5, focal T ≈ 1.1)"
                )
            else:
                regime = (
                    "CE is over-confident here as in the paper, but focal loss overshoots into "
                    "under-confidence (the paper: focal T ≈ 1.1), so a lower focal ECE trades "
                    "one miscalibration for the other rather than removing it"
                )
            out.append(f"- Reading ({s.dataset}): {ts}: {regime}.")
        elif paper in (PAPERS[2], PAPERS[3]) and fl == "under-confident":
            out.append(
                f"- Reading ({s.dataset}): the partner, focal γ=3, is under-confident here "
                f'({_t_text(s, "focal_g3")}), so "beats focal" partly measures focal loss\'s own '
                "miscalibration at this scale rather than the paper's improvement over a "
                "well-calibrated focal model."
            )
        elif paper == PAPERS[1] and ce != "over-confident":
            out.append(
                f"- Reading ({s.dataset}): CE is {ce_state} ({_t_text(s, 'cross_entropy')}; "
                "paper 2.52), so AdaFocal has no over-confidence to remove relative to CE; "
                f"FLSD-53 has {_t_text(s, 'flsd53')}."
            )
    return out


SWITCH_KEY = "train/inverse_focal_bins"  # the CSV column of `render_switches` (per seed)


def render_switches(studies: Sequence[StudyData]) -> list[str]:
    """AdaFocal's validation bins whose γ went negative (inverse focal), per seed and run, from
    the CSV's `SWITCH_KEY` column (or the run's own histories)."""
    out = []
    for s in studies:
        per_run = []
        for run in runs_of(s):
            sw = run.switches.get("adafocal") or [
                int(x)
                for x in run.seeds.get("adafocal", {}).get(SWITCH_KEY, [])
                if not math.isnan(x)
            ]
            if sw:
                per_run.append(sw)
        if not per_run:
            out.append(
                f"- {s.dataset}: AdaFocal's switch counts are not in the CSV this page was "
                f"rendered from (`make results` writes them, column `{SWITCH_KEY}`)."
            )
            continue
        text = "; ".join(", ".join(map(str, sw)) for sw in per_run)
        n = sum(x > 0 for sw in per_run for x in sw)
        total = sum(len(sw) for sw in per_run)
        out.append(
            f"- {s.dataset}: validation bins whose γ went negative (inverse focal) at some "
            f"update, per seed (runs separated by ';'): {text} — a switch in {n} of {total} runs."
        )
    return out


def render_arms(s: StudyData) -> list[str]:
    """The full per-arm table of one study: per-seed values pooled over runs, mean ± sd over
    seeds (%; NLL in nats); fitted T (and γ_ev) with their grid-edge counts over runs."""
    lines = [
        "| loss | seeds × runs | "
        + " | ".join(t for t, _, _ in COLUMNS)
        + " | OOD AUROC (entropy) |",
        "|---|---|" + "---|" * (len(COLUMNS) + 1),
    ]
    ood = [
        k for k in next(iter(s.seeds.values()), {}) if k.startswith("ood/") and k.endswith("/auroc")
    ]
    for label in s.seeds:
        n = len(_values(s, label, "test/ece"))
        cells = [f"`{label}`", f"{n} × {len(runs_of(s))}"]
        for _, key, tkey in COLUMNS:
            cell = _ms(_values(s, label, key), _scale(key))
            tv = _values(s, label, tkey) if tkey else []
            if len(tv):
                cell += f" ({np.mean(tv):.2f}"
                edges = [edge_count(s, label, tkey)]
                if key.endswith("focal_ts") and len(
                    g := _values(s, label, "posthoc/focal_ts/gamma_ev")
                ):
                    cell += f", {np.mean(g):.2f}"
                    edges.append(edge_count(s, label, "posthoc/focal_ts/gamma_ev"))
                flags = [f"{k}/{n}" for k, n, _ in edges if k]
                cell += f"; ⚠ edge {', '.join(flags)})" if flags else ")"
            cells.append(cell)
        cells.append("; ".join(f"{k[4:-6]} {_ms(_values(s, label, k))}" for k in sorted(ood)))
        lines.append("| " + " | ".join(cells) + " |")
    return [
        *lines,
        "",
        "In brackets: the mean fitted T (and focal TS's γ_ev) over seeds; ⚠ edge k/n: in k of n "
        "runs the fitted T (then γ_ev) is at an end of its grid — a bound, not a fitted value.",
    ]


def _loss_text(choice: Any) -> str:
    fixed = choice.loss.space.fixed
    params = ", ".join(f"{k}={v}" for k, v in fixed.items())
    return f"`{choice.label}`" + (f" ({params})" if params else "")


def _kv(d: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in dict(d).items())


def render_setup(studies: Sequence[StudyData]) -> list[str]:
    """The setup table, read from each study's validated config (not restated by hand)."""
    rows: dict[str, list[str]] = {}
    for s in studies:
        c, t = s.config, s.config.base_config()
        o, sch = t.optimizer, t.schedule
        sizes = _sizes(s)
        for key, val in (
            (
                "data",
                f"`{t.data.name}` (val fraction {t.data.val_fraction}), OOD "
                + ", ".join(f"`{x}`" for x in t.data.ood),
            ),
            ("train / validation / test", " / ".join(f"{x:,}" for x in sizes) if sizes else "?"),
            (
                "model",
                f"`{t.model.name}`" + (f" ({_kv(t.model.params)})" if t.model.params else ""),
            ),
            ("optimiser", f"{o.name} lr {o.lr}, momentum {o.momentum}, wd {o.weight_decay}"),
            ("schedule", f"{sch.name}, ×{sch.gamma} after epochs {list(sch.milestones or [])}"),
            ("epochs, batch", f"{t.train.epochs}, {t.train.batch_size}"),
            ("seeds (`search.seeds`)", ", ".join(map(str, c.search.seeds))),
            ("losses", "; ".join(_loss_text(ch) for ch in c.losses)),
            (
                "post-hoc in the trial",
                "; ".join(f"`{k}` ({_kv(v)})" for k, v in t.eval.posthoc.items()),
            ),
            (
                "post-hoc re-fitted here",
                "; ".join(f"`{k}`: {m} ({_kv(p)})" for k, (m, p) in REFITS.items()),
            ),
        ):
            rows.setdefault(key, []).append(val)
    head = "| | " + " | ".join(s.dataset for s in studies) + " |"
    lines = [head, "|---|" + "---|" * len(studies)]
    return lines + [f"| {k} | " + " | ".join(v) + " |" for k, v in rows.items()]
