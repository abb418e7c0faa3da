"""The committed results page (docs/results.md) against the code and numbers it claims: it is not
older than the code it measures, every label is what the two committed per-seed CSVs give under
the page's stated rules (recomputed here with scipy, independently of the page's helpers), and
its flags, sections and prose follow their rules (issue 42 items 1–7)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from tests.test_results_studies import ROOT, G

PAGE = ROOT / "docs" / "results.md"
CSV = ROOT / "docs" / "results_seeds.csv"
CSV2 = ROOT / "docs" / "results_seeds_kernel2.csv"
DATASETS = ("mnist1d", "digits", "mnist1d_large")


def _section(text: str, title: str) -> list[str]:
    body = text.split(f"## {title}\n", 1)[1]
    return body.split("\n## ", 1)[0].strip().splitlines()


def test_the_page_is_not_older_than_the_code_it_measures():
    """Fails when any file of `MEASURED_CODE` changed after the page's studies ran: regenerate
    with `make results` (delete runs/results first, so that the studies train again)."""
    found = re.findall(r"Code measured \(.*?\): (.*?)\.\n", PAGE.read_text())
    assert found, "docs/results.md: expected a 'Code measured' stamp (written by make results)"
    digests = set(re.findall(r"`([0-9a-f]{16}|unknown)`", found[0]))
    assert digests == {G.code_digest()}, (
        f"docs/results.md measured code {sorted(digests)}, the code now is {G.code_digest()}: "
        "run `rm -rf runs/results && make results`"
    )


# ----------------------------------------------------------------------------- independent labels


def _holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (written here, not the page's)."""
    order = np.argsort(ps)
    m, out, run = len(ps), [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        run = max(run, min(1.0, (m - rank) * ps[i]))
        out[i] = run
    return out


def test_the_test_s_holm_on_a_hand_derived_example():
    # sorted 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, then max(0.06, 0.04·1) = 0.06
    assert _holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])


def _pooled_frame():
    """Both CSVs, averaged per (dataset, loss, seed): the runs of a seed are replicates."""
    import pandas as pd

    both = pd.concat([pd.read_csv(CSV), pd.read_csv(CSV2)])
    cols = [c for c in both.columns if c not in ("study", "trial")]
    return both[cols].copy().groupby(["dataset", "loss_label", "seed"]).mean().reset_index()


def _expected_labels() -> dict[tuple[str, str], str]:
    """Every claim's label from the pooled CSVs with scipy under the page's stated rules."""
    from scipy import stats

    frame = _pooled_frame()
    rows = []
    for ds in DATASETS:
        part = frame[frame.dataset == ds]
        for c in G.claims(ds):
            a = part[part.loss_label == c.better[0]].sort_values("seed")[c.better[1]].to_numpy()
            b = part[part.loss_label == c.worse[0]].sort_values("seed")[c.worse[1]].to_numpy()
            d = (b - a) if c.higher_is_better else (a - b)
            delta = 0.01 if c.better[1].startswith("ood/") else 0.0025
            p = stats.ttest_1samp(d, 0.0).pvalue
            tost = max(
                stats.ttest_1samp(d, -delta, alternative="greater").pvalue,
                stats.ttest_1samp(d, delta, alternative="less").pvalue,
            )
            pe = c.paper_effect / 100 if c.paper_effect is not None else None
            pp = stats.ttest_1samp(d, pe).pvalue if pe is not None else math.nan
            assert p == pytest.approx(stats.ttest_rel(a, b).pvalue, rel=1e-9)
            rows.append((ds, c, d.mean(), p, tost, pp))
    hp, ht = _holm([r[3] for r in rows]), _holm([r[4] for r in rows])
    known = [i for i, r in enumerate(rows) if not math.isnan(r[5])]
    hpp = dict(zip(known, _holm([rows[i][5] for i in known]), strict=True))
    out = {}
    for i, (ds, c, d, *_) in enumerate(rows):
        if hp[i] < 0.05:
            label = "reproduces" if d < 0 else "opposite"
        elif ht[i] < 0.05:
            label = "equivalent"
        elif i in hpp and hpp[i] < 0.05 and d > c.paper_effect / 100:
            label = "smaller than the paper's"
        else:
            label = "underpowered"
        out[(ds, c.claim)] = label
    return out


def _page_labels() -> dict[tuple[str, str], str]:
    out = {}
    for row in _section(PAGE.read_text(), "Summary")[2:]:
        if not row.startswith("| "):
            break
        cells = row.strip("| ").split(" | ")
        for j, ds in enumerate(DATASETS):
            out[(ds, cells[1])] = re.match(r"\*\*(.+?)\*\*", cells[5 + 2 * j]).group(1)
    return out


def test_every_label_on_the_page_is_recomputed_from_the_csvs_with_scipy():
    """Issue 42.1–4: seed-paired t tests on the two kernel paths averaged per seed, TOST at the
    stated margins, the test of the paper's effect, Holm over each family; the page's labels,
    its tallies and its totals are exactly those."""
    expected = _expected_labels()
    assert _page_labels() == expected
    text = PAGE.read_text()
    totals = {k: sum(v == k for v in expected.values()) for k in G.LABELS}
    assert "Totals over the page: " + ", ".join(f"{k} {n}" for k, n in totals.items()) in text
    for paper in G.PAPERS:
        parts = []
        for ds in DATASETS:
            mine = [
                v
                for (d, claim), v in expected.items()
                if d == ds and any(c.claim == claim and c.paper == paper for c in G.claims(ds))
            ]
            parts.append(f"{ds} " + " / ".join(str(mine.count(k)) for k in G.LABELS))
        for part in parts:
            assert re.search(rf"- {re.escape(paper)}: .*{re.escape(part)} \(", text)


def test_the_summary_is_what_the_committed_per_seed_numbers_give():
    studies = G.page_studies(CSV, CSV2)
    assert [s.dataset for s in studies] == list(DATASETS)
    for s in studies:
        seeds = 9 if s.dataset == "digits" else 5  # digits: the power estimate's count
        assert s.alt is not None and {len(v) for v in s.seed_ids.values()} == {seeds}
    summary = _section(PAGE.read_text(), "Summary")
    v = G.evaluate(studies)
    expected = [*G.render_summary(studies, v), "", *G.render_counts(studies, v), ""]
    expected += [*G.render_multiplicity(studies, v), "", G.ood_note(studies)]
    assert summary == expected


def test_every_effect_and_arm_number_is_traceable_to_the_seed_rows():
    """The headline d [95 % CI] and 'mean ± sd' of a Summary cell, from the pooled rows."""
    from scipy import stats

    frame = _pooled_frame()
    part = frame[frame.dataset == "mnist1d"].sort_values("seed")
    fl = 100 * part[part.loss_label == "flsd53"]["test/ece"].to_numpy()
    ce = 100 * part[part.loss_label == "cross_entropy"]["test/ece"].to_numpy()
    ci = stats.ttest_rel(fl, ce).confidence_interval(0.95)
    cell = (
        f"d = {(fl - ce).mean():+.2f} [{ci.low:+.2f}, {ci.high:+.2f}] "
        f"({fl.mean():.2f} ± {fl.std(ddof=1):.2f} vs {ce.mean():.2f} ± {ce.std(ddof=1):.2f})"
    )
    row = next(
        r for r in PAGE.read_text().splitlines() if "| FLSD-53 has lower ECE than CE before" in r
    )
    assert cell in row and "| -2.80 |" in row  # beside the paper's effect


def test_seed_csv_round_trips_exactly_with_seeds_and_switch_counts(tmp_path: Path):
    x = 0.1 + 0.2  # not representable in few digits
    seeds = {"a": {"test/ece": [x, math.nan, 1 / 3]}, "adafocal": {"test/ece": [0.5, 0.25, 1e-17]}}
    seeds["adafocal"][G.SWITCH_KEY] = [2.0, 0.0, 5.0]
    dirs = {k: [tmp_path / f"t{k}-seed{i}" / "artifacts" for i in (3, 1, 2)] for k in seeds}
    s = G.StudyData("mnist1d", "results_mnist1d", seeds, "", dirs)
    assert G.write_seeds_csv([s], tmp_path / "s.csv") == 6
    (back,) = G.read_seeds_csv(tmp_path / "s.csv")
    assert back.dataset == "mnist1d" and back.name == "results_mnist1d"
    assert back.seeds["adafocal"] == seeds["adafocal"] and back.seed_ids["adafocal"] == [3, 1, 2]
    assert back.seeds["a"]["test/ece"][0] == x and math.isnan(back.seeds["a"]["test/ece"][1])
    back.dataset = "digits"
    (line,) = [r for r in G.render_switches([back]) if r.startswith("- digits")]
    assert "per seed (runs separated by ';'): 2, 0, 5 — a switch in 2 of 3 runs." in line


# ----------------------------------------------------------------------------- flags (42.5)


def _claim(paper: str, text: str) -> G.Claim:
    return next(c for c in G.claims("mnist1d") if c.paper == paper and c.claim.startswith(text))


@pytest.mark.parametrize(
    ("t", "expected"),
    [
        ([0.5, 0.6, 0.55], "under-confident (T = 0.55 [0.43, 0.67] < 1)"),
        ([0.92, 0.70, 1.14], None),  # mean 0.92, CI holds 1: not flagged (the old rule did)
        ([1.5, 1.6, 1.55], None),  # over-confidence is the papers' regime
    ],
)
def test_an_arm_is_flagged_under_confident_only_when_its_t_ci_excludes_1(t, expected):
    claim = _claim("Tao et al. 2023", "dual focal has lower ECE")
    seeds = {
        "dual_focal": {"test/ece": [0.01, 0.012, 0.011], "posthoc/ts/T": [1.0, 1.01, 0.99]},
        "focal_g3": {"test/ece": [0.09, 0.09, 0.09], "posthoc/ts/T": t},
    }
    s = G.StudyData("mnist1d", "x", seeds, "", {})
    note = G.caveat(s, claim)
    assert note == (f"⚠ partner `focal_g3`: {expected}" if expected else "")


def test_a_t_or_gamma_ev_at_the_end_of_its_grid_is_flagged_and_not_read():
    seeds = {
        "cross_entropy": {
            "test/ece": [0.01] * 5,
            "posthoc/ts/T": [0.7, 0.1, 0.1, 0.4, 0.2],  # the grid's minimum in 2 of 5 runs
            "posthoc/focal_ts/gamma_ev": [5.0] * 5,  # focal TS's γ grid maximum, every seed
            "posthoc/focal_ts/T": [1.0] * 5,
            "test/adaece@focal_ts": [0.01] * 5,
            "test/adaece@ts_fgrid": [0.01] * 5,
        },
        "focal_g3": {"test/ece": [0.1] * 5, "posthoc/ts/T": [1.0, 1.1, 1.0, 1.1, 1.0]},
    }
    s = G.StudyData("mnist1d", "x", seeds, "", {})
    note = G.caveat(s, _claim("Mukhoti et al. 2020", "focal (γ=3) has lower ECE than CE before"))
    assert (
        "⚠ partner `cross_entropy`: its ts T is at the grid's minimum (0.1) in 2 of 5 runs" in note
    )
    assert "under-confident" not in note  # no conclusion from a bound
    kk = _claim("Komisarenko & Kull 2024", "focal TS beats TS (same grid, criterion) on `cross")
    assert "its focal_ts γ_ev is at the grid's maximum (5) in 5 of 5 runs" in G.caveat(s, kk)
    temps = "\n".join(G.render_temperatures([s]))
    assert "cross_entropy 0.30 (⚠ at the grid's minimum in 2 of 5 runs)" in temps
    assert "; ⚠ edge 5/5)" in "\n".join(G.render_arms(s))  # γ_ev in the focal TS column


# ------------------------------------------------------------------- page text (42.3, 6, 7)


def test_no_rendered_line_holds_a_template_brace():
    """Issue 42.3/6: the note rendered `{100 * FAMILY_ALPHA:g}` literally; no line may hold one."""
    text = PAGE.read_text()
    bad = [ln for ln in text.splitlines() if "{" in ln or "}" in ln]
    assert not bad, bad[:3]
    assert "Holding the family-wise error at 5 % (Holm)" in text


def test_the_rules_come_before_the_numbers_and_state_margins_and_power():
    text = PAGE.read_text()
    assert text.index("## Decision rules (fixed before the numbers)") < text.index("## Summary")
    rules = "\n".join(_section(text, "Decision rules (fixed before the numbers)"))
    for needle in ("±0.25 points", "±1 point", "Holm", "TOST", "power 1 − β = 80 %", "Welch"):
        assert needle in rules, needle
    assert "flip" not in text.lower() and "inconclusive" not in text  # no flip rule any more


def test_the_second_regime_lists_every_factor_it_changes_and_why_it_was_chosen():
    """Issue 42.6: five factors changed at once, chosen after seeing CE's calibration."""
    text = PAGE.read_text()
    (head,) = [ln for ln in text.splitlines() if ln.startswith("## A second regime")]
    body = "\n".join(_section(text, head[3:]))
    for needle in (
        "model `cnn1d` → `mlp` (hidden=512)",
        "weight decay 0.0005 → 0",
        "epochs 60 → 30",
        "validation share 0.1 → 0.25",
        "3,600 / 400 / 1,000 → 15,000 / 5,000 / 10,000",
        "chosen after seeing CE's calibration",
    ):
        assert needle in body, needle
    assert "larger scale: which verdicts change" not in text


def test_stale_text_is_gone():
    """Issue 42.7: epochs per study, the MLP in the OOD note, the Ghosh weight-decay quote,
    digits marked uninformative for small effects, the machine recorded."""
    text = PAGE.read_text()
    assert "trained 60 (mnist1d, digits) and 30 (mnist1d_large) epochs" in text
    assert "tiny CNNs trained 60 epochs" not in text
    ood = next(ln for ln in text.splitlines() if ln.startswith("**OOD rows.**"))
    assert "`mlp`" in ood
    assert "set to their default values in PyTorch" in text
    assert "digits is uninformative for small effects: its models make " in text
    made = next(ln for ln in text.splitlines() if ln.startswith("- Made with: "))
    assert "CPU capability" in made and "BLAS" in made


def test_the_page_records_the_platform_and_the_second_kernel_path_lowers_it():
    rec = G.platform_record()
    assert {"torch", "cpu_capability", "blas", "threads", "cpus", "cpu", "threadpools"} <= set(rec)
    assert rec["threads"] >= 1 and rec["blas"]
    env = {**__import__("os").environ, "ATEN_CPU_CAPABILITY": "default"}
    assert G.platform_record(env)["cpu_capability"] == "DEFAULT"
    assert G.second_kernel(rec["cpu_capability"]) in ("avx2", "default")


def test_the_page_can_be_re_rendered_from_its_csvs_without_training(tmp_path: Path):
    page = tmp_path / "results.md"
    page.write_text(PAGE.read_text())
    again = G.rerender(page, CSV, CSV2)
    timing, stamp, figures, reports = G.kept_from_page(PAGE.read_text())
    assert _section(again, "Summary") == _section(PAGE.read_text(), "Summary")
    assert f"- Measured wall time of the studies: {timing}. " in again
    digest = re.search(r"Code measured .*?: `[0-9a-f]{16}`\.", stamp).group(0)
    assert digest in again  # the run's digest stamp is kept, not the re-render's code
    page.write_text(again)  # a second re-render notes itself once, not twice
    assert G.rerender(page, CSV, CSV2).count("Page text re-rendered from") == 1
    assert set(reports) == {"results_mnist1d", "results_digits", "results_mnist1d_large"}
    assert figures
