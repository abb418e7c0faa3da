"""The results page (docs/results.md, `make results`): its verdict rule on hand-made numbers, and
every results study run at one epoch and one seed through real Ray Tune + MLflow (SQLite in tmp),
read back and rendered by the generator (`bench/results.py`), so the studies stay valid."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
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


# ----------------------------------------------------------------------------- the statistics


def _study(seeds: dict, alt: dict | None = None) -> G.StudyData:
    s = G.StudyData("mnist1d", "x", seeds, "", {})
    if alt is not None:
        s.alt = G.StudyData("mnist1d", "x", alt, "", {})
    return s


_TAO = next(c for c in G.claims("mnist1d") if c.claim == "dual focal has lower ECE than focal")


def test_the_seed_is_a_block_the_effect_is_the_mean_paired_difference_with_its_t_interval():
    from scipy import stats

    # seeds differ a lot, dual focal is below focal by 0.1 points ± a little on every seed
    a, b = [0.010, 0.050, 0.090], [0.0111, 0.0510, 0.0909]
    e = G.effect(_study({"dual_focal": {"test/ece": a}, "focal_g3": {"test/ece": b}}), _TAO)
    ref = stats.ttest_rel(a, b)
    assert e.d == pytest.approx(-0.001) and e.n == 3 and e.runs == 1
    assert e.p == pytest.approx(ref.pvalue, rel=1e-9)
    ci = ref.confidence_interval(0.95)
    assert (e.lo, e.hi) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert e.p_welch == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue)
    assert e.p < 0.05 < e.p_welch  # the block removes the seed-to-seed spread


def test_the_two_kernel_paths_are_averaged_within_each_seed_before_pairing():
    one = {
        "dual_focal": {"test/ece": [0.01, 0.02, 0.03]},
        "focal_g3": {"test/ece": [0.02, 0.02, 0.05]},
    }
    two = {
        "dual_focal": {"test/ece": [0.03, 0.02, 0.01]},
        "focal_g3": {"test/ece": [0.02, 0.04, 0.03]},
    }
    e = G.effect(_study(one, two), _TAO)
    d = np.mean([one["dual_focal"]["test/ece"], two["dual_focal"]["test/ece"]], 0) - np.mean(
        [one["focal_g3"]["test/ece"], two["focal_g3"]["test/ece"]], 0
    )
    assert e.runs == 2 and e.n == 3
    assert e.d == pytest.approx(d.mean()) and e.sd == pytest.approx(d.std(ddof=1))


def test_seeds_are_matched_by_number_not_by_position():
    s = _study({"dual_focal": {"test/ece": [0.01, 0.02]}, "focal_g3": {"test/ece": [0.05, 0.03]}})
    s.seed_ids = {"dual_focal": [1, 2], "focal_g3": [2, 1]}  # focal's rows in the other order
    assert G.effect(s, _TAO).d == pytest.approx(((0.01 - 0.03) + (0.02 - 0.05)) / 2)


def test_holm_matches_a_hand_derived_example():
    # p = (0.01, 0.04, 0.03, 0.005), m = 4: sorted 0.005·4 = 0.02, 0.01·3 = 0.03,
    # 0.03·2 = 0.06, 0.04·1 = 0.04 → monotone 0.06
    assert G.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert G.holm([0.5, math.nan]) == [0.5, math.nan] or math.isnan(G.holm([0.5, math.nan])[1])


def test_tost_is_the_larger_of_two_one_sided_t_tests():
    from scipy import stats

    d = np.array([0.1, -0.05, 0.02, 0.07, -0.01])
    lo = stats.ttest_1samp(d, -0.25, alternative="greater").pvalue
    hi = stats.ttest_1samp(d, 0.25, alternative="less").pvalue
    se = d.std(ddof=1) / math.sqrt(5)
    assert G.tost_p(d.mean(), se, 4, 0.25) == pytest.approx(max(lo, hi), rel=1e-9)


def test_seeds_needed_grows_with_the_spread_and_the_family():
    assert G.seeds_needed(1.0, 1.0) == 10  # t form of ((1.96 + 0.84)·1/1)² = 7.8
    assert G.seeds_needed(2.0, 1.0) > G.seeds_needed(1.0, 1.0)
    assert G.seeds_needed(1.0, 1.0, m=51) > G.seeds_needed(1.0, 1.0)


@pytest.mark.parametrize(
    ("d", "p_holm", "p_tost", "p_paper", "paper", "label"),
    [
        (-0.01, 0.01, 1.0, 1.0, -1.0, "reproduces"),
        (0.01, 0.01, 1.0, 0.001, -1.0, "opposite"),
        (0.0001, 0.5, 0.01, 0.001, -1.0, "equivalent"),
        (-0.002, 0.5, 0.2, 0.01, -1.0, "smaller than the paper's"),
        (-0.02, 0.5, 0.2, 0.01, -1.0, "underpowered"),  # beyond the paper's effect: not smaller
        (-0.002, 0.5, 0.2, math.nan, None, "underpowered"),
        (-0.002, 0.049, 1.0, 1.0, None, "reproduces"),
    ],
)
def test_labels_follow_the_rules_in_their_order(d, p_holm, p_tost, p_paper, paper, label):
    e = G.Effect(d, 0.001, 5, 2, d - 0.001, d + 0.001, 0.0, 0.0, 0.0, math.nan, 0.0025)
    assert G.label_of(e, p_holm, p_tost, p_paper, paper) == label


def test_a_raw_p_below_alpha_is_not_a_label_after_holm():
    """Issue 42.3: labels and tallies are Holm-adjusted, not α = 0.05 per test: two claims
    with raw p ≈ 0.029 each (t = −3.32, df 4) become 0.058 after Holm — neither reproduces
    (the old rule called both)."""
    focal = [0.05, 0.06, 0.07, 0.08, 0.09]
    shift = np.array([-0.003, -0.006, -0.003, -0.0045, 0.0])  # −0.33 points on average
    dual = list(np.array(focal) + shift)
    s = _study(
        {
            "dual_focal": {"test/ece": dual, "test/adaece": dual},
            "focal_g3": {"test/ece": focal, "test/adaece": focal},
        }
    )
    v = G.evaluate([s])
    v1, v2 = [x for x in v.values() if not math.isnan(x.effect.p)]
    assert v1.effect.p == pytest.approx(0.0292, abs=1e-3) and v1.p_holm == pytest.approx(
        2 * v1.effect.p
    )
    assert v1.p_holm > 0.05 and "reproduces" not in {v1.label, v2.label}


def test_every_claim_names_arms_of_every_results_study():
    from calibtune.study import load_study

    for path in STUDIES:
        cfg = load_study(path)
        labels = {c.label for c in cfg.losses}
        dataset = cfg.base_config().data.name
        for c in G.claims(dataset):
            assert {c.better[0], c.worse[0]} <= labels, (path.name, c.claim)
            assert c.paper in G.PAPERS and c.paper in G.scale_notes([])


def test_summary_renders_hand_made_numbers_with_their_effects_and_labels():
    from calibtune.study import load_study

    cfg = load_study(ROOT / "studies" / "results" / "mnist1d.yaml")
    seeds = {
        lab: {"test/ece": [0.05, 0.06, 0.07], "test/adaece": [0.05, 0.06, 0.07]}
        for lab in (c.label for c in cfg.losses)
    }
    seeds["focal_g3"]["test/ece"] = [0.01, 0.0202, 0.03]  # focal 4 points below CE, each seed
    seeds["dual_focal"]["test/ece"] = [0.09, 0.10, 0.1101]  # dual focal 8 points above focal
    s = G.StudyData("mnist1d", "x", seeds, "", {}, config=cfg)
    lines = G.render_summary([s])
    row = next(r for r in lines if "focal (γ=3) has lower ECE than CE before" in r)
    assert "| -2.87 |" in row and "d = -3.99 [-4.02, -3.96] (2.01 ± 1.00 vs 6.00 ± 1.00)" in row
    assert "**reproduces** (Holm p = " in row and "Welch p = " in row
    row = next(r for r in lines if "dual focal has lower ECE" in r)
    assert "**opposite**" in row and "d = +8.00 [" in row
    row = next(r for r in lines if "FLSD-53 has lower ECE than CE after TS" in r)
    assert "| no data | no data |" in row  # test/ece@ts not in the hand-made numbers


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


# `long`: `make results` runs these studies in full and renders the page from them; the rendering
# from hand-made numbers stays in `make test` (test_summary_renders_hand_made_numbers_...)
@pytest.mark.slow
@pytest.mark.long
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
    assert "underpowered" in page and "total 0.1 min" in page
    assert "## A second regime, not a larger scale: mnist1d_large beside mnist1d" in page
    assert "{" not in page
    # the per-seed CSV holds every number the Summary is rendered from
    assert G.write_seeds_csv(studies, tmp_path / "seeds.csv") == sum(len(s.seeds) for s in studies)
    back = G.read_seeds_csv(tmp_path / "seeds.csv")
    assert G.render_summary(back) == G.render_summary(studies)
    assert G.render_multiplicity(back) == G.render_multiplicity(studies)
    assert any("gamma dynamics" in cap for cap in figures)
    for rel in figures.values():
        assert (tmp_path / "img" / Path(rel).name).stat().st_size < 150_000


def test_reading_names_the_partner_s_under_confidence_from_its_temperature_ci():
    seeds = {
        "cross_entropy": {"posthoc/ts/T": [1.3, 1.4, 1.2]},
        "focal_g3": {"posthoc/ts/T": [0.5, 0.6, 0.55]},
        "flsd53": {"posthoc/ts/T": [0.5, 0.5, 0.5]},
    }
    s = G.StudyData("mnist1d", "x", seeds, "", {})
    (line,) = G.reading("Mukhoti et al. 2020", [s])
    assert "CE T = 1.30 [1.05, 1.55], focal T = 0.55 [0.43, 0.67]: CE is over-confident" in line
    (line,) = G.reading("Tao et al. 2023", [s])
    assert "under-confident here (T = 0.55 [0.43, 0.67])" in line
    seeds["cross_entropy"]["posthoc/ts/T"] = [0.8, 1.6, 1.2]  # CI holds 1: not called either way
    (line,) = G.reading("Mukhoti et al. 2020", [s])
    assert "CE is calibrated within the seed spread here, and focal loss overshoots" in line
    seeds["focal_g3"]["posthoc/ts/T"] = [1.1, 1.1, 1.1]
    assert G.reading("Tao et al. 2023", [s]) == []
    (line,) = G.reading("Mukhoti et al. 2020", [s])
    assert line.endswith("the same direction as the paper's temperatures.")
