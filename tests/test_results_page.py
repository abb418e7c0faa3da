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
    studies = G.read_seeds_csv(CSV)
    assert [s.dataset for s in studies] == ["mnist1d", "digits"]
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
        ([0.5, 0.6], [0.02, 0.02], "TS sharpened it (T = 0.55 < 1)"),
        ([1.2, 1.4], [0.08, 0.10], "its ECE is 9.0 % > 5 %"),
        ([0.9, 0.9], [0.06, 0.06], "TS sharpened it (T = 0.90 < 1) and its ECE is 6.0 % > 5 %"),
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
    note = G.partner_caveat(s, claim)
    if expected is None:
        assert note == ""
    else:
        assert note == f"⚠ partner `focal_g3` is miscalibrated here: {expected}"
        row = next(r for r in G.render_summary([s]) if claim.claim in r)
        assert row.rstrip(" |").endswith(note)
    paired = _claim("Komisarenko & Kull 2024", "focal TS beats TS")
    assert G.partner_caveat(s, paired) == ""  # same models on both sides: no partner


def test_multiplicity_note_counts_the_tests_and_the_bonferroni_survivors():
    claims = G.claims("mnist1d")
    labels = {lab for c in claims for lab in (c.better[0], c.worse[0])}
    seeds = {lab: {} for lab in labels}
    # two claims tested (the others have no numbers): one far beyond any threshold, one beyond
    # 2·se (d/se = 2.15) but inside Bonferroni's 2.24 for two tests
    seeds["focal_g3"]["test/ece"] = [0.010, 0.011, 0.012, 0.013, 0.014]
    seeds["cross_entropy"]["test/ece"] = [0.100, 0.101, 0.102, 0.103, 0.104]
    seeds["dual_focal"]["test/ece"] = [0.0046, 0.0066, 0.0086, 0.0106, 0.0126]
    s = G.StudyData("mnist1d", "x", seeds, "", {})
    verdicts = {c.claim: v.verdict for c, _, v in G.claim_rows(s)}
    assert verdicts["dual focal has lower ECE than focal"] == "reproduces"
    (line,) = G.render_multiplicity([s])
    assert "makes 2 tests at 2·se" in line
    assert "of the 2 tests would still give a verdict (2 did)" in line
    assert f"|d| > {G.bonferroni_z(2):.2f}·se) keeps 1 of them: " in line
    assert line.endswith("mnist1d: focal (γ=3) has lower ECE than CE before TS (reproduces).")
