"""The results page (docs/results.md, `make results`): its verdict rule on hand-made numbers, and
every results study run at one epoch and one seed through real Ray Tune + MLflow (SQLite in tmp),
read back and rendered by the generator (`bench/results.py`), so the studies stay valid."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
STUDIES = sorted((ROOT / "studies" / "results").glob("*.yaml"))


def _generator():
    spec = importlib.util.spec_from_file_location("results_page", ROOT / "bench" / "results.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve their module by name
    spec.loader.exec_module(mod)
    return mod


G = _generator()


# ----------------------------------------------------------------------------- the verdict rule


def test_verdict_reproduces_when_the_gap_exceeds_two_standard_errors():
    # a = [1, 2, 3] (mean 2, sd 1), b = [5, 6, 7] (mean 6, sd 1): d = -4, se = sqrt(2/3) = 0.8165
    v = G.verdict([1, 2, 3], [5, 6, 7])
    assert v.verdict == "reproduces"
    assert v.d == pytest.approx(-4.0)
    assert v.se == pytest.approx(math.sqrt(2 / 3))
    assert v.n == 3


def test_verdict_does_not_when_the_opposite_holds_beyond_the_spread():
    assert G.verdict([5, 6, 7], [1, 2, 3]).verdict == "does not"


def test_verdict_inconclusive_inside_two_standard_errors():
    # d = -1, se = 0.8165: |d| < 2 se
    v = G.verdict([1, 2, 3], [2, 3, 4])
    assert v.verdict == "inconclusive"
    assert v.d == pytest.approx(-1.0)


def test_verdict_higher_is_better_flips_the_orientation():
    v = G.verdict([5, 6, 7], [1, 2, 3], higher_is_better=True)
    assert (v.verdict, v.d) == ("reproduces", pytest.approx(-4.0))


def test_verdict_paired_uses_the_spread_of_the_differences():
    # Seeds differ a lot, but a is below b by exactly 0.1 ± 0.01 on every seed.
    a, b = [1.0, 5.0, 9.0], [1.11, 5.10, 9.09]
    assert G.verdict(a, b).verdict == "inconclusive"  # unpaired: se ≈ 2.3
    v = G.verdict(a, b, paired=True)
    assert v.verdict == "reproduces"
    assert v.d == pytest.approx(-0.1)
    assert v.se == pytest.approx(0.01 / math.sqrt(3))


def test_verdict_p_values_are_welch_s_and_the_paired_t_test_s():
    from scipy import stats

    a, b = [0.10, 0.12, 0.15, 0.11, 0.13], [0.14, 0.19, 0.16, 0.22, 0.15]
    v = G.verdict(a, b)
    ref = stats.ttest_ind(a, b, equal_var=False)
    assert v.p == pytest.approx(ref.pvalue, rel=1e-9) and v.d / v.se == pytest.approx(ref.statistic)
    assert v.df == pytest.approx(ref.df, rel=1e-9) and v.verdict == "reproduces"
    v = G.verdict(a, b, paired=True)
    ref = stats.ttest_rel(a, b)
    assert (v.p, v.df) == (pytest.approx(ref.pvalue, rel=1e-9), 4)
    # higher is better flips d, not p
    assert G.verdict(b, a, higher_is_better=True).p == pytest.approx(G.verdict(a, b).p)


def test_a_gap_beyond_two_standard_errors_with_few_seeds_is_not_a_verdict():
    # issue 31.3: d/se = −2.45 passes the old 2·se rule, but with 3 seeds a side (Welch df = 4)
    # its two-sided p is 0.07
    a, b = [1.0, 2.0, 3.0], [3.0, 4.0, 5.0]
    v = G.verdict(a, b)
    assert v.d / v.se == pytest.approx(-2.449, abs=1e-3) and v.df == pytest.approx(4.0)
    assert v.p == pytest.approx(0.0705, abs=1e-3)
    assert v.verdict == "inconclusive"
    # paired with df = n − 1 = 2: the same differences at a constant offset are significant
    assert G.verdict(a, [3.01, 4.0, 4.99], paired=True).verdict == "reproduces"


def test_verdict_with_one_seed_or_no_data_is_inconclusive():
    assert G.verdict([0.1], [0.9]).verdict == "inconclusive"
    assert G.verdict([], []).verdict == "inconclusive"
    v = G.verdict([1.0, math.nan, 2.0], [3.0, 4.0, math.nan], paired=True)
    assert (v.n, v.verdict) == (1, "inconclusive")


def test_every_claim_names_arms_of_every_results_study():
    from calibtune.study import load_study

    for path in STUDIES:
        cfg = load_study(path)
        labels = {c.label for c in cfg.losses}
        dataset = cfg.base_config().data.name
        for c in G.claims(dataset):
            assert {c.better[0], c.worse[0]} <= labels, (path.name, c.claim)
            assert c.paper in G.PAPERS and c.paper in G.SCALE_NOTES


def test_summary_renders_hand_made_numbers_with_their_verdicts():
    from calibtune.study import load_study

    cfg = load_study(ROOT / "studies" / "results" / "mnist1d.yaml")
    seeds = {
        lab: {"test/ece": [0.05, 0.06, 0.07], "test/adaece": [0.05, 0.06, 0.07]}
        for lab in (c.label for c in cfg.losses)
    }
    seeds["focal_g3"]["test/ece"] = [0.01, 0.02, 0.03]  # focal clearly below CE
    seeds["dual_focal"]["test/ece"] = [0.09, 0.10, 0.11]  # dual focal clearly above focal
    s = G.StudyData("mnist1d", "x", seeds, "", {}, config=cfg)
    lines = "\n".join(G.render_summary([s]))
    row = next(r for r in lines.splitlines() if "focal (γ=3) has lower ECE than CE" in r)
    # Welch's t = −4/0.816 = −4.90 with df = 4: p = 0.0080
    assert (
        "2.00 ± 0.82 vs 6.00 ± 0.82" in row
        and "**reproduces** (d = -4.00 ± 0.82, p = 0.008)" in row
    )
    row = next(r for r in lines.splitlines() if "dual focal has lower ECE" in r)
    assert "**does not** (d = +8.00 ± 0.82, p = 0.00061)" in row  # t = 9.8, df = 4
    row = next(r for r in lines.splitlines() if "FLSD-53 has lower ECE than CE after TS" in r)
    assert "inconclusive (no data)" in row  # test/ece@ts not in the hand-made numbers


# ----------------------------------------------------------------------------- the studies


def _one_epoch_copy(path: Path, tmp: Path) -> Path:
    raw = yaml.safe_load(path.read_text())
    raw["trial"]["train"]["epochs"] = 1
    raw["trial"]["train"]["checkpoint_every"] = 1
    raw["trial"]["schedule"]["milestones"] = []
    raw["search"]["seeds"] = [1]
    if raw["trial"]["data"]["name"] == "mnist1d_large":  # its data and final fits cost the most:
        raw["losses"] = raw["losses"][:2]  # two arms show it runs; the others run on mnist1d
        raw["search"]["num_samples"] = 2
    raw["tracking"] = {"uri": f"sqlite:///{tmp / 'mlflow.db'}", "experiment": raw["name"]}
    raw["storage"] = str(tmp / "studies")
    out = tmp / path.name
    out.write_text(yaml.safe_dump(raw, sort_keys=False, allow_unicode=True))
    return out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_results_studies_run_at_one_epoch_and_render(tmp_path, ray_session):
    from calibtune.study import load_study, run_study

    assert [p.name for p in STUDIES] == ["digits.yaml", "mnist1d.yaml", "mnist1d_large.yaml"]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    studies = []
    for path in STUDIES:
        cfg = load_study(path)  # the shipped file validates as it is
        assert cfg.search.sampler == "grid" and len(cfg.search.seeds) >= 3
        assert cfg.search.num_samples == len(cfg.losses)
        copy = _one_epoch_copy(path, tmp_path)
        # explicit: run_study does not read the study's tracking.uri (it logs to ./mlflow.db)
        outcome = run_study(copy, tracking_uri=uri, verbose=0)
        assert outcome.counts.get("finished") == len(load_study(copy).losses), outcome.counts
        dataset = cfg.base_config().data.name
        studies.append(G.collect(dataset, copy, tmp_path / "studies", uri))
    figures = G.copy_figures(studies, tmp_path / "img")
    page = G.render_page(
        studies, figures, {"digits": 1.0, "mnist1d": 2.0, "mnist1d_large": 3.0}, "make results", ""
    )
    for s in studies:
        assert set(s.seeds) == {c.label for c in s.config.losses}
        for label, m in s.seeds.items():
            assert len(m["test/ece"]) == 1 and 0 <= m["test/ece"][0] <= 1, label
            assert 0 < m["posthoc/ts_fgrid/T"][0] <= 5.0  # focal TS's grid
        assert f"`calibtune report` ({s.name})" in page
    for c in G.claims("mnist1d"):
        assert c.claim in page
    assert "inconclusive" in page and "total 0.1 min" in page
    assert "## A larger scale: which verdicts change (mnist1d → mnist1d_large)" in page
    # the per-seed CSV holds every number the Summary is rendered from
    assert G.write_seeds_csv(studies, tmp_path / "seeds.csv") == sum(len(s.seeds) for s in studies)
    back = G.read_seeds_csv(tmp_path / "seeds.csv")
    assert G.render_summary(back) == G.render_summary(studies)
    assert G.render_multiplicity(back) == G.render_multiplicity(studies)
    assert any("gamma dynamics" in cap for cap in figures)
    for rel in figures.values():
        assert (tmp_path / "img" / Path(rel).name).stat().st_size < 150_000


def test_reading_names_the_partner_s_under_confidence_from_its_temperature():
    seeds = {
        "cross_entropy": {"posthoc/ts/T": [1.3, 1.4]},
        "focal_g3": {"posthoc/ts/T": [0.5, 0.6]},
        "flsd53": {"posthoc/ts/T": [0.5, 0.5]},
    }
    s = G.StudyData("mnist1d", "x", seeds, "", {})
    (line,) = G.reading("Mukhoti et al. 2020", [s])
    assert "CE T = 1.35, focal T = 0.55: CE is at most mildly over-confident" in line
    assert "not the paper's regime" in line
    (line,) = G.reading("Tao et al. 2023", [s])
    assert "under-confident here (T = 0.55)" in line
    seeds["cross_entropy"]["posthoc/ts/T"] = [1.6, 1.6]  # over-confident CE, focal still under
    (line,) = G.reading("Mukhoti et al. 2020", [s])
    assert "CE is over-confident here as in the paper, but focal loss overshoots" in line
    seeds["focal_g3"]["posthoc/ts/T"] = [1.1, 1.1]
    assert G.reading("Tao et al. 2023", [s]) == []
    (line,) = G.reading("Mukhoti et al. 2020", [s])
    assert line.endswith("the same direction as the paper's temperatures.")
