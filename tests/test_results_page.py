"""The committed results page (docs/results.md) against the code and numbers it claims: it is not
older than the code it measures (issue 22.5), its Summary is what the committed per-seed CSV
gives, and the Summary's caveats and multiplicity note follow their rules on hand-made numbers."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from tests.test_results_studies import ROOT, G

PAGE = ROOT / "docs" / "results.md"
CSV = ROOT / "docs" / "results_seeds.csv"


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


def test_the_summary_is_what_the_committed_per_seed_numbers_give():
    studies = G.page_studies(CSV)
    assert [s.dataset for s in studies] == ["mnist1d", "digits", "mnist1d_large"]
    for s in studies:
        seeds = {len(v) for m in s.seeds.values() for v in m.values()}
        assert seeds == {5}, (s.dataset, seeds)
    summary = _section(PAGE.read_text(), "Summary")
    expected = [*G.render_summary(studies), "", *G.render_counts(studies), ""]
    expected += [*G.render_multiplicity(studies), "", G.OOD_NOTE]
    assert summary == expected


def test_every_summary_number_is_traceable_to_a_seed_row():
    """Each 'mean ± std' cell of the Summary is recomputed from the CSV's rows."""
    import pandas as pd

    frame = pd.read_csv(CSV)
    assert {"dataset", "study", "loss_label", "seed", "trial"} <= set(frame.columns)
    assert all(t.endswith(f"seed{s}") for t, s in zip(frame["trial"], frame["seed"], strict=True))
    row = frame[(frame.dataset == "mnist1d") & (frame.loss_label == "cross_entropy")]
    ece = 100 * row["test/ece"].to_numpy()
    cell = f"{ece.mean():.2f} ± {ece.std():.2f}"
    lines = PAGE.read_text().splitlines()
    line = next(r for r in lines if "FLSD-53 has lower ECE than CE before" in r)
    assert f"vs {cell}" in line


def test_seed_csv_round_trips_exactly(tmp_path: Path):
    x = 0.1 + 0.2  # not representable in few digits
    seeds = {"a": {"test/ece": [x, math.nan, 1 / 3]}, "b": {"test/ece": [0.5, 0.25, 1e-17]}}
    dirs = {k: [tmp_path / f"t{k}-seed{i}" / "artifacts" for i in (1, 2, 3)] for k in seeds}
    s = G.StudyData("mnist1d", "results_mnist1d", seeds, "", dirs)
    assert G.write_seeds_csv([s], tmp_path / "s.csv") == 6
    (back,) = G.read_seeds_csv(tmp_path / "s.csv")
    assert back.dataset == "mnist1d" and back.name == "results_mnist1d"
    assert back.seeds["b"] == seeds["b"]
    assert back.seeds["a"]["test/ece"][0] == x and math.isnan(back.seeds["a"]["test/ece"][1])


def _claim(paper: str, text: str) -> G.Claim:
    return next(c for c in G.claims("mnist1d") if c.paper == paper and c.claim.startswith(text))


@pytest.mark.parametrize(
    ("t", "ece", "expected"),
    [
        ([0.5, 0.6], [0.02, 0.02], "miscalibrated here (TS sharpened it (T = 0.55 < 1))"),
        ([1.2, 1.4], [0.08, 0.10], "miscalibrated here (its ECE is 9.0 % > 5 %)"),
        (
            [0.9, 0.9],
            [0.06, 0.06],
            "miscalibrated here (TS sharpened it (T = 0.90 < 1) and its ECE is 6.0 % > 5 %)",
        ),
        ([1.0, 1.2], [0.05, 0.01], None),
    ],
)
def test_a_verdict_resting_on_a_miscalibrated_partner_says_so_in_its_summary_row(t, ece, expected):
    claim = _claim("Tao et al. 2023", "dual focal has lower ECE")
    seeds = {
        "dual_focal": {"test/ece": [0.01, 0.012], "posthoc/ts/T": [1.0, 1.0]},
        "focal_g3": {"test/ece": ece, "posthoc/ts/T": t},
    }
    s = G.StudyData("mnist1d", "x", seeds, "", {})
    note = G.caveat(s, claim)
    if expected is None:
        assert note == ""
    else:
        assert note == f"⚠ partner `focal_g3`: {expected}"
        row = next(r for r in G.render_summary([s]) if claim.claim in r)
        assert row.rstrip(" |").endswith(note)
    paired = _claim("Komisarenko & Kull 2024", "focal TS beats TS")
    assert G.caveat(s, paired) == ""  # same models on both sides, no T at an edge


def test_a_miscalibrated_claimed_better_arm_is_flagged_too():
    # issue 31.4: mnist1d "focal has lower ECE than CE": focal_g3 itself at T = 0.5, ECE 9.6 %
    claim = _claim("Mukhoti et al. 2020", "focal (γ=3) has lower ECE than CE before")
    seeds = {
        "focal_g3": {"test/ece": [0.095, 0.097], "posthoc/ts/T": [0.5, 0.5]},
        "cross_entropy": {"test/ece": [0.02, 0.023], "posthoc/ts/T": [1.2, 1.3]},
    }
    s = G.StudyData("mnist1d", "x", seeds, "", {})
    assert G.caveat(s, claim) == (
        "⚠ claimed-better arm `focal_g3`: miscalibrated here (TS sharpened it (T = 0.50 < 1) "
        "and its ECE is 9.6 % > 5 %)"
    )
    row = next(r for r in G.render_summary([s]) if claim.claim in r)
    assert "⚠ claimed-better arm `focal_g3`" in row


def _both_sides(**extra: list[float]) -> G.StudyData:
    """Every claim's arms with 5 seeds: dual focal far below a miscalibrated focal γ=3."""
    claims = G.claims("mnist1d")
    labels = {lab for c in claims for lab in (c.better[0], c.worse[0])}
    seeds = {lab: {} for lab in labels}
    seeds["focal_g3"] = {"test/ece": [0.10, 0.101, 0.102, 0.103, 0.104]}
    seeds["focal_g3"]["posthoc/ts/T"] = [0.5, 0.5, 0.6, 0.5, 0.5]
    seeds["dual_focal"] = {"test/ece": [0.010, 0.011, 0.012, 0.013, 0.014]}
    seeds["dual_focal"]["posthoc/ts/T"] = [1.0, 1.1, 1.0, 1.1, 1.0]
    for k, v in extra.items():
        seeds["cross_entropy"][k.replace("__", "/")] = v
    return G.StudyData("mnist1d", "x", seeds, "", {})


def test_tallies_and_the_bonferroni_list_carry_the_caveat():
    s = _both_sides()
    counts = G.render_counts([s])
    assert "- Tao et al. 2023: mnist1d 1 / 0 / 1 (⚠ 1 / 0 / 1)" in counts  # AdaECE: no data
    (line,) = G.render_multiplicity([s])
    assert "keeps 1 of them: mnist1d: dual focal has lower ECE than focal (reproduces, p = " in line
    assert line.endswith("; ⚠ `focal_g3`).")


def test_the_larger_scale_section_lists_the_verdicts_and_caveats_that_change():
    """Issue 31.6: the same claims on mnist1d and mnist1d_large side by side; a verdict that
    changes is listed, and so is a ⚠ that goes away (here: focal γ=3 no longer
    under-confident)."""
    small = _both_sides()
    large = _both_sides()
    large.dataset = "mnist1d_large"
    large.seeds["focal_g3"] = {
        "test/ece": [0.020, 0.021, 0.022, 0.023, 0.024],  # now above dual focal's ECE
        "posthoc/ts/T": [1.1, 1.2, 1.1, 1.2, 1.1],
    }
    lines = G.render_scale([small, large])
    assert lines[0] == "## A larger scale: which verdicts change (mnist1d → mnist1d_large)"
    row = next(r for r in lines if "| dual focal has lower ECE than focal |" in r)
    assert row.endswith("| reproduces (⚠ `focal_g3`) | reproduces | ⚠ gone |")
    (tally,) = [r for r in lines if "verdicts change;" in r]
    listed = lines[lines.index(tally) + 1 :]
    assert tally.startswith("0 of ") and f"; {len(listed)} more change only their ⚠:" in tally
    assert any(
        r.startswith("- Tao et al. 2023: dual focal has lower ECE than focal (") for r in listed
    )
    assert not any("AdaFocal" in r for r in listed)  # no data on either side: unchanged
    large.seeds["dual_focal"]["test/ece"] = [0.030, 0.031, 0.032, 0.033, 0.034]  # now worse
    lines = G.render_scale([small, large])
    row = next(r for r in lines if "| dual focal has lower ECE than focal |" in r)
    assert row.endswith("| reproduces (⚠ `focal_g3`) | does not | verdict, ⚠ gone |")
    (tally,) = [r for r in lines if "verdicts change;" in r]
    assert re.match(r"1 of \d+ verdicts change; \d+ more change only their ⚠:", tally)
    assert "CE no data; focal γ=3 T = 1.14, ECE 2.20 % (the paper" in lines[2]
    assert G.render_scale([small]) == []  # one side missing: no section


def test_a_temperature_at_the_end_of_its_grid_is_flagged_and_not_read():
    # issue 31.5: digits CE with T = 0.1 (the grid's minimum) in 2 of 5 seeds
    s = _both_sides(
        posthoc__ts__T=[0.7, 0.1, 0.1, 0.4, 0.2], test__ece=[0.01, 0.011, 0.009, 0.01, 0.012]
    )
    claim = _claim("Mukhoti et al. 2020", "focal (γ=3) has lower ECE than CE before")
    note = G.caveat(s, claim)
    assert (
        "⚠ partner `cross_entropy`: its ts T is at the grid's minimum (0.1) in 2 of 5 seeds" in note
    )
    assert "TS sharpened it (T = 0.30" not in note  # no conclusion from a bound
    temps = "\n".join(G.render_temperatures([s]))
    assert "cross_entropy 0.30 (⚠ at the grid's minimum in 2 of 5 seeds)" in temps
    (reading,) = G.reading("Mukhoti et al. 2020", [s])
    assert "at an end of its grid for `cross_entropy` in 2 of 5 seeds" in reading
    assert "no reading of these arms' confidence is drawn from T" in reading
    s.seeds["cross_entropy"]["posthoc/ts/T"] = [10.0, 9.9, 9.8, 9.7, 9.6]
    assert "grid's maximum (10) in 1 of 5 seeds" in G.caveat(s, claim)
    assert "(9.80; ⚠ edge 1/5)" in "\n".join(G.render_arms(s))


def test_a_verdict_that_flips_between_kernel_paths_is_inconclusive():
    s, other = _both_sides(), _both_sides()
    claim = "dual focal has lower ECE than focal"
    assert {c.claim: v.verdict for c, _, v in G.claim_rows(s)}[claim] == "reproduces"
    other.seeds["dual_focal"]["test/ece"] = [0.20, 0.21, 0.22, 0.23, 0.24]  # the opposite
    s.alt, other.kernel = other, "ATEN_CPU_CAPABILITY=avx2"
    v = {c.claim: v for c, _, v in G.claim_rows(s)}[claim]
    assert v.verdict == "inconclusive"
    assert v.flip == "reproduces here, does not under ATEN_CPU_CAPABILITY=avx2"
    row = next(r for r in G.render_summary([s]) if claim in r)
    assert "**inconclusive** (d = -9.00 ± 0.10, p = " in row and "flips between kernel paths" in row


def test_the_page_records_the_platform_and_the_second_kernel_path_lowers_it():
    rec = G.platform_record()
    assert {"torch", "cpu_capability", "blas", "threads", "cpus"} <= set(rec)
    assert rec["threads"] >= 1 and rec["blas"]
    env = {**__import__("os").environ, "ATEN_CPU_CAPABILITY": "default"}
    assert G.platform_record(env)["cpu_capability"] == "DEFAULT"
    assert G.second_kernel(rec["cpu_capability"]) in ("avx2", "default")
    text = PAGE.read_text()
    assert "- Made with: " in text and "CPU capability" in text and "BLAS" in text
    assert "- Reproducibility: " in text and "inconclusive" in text


def test_the_page_can_be_re_rendered_from_its_csv_without_training(tmp_path: Path):
    page = tmp_path / "results.md"
    page.write_text(PAGE.read_text())
    again = G.rerender(page, CSV, G.SEEDS_CSV_ALT)
    timing, _, figures, reports = G.kept_from_page(PAGE.read_text())
    assert (
        again.split("\n## Summary\n")[1].split("\n## ")[0]
        == (PAGE.read_text().split("\n## Summary\n")[1].split("\n## ")[0])
    )
    assert f"- Measured wall time of the studies: {timing}. " in again
    page.write_text(again)  # a second re-render notes itself once, not twice
    assert G.rerender(page, CSV, G.SEEDS_CSV_ALT).count("Page text re-rendered from") == 1
    assert set(reports) == {"results_mnist1d", "results_digits", "results_mnist1d_large"}
    assert figures


def test_summary_counts_recomputed_from_the_csv_with_scipy_t_tests():
    """Independent of `verdict`: each claim's verdict from scipy's Welch / paired t test on the
    CSV's columns, tallied per paper, must be the page's "In short" counts and its Bonferroni
    count (issue 31.3)."""
    import pandas as pd
    from scipy import stats

    frame = pd.read_csv(CSV)
    text = PAGE.read_text()
    alt = G.page_studies(CSV)[0].alt is not None
    ps = []
    for dataset in ("mnist1d", "digits", "mnist1d_large"):
        part = frame[frame.dataset == dataset]
        tally: dict[str, list[int]] = {p: [0, 0, 0] for p in G.PAPERS}
        for c in G.claims(dataset):
            a, b = (
                part[part.loss_label == lab].sort_values("seed")[key].to_numpy()
                for lab, key in (c.better, c.worse)
            )
            r = stats.ttest_rel(a, b) if c.paired else stats.ttest_ind(a, b, equal_var=False)
            d = (b.mean() - a.mean()) if c.higher_is_better else (a.mean() - b.mean())
            call = 2 if r.pvalue >= 0.05 else 0 if d < 0 else 1
            tally[c.paper][call] += 1
            ps.append((r.pvalue, call))
        for paper, (n0, n1, n2) in tally.items():
            if not alt:  # a second kernel path may turn verdicts inconclusive
                assert re.search(rf"- {re.escape(paper)}: .*{dataset} {n0} / {n1} / {n2} \(", text)
    survive = sum(p < 0.05 / len(ps) and call != 2 for p, call in ps)
    assert f"Bonferroni, p < 5 %/{len(ps)} = {0.05 / len(ps):.2g}) keeps {survive} of them" in text
