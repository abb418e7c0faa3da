"""The results page (`make results`): the runner — run the results studies, read them back,
write the per-seed CSVs and the page.

    python bench/results.py                  # run (or reuse) the studies on both kernel paths,
                                             # then write docs/results.md and the CSVs
    python bench/results.py --no-run         # only read the finished studies and write the page
    python bench/results.py --from-csv       # re-render the page from docs/results_seeds*.csv
                                             # (no training: the report tables, figures and the
                                             # run's stamp are kept from the page)

The page is made in three parts: this runner (`run_studies` calls `calibtune run` on every study
in `studies/results/`; `collect` reads a study back through `calibtune.study` and each seed's
artifacts: `metrics.json`, `logits.pt`, `gamma_history.json`), the statistics
(`results_stats`: the blocked analysis over seeds with both kernel paths pooled, Holm, the
labels) and the rendering (`results_render`, `results_text`). The claims are `results_claims`.

One `ts` per trial: a trial config holds one configuration per post-hoc method, so the studies
fit TS on equal-width ECE (Mukhoti, Tao, FCL) and the two other TS protocols (Ghosh et al.'s,
Komisarenko & Kull's) are re-fitted here on each seed's saved validation logits with
`calibtune.posthoc.build_posthoc` and scored on its test logits (`REFITS`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the page's modules, next to this file

from results_claims import (
    PAPERS,
    REFITS,
    Claim,
    StudyData,
    claims,
    ood_key,
)
from results_render import (
    SWITCH_KEY,
    arm_caveat,
    caveat,
    claim_rows,
    edge_note,
    few_errors_note,
    reading,
    render_arms,
    render_counts,
    render_multiplicity,
    render_scale,
    render_setup,
    render_summary,
    render_switches,
    render_temperatures,
    split_sizes,
)
from results_stats import (
    ALPHA,
    LABELS,
    Effect,
    Verdict,
    edge_count,
    effect,
    evaluate,
    holm,
    label_of,
    pooled,
    seeds_needed,
    t_ci,
    t_grids,
    tost_p,
)
from results_text import (
    deviations,
    ood_note,
    render_page,
    rules,
    scale_notes,
)

# The runner's own names and, re-exported, the statistics' and the rendering's (tests load this
# one file).
__all__ = [
    "ALPHA",
    "LABELS",
    "PAPERS",
    "REFITS",
    "SWITCH_KEY",
    "Claim",
    "Effect",
    "StudyData",
    "Verdict",
    "arm_caveat",
    "caveat",
    "claim_rows",
    "claims",
    "code_digest",
    "collect",
    "deviations",
    "edge_count",
    "edge_note",
    "effect",
    "evaluate",
    "few_errors_note",
    "holm",
    "label_of",
    "main",
    "ood_key",
    "ood_note",
    "page_studies",
    "platform_record",
    "pooled",
    "read_seeds_csv",
    "reading",
    "render_arms",
    "render_counts",
    "render_multiplicity",
    "render_page",
    "render_scale",
    "render_setup",
    "render_summary",
    "render_switches",
    "render_temperatures",
    "rerender",
    "rules",
    "scale_notes",
    "seeds_needed",
    "split_sizes",
    "t_ci",
    "t_grids",
    "tost_p",
    "write_seeds_csv",
]

ROOT = Path(__file__).resolve().parents[1]
STUDIES = {
    "mnist1d": ROOT / "studies/results/mnist1d.yaml",
    "digits": ROOT / "studies/results/digits.yaml",
    "mnist1d_large": ROOT / "studies/results/mnist1d_large.yaml",
}
STORAGE = ROOT / "runs/results"
PAGE = ROOT / "docs/results.md"
SEEDS_CSV = ROOT / "docs/results_seeds.csv"  # every per-seed number the page is built from
IMG = ROOT / "docs/img/results"
SEEDS_CSV_ALT = ROOT / "docs/results_seeds_kernel2.csv"  # the same studies, other kernel path

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
    "calibtune/studyfile/_config.py",
    "calibtune/studyfile/_spaces.py",
    "calibtune/study/_trainable.py",
    "studies/results/*.yaml",
)

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


def run_studies(
    paths: Mapping[str, Path],
    storage: Path,
    tracking_uri: str,
    env: Mapping[str, str] | None = None,
) -> dict[str, float]:
    """`calibtune run` every study (in ``env``, default: this process's environment); wall
    seconds per study. A study its storage already holds is continued/reused, and keeps the time
    recorded when it ran (``<storage>/times.json``); the platform it ran on is recorded in
    ``<storage>/platform.json`` (`platform_record`, in that environment)."""
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
        rc = subprocess.run([*cmd0, *args, "--quiet"], cwd=ROOT, env=env).returncode
        _check_finished(path, storage, tracking_uri, rc)
        if not reused:
            (storage / "platform.json").write_text(json.dumps(platform_record(env), indent=1))
            times[name] = time.monotonic() - start
            digests[name] = digest  # the code that trained it, whatever the page is rendered by
            record.write_text(json.dumps(times, indent=1))
            codes.write_text(json.dumps(digests, indent=1))
    return times


def platform_record(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What the floating-point results depend on besides the code, as seen by a fresh Python in
    ``env``: torch version, ATen's CPU capability (``torch.backends.cpu.get_cpu_capability()``,
    which ``ATEN_CPU_CAPABILITY`` lowers), the BLAS (``torch.__config__.show()``), intra-op
    threads, CPU model and count."""
    probe = (
        "import json, os, re, torch; c = torch.__config__.show(); "
        "m = re.search(r'Math Kernel Library Version ([0-9.]+)', c); "
        "b = re.search(r'BLAS_INFO=([^,]+)', c); "
        "cpu = [ln.split(':', 1)[1].strip() for ln in open('/proc/cpuinfo') "
        "if ln.startswith('model name')][:1] if os.path.exists('/proc/cpuinfo') else []; "
        "print(json.dumps({'torch': torch.__version__, "
        "'cpu_capability': torch.backends.cpu.get_cpu_capability(), "
        "'blas': (b.group(1) if b else '?') + (' ' + m.group(1) if m else ''), "
        "'threads': torch.get_num_threads(), 'cpus': os.cpu_count(), "
        "'cpu': cpu[0] if cpu else '?', "
        "'aten_cpu_capability_env': os.environ.get('ATEN_CPU_CAPABILITY', ''), "
        "'threadpools': pools()}))"
    )
    # threadpoolctl names the BLAS each library loaded and its code path (e.g. MKL's per-vendor
    # kernels): what torch's build string cannot tell
    probe = (
        "def pools():\n"
        " try:\n  from threadpoolctl import threadpool_info\n"
        " except ImportError:\n  return []\n"
        " return sorted({f\"{p.get('internal_api')} {p.get('version') or ''}\".strip() + "
        "(f\" ({p['architecture']})\" if p.get('architecture') else '') "
        "for p in threadpool_info()})\n" + probe
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def platform_text(rec: Mapping[str, Any]) -> str:
    """One line of `platform_record` for the page.

    >>> platform_text({"torch": "2.4", "cpu_capability": "AVX2", "blas": "mkl 2024.2",
    ...                "threads": 2, "cpus": 2, "cpu": "X", "aten_cpu_capability_env": ""})
    'torch 2.4, CPU capability AVX2, BLAS mkl 2024.2, 2 intra-op threads, 2 CPUs (X)'
    """
    env = rec.get("aten_cpu_capability_env")
    return (
        f"torch {rec['torch']}, CPU capability {rec['cpu_capability']}"
        + (f" (ATEN_CPU_CAPABILITY={env})" if env else "")
        + f", BLAS {rec['blas']}, {rec['threads']} intra-op threads, {rec['cpus']} CPUs "
        f"({rec['cpu']})"
        + (
            f"; thread pools loaded: {', '.join(rec['threadpools'])}"
            if rec.get("threadpools")
            else ""
        )
    )


def second_kernel(native: str) -> str:
    """The ``ATEN_CPU_CAPABILITY`` of the stability run: ``avx2`` unless that is the native path
    already, then ``default`` (the non-vectorised kernels).

    >>> second_kernel("AVX512"), second_kernel("AVX2")
    ('avx2', 'default')
    """
    return "default" if native.upper() == "AVX2" else "avx2"


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
    from calibtune.readers._results import format_table
    from calibtune.study import StudyDir, locate_study, report_table, trials_frame

    ref = locate_study(study_yaml, storage, tracking_uri)
    frame = trials_frame(ref)
    data = StudyData(dataset, ref.name, {}, format_table(report_table(ref), "markdown"), {})
    data.config = StudyDir.find(ref.name, storage).read_study()
    data.grids = t_grids(data.config)
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
        data.seed_ids[label] = [int(_seed(a)) for a in arts]
        data.switches[label] = [inverse_focal_bins(a) for a in arts]
        if any(x >= 0 for x in data.switches[label]):  # an adaptive loss: into the CSV too
            data.seeds[label][SWITCH_KEY] = [float(x) for x in data.switches[label]]
        data.means[label] = {k: float(v) for k, v in row.items() if "/" in str(k) and _num(v)}
    order = [c.label for c in data.config.losses]  # the study file's order, not finishing order
    for table in (data.seeds, data.trial_dirs, data.switches, data.means, data.seed_ids):
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
        ids: dict[str, list[int]] = {}
        for label, arm in part.groupby("loss_label", sort=False):
            arm = arm.dropna(axis=1, how="all")
            seeds[str(label)] = {
                k: [float(x) for x in arm[k]] for k in arm.columns if k not in meta
            }
            if "seed" in arm and arm["seed"].notna().all():
                ids[str(label)] = [int(x) for x in arm["seed"]]
        study = StudyData(str(dataset), str(part["study"].iloc[0]), seeds, "", {}, seed_ids=ids)
        out.append(study)
    return out


def page_studies(csv: Path = SEEDS_CSV, alt_csv: Path = SEEDS_CSV_ALT) -> list[StudyData]:
    """The page's numbers back from its CSVs, with each study's validated config (the setup
    table, the temperature grids) and, where ``alt_csv`` exists, the second kernel path's run
    (``alt``: pooled with the first as replicates within each seed, `results_stats`)."""
    from calibtune.study import load_study

    studies = read_seeds_csv(csv)
    alts = {s.dataset: s for s in read_seeds_csv(alt_csv)} if alt_csv.exists() else {}
    kernel = _kernel_of(alt_csv)
    for s in studies:
        s.config = load_study(STUDIES[s.dataset]) if s.dataset in STUDIES else None
        s.grids = t_grids(s.config)
        s.alt = alts.get(s.dataset)
        if s.alt is not None:
            s.alt.config, s.alt.kernel, s.alt.grids = s.config, kernel, s.grids
    return studies


def _kernel_of(alt_csv: Path) -> str:
    """The kernel path recorded next to the second run's CSV (``<csv>.kernel``)."""
    tag = alt_csv.with_suffix(".kernel")
    return tag.read_text().strip() if tag.exists() else "the other kernel path"


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
        if s.dataset == "mnist1d"
        or fig == "gamma_dynamics"
        or (s.dataset == "mnist1d_large" and label != "fcl_g3")
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


def kept_from_page(text: str) -> tuple[str, str, dict[str, str], dict[str, str]]:
    """What a re-render keeps from the page a run wrote: (timing, stamp) of its "Measured wall
    time" line, the figures (caption -> path) and each study's `calibtune report` table."""
    line = next(ln for ln in text.splitlines() if ln.startswith("- Measured wall time"))
    timing, stamp = line.removeprefix("- Measured wall time of the studies: ").split(". ", 1)
    figs = text.split("\n## Figures\n", 1)[1].split("\n## ", 1)[0]
    figures = dict(re.findall(r"!\[(.*?)\]\((img/results/[^)]+)\)", figs))
    reports = dict(re.findall(r"`calibtune report` \((\S+)\):\n\n(.*?\n)(?=\n## |$)", text, re.S))
    return timing, stamp, figures, reports


def rerender(page: Path, csv: Path, alt_csv: Path) -> str:
    """The page re-rendered from the committed per-seed numbers, nothing retrained: everything
    computed from the numbers is new; the timing, stamp, figures and `calibtune report` tables
    of the run that made them are kept."""
    timing, stamp, figures, reports = kept_from_page(page.read_text())
    stamp = stamp.split(" Page text re-rendered from ", 1)[0]  # an earlier re-render's note
    studies = page_studies(csv, alt_csv)
    for s in studies:
        s.report_md = reports.get(s.name, "")
    sha = _git_sha()
    stamp += (
        f" Page text re-rendered from `{_rel(csv)}`"
        + (f" and `{_rel(alt_csv)}`" if alt_csv.exists() else "")
        + " by `python bench/results.py "
        f"--from-csv` at git {sha} on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} "
        "(no study retrained)."
    )
    platform = (
        "not recorded when these studies ran (the record came later); the re-render ran on "
        + platform_text(platform_record())
    )
    return render_page(studies, figures, {}, "make results", stamp, platform, timing)


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def _git_sha() -> str:
    return (
        subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        or "?"
    )


def collect_all(storage: Path) -> tuple[list[StudyData], list[str]]:
    """Every study of `STUDIES` read back from ``storage`` (and the ones not found there)."""
    from calibtune.study import StudyNotFoundError

    uri = f"sqlite:///{storage / 'mlflow.db'}"
    studies, missing = [], []
    for k, p in STUDIES.items():
        try:
            studies.append(collect(k, p, storage, uri))
        except StudyNotFoundError as err:  # --no-run before a study ran: say so on the page
            missing.append(f"{k} ({err})")
    return studies, missing


def kernel_run(studies: Sequence[StudyData], storage: Path, no_run: bool) -> str:
    """Train (or reuse) the studies once more on the second kernel path (`second_kernel`) in
    ``<storage>_kernel2``, attach each as ``alt`` and write its per-seed CSV; returns the path
    ("" when no second run is there and ``no_run``)."""
    alt_storage = storage.with_name(storage.name + "_kernel2")
    native = platform_record()["cpu_capability"]
    kernel = f"ATEN_CPU_CAPABILITY={second_kernel(native)}"
    if not no_run:
        alt_storage.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "ATEN_CPU_CAPABILITY": second_kernel(native)}
        run_studies(STUDIES, alt_storage, f"sqlite:///{alt_storage / 'mlflow.db'}", env)
    if not alt_storage.exists():
        return ""
    alts = {a.dataset: a for a in collect_all(alt_storage)[0]}
    for s in studies:
        if s.dataset in alts:
            s.alt = alts[s.dataset]
            s.alt.kernel = kernel
    write_seeds_csv(list(alts.values()), SEEDS_CSV_ALT)
    SEEDS_CSV_ALT.with_suffix(".kernel").write_text(kernel + "\n")
    return kernel


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-run", action="store_true", help="only read finished studies back")
    ap.add_argument(
        "--from-csv", action="store_true", help="re-render the page from --csv, no studies"
    )
    ap.add_argument(
        "--no-kernel-check", action="store_true", help="skip the second kernel path's run"
    )
    ap.add_argument("--storage", type=Path, default=STORAGE)
    ap.add_argument("--out", type=Path, default=PAGE)
    ap.add_argument("--img", type=Path, default=IMG)
    ap.add_argument("--csv", type=Path, default=SEEDS_CSV, help="the per-seed numbers (CSV)")
    ap.add_argument(
        "--times",
        type=Path,
        default=None,
        help="JSON {study or step: seconds} measured by an earlier run, reported as given",
    )
    ap.add_argument("--note", default="", help="a sentence about the run, added to the page")
    args = ap.parse_args(argv)
    if args.from_csv:
        page = rerender(args.out, args.csv.resolve(), SEEDS_CSV_ALT)
        args.out.write_text(page)
        print(f"re-rendered {args.out} ({len(page)} chars) from {args.csv}")
        return 0
    storage = args.storage.resolve()
    storage.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{storage / 'mlflow.db'}"
    times = {} if args.no_run else run_studies(STUDIES, storage, uri)
    given: dict[str, float] = {}  # --times: a run's own measurements, kept as they are
    if args.times and args.times.exists():
        given = {k: float(v) for k, v in json.loads(args.times.read_text()).items()}
        times = dict(given)
    start = time.monotonic()
    studies, missing = collect_all(storage)
    t0 = time.monotonic()
    kernel = "" if args.no_kernel_check else kernel_run(studies, storage, args.no_run)
    if times and kernel and "second kernel path" not in given:
        times["second kernel path"] = time.monotonic() - t0
        start += times["second kernel path"]
    figures = copy_figures(studies, args.img)
    if times and "read-back and page" not in given:
        times["read-back and page"] = time.monotonic() - start
    digests = trained_by(storage, [s.dataset for s in studies])
    record = storage / "platform.json"
    platform = platform_text(json.loads(record.read_text())) if record.exists() else "not recorded"
    stamp = (
        _stamp()
        + f" {digest_sentence(digests)}"
        + (f" Second kernel path: {kernel}." if kernel else " No second kernel path was run.")
        + (f" {args.note}" if args.note else "")
        + "".join(f" **Not included: {m}.**" for m in missing)
    )
    page = render_page(studies, figures, times, "make results", stamp, platform)
    args.out.write_text(page)
    rows = write_seeds_csv(studies, args.csv)
    print(f"wrote {args.out} ({len(page)} chars) and {args.csv} ({rows} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
