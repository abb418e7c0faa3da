"""The MLflow UI of a finished study, in a real browser: Playwright driving Debian's chromium
(`/usr/bin/chromium`; Playwright's own browser download is not used) against `calibtune ui`.

Screenshots go to ``$CALIBTUNE_SCREENSHOTS`` when set (``CALIBTUNE_SCREENSHOTS=docs/img`` makes
the ones in README and docs/study.md). Skipped only where chromium is absent outside CI.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ROOT = Path(__file__).resolve().parents[1]
SHOTS = os.environ.get("CALIBTUNE_SCREENSHOTS")
TIMEOUT_MS = 60_000

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        not Path(CHROMIUM).exists() and not os.environ.get("CI"),
        reason=f"{CHROMIUM} absent (`.ci/run` installs Debian's chromium)",
    ),
]


def _shot(page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"))


@pytest.fixture(scope="module")
def study(tmp_path_factory, ray_session):
    from calibtune.study import load_study, run_study

    tmp = tmp_path_factory.mktemp("ui")
    raw = {
        "name": "uistudy",
        "trial": {
            "data": {"name": "digits"},
            "model": {"name": "mlp"},
            "optimizer": {"lr": 0.05},
            "train": {"epochs": 2, "batch_size": 64, "checkpoint_every": 1},
        },
        "losses": [{"name": "adafocal", "space": str(ROOT / "search_spaces" / "adafocal.yaml")}],
        "search": {
            "sampler": "random",
            "num_samples": 2,
            "max_concurrent": 2,
            "objectives": [{"metric": "val/ece", "mode": "min"}],
        },
        "tracking": {"uri": f"sqlite:///{tmp / 'mlflow.db'}", "experiment": "uistudy"},
        "storage": str(tmp / "studies"),
    }
    path = tmp / "uistudy.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    outcome = run_study(load_study(path), verbose=0)
    client = MlflowClient(outcome.tracking_uri)
    trials = client.search_runs(
        [outcome.experiment_id], f"tags.`mlflow.parentRunId` = '{outcome.parent_run_id}'"
    )
    assert len(trials) == 2
    return outcome, [t.info.run_id for t in trials]


@pytest.fixture(scope="module")
def ui(study) -> Iterator[str]:
    from calibtune.readers._ui import start_ui, stop_ui

    outcome, _ = study
    proc, url = start_ui(outcome.tracking_uri)
    try:
        yield url
    finally:
        stop_ui(proc)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 850})
    context.set_default_timeout(TIMEOUT_MS)
    pg = context.new_page()
    yield pg
    context.close()


def _training_page(page, url: str, path: str) -> None:
    """Open ``path`` in MLflow's "Model training" view (MLflow 3.17 keeps the GenAI/training
    choice per browser, defaulting to GenAI; the URL parameter sets it)."""
    page.goto(f"{url}/#/experiments/{path}?workflowType=machine_learning")


def _printed_url(proc: subprocess.Popen, pattern: str) -> str:
    """The first URL matching ``pattern`` that a serving `calibtune` command prints."""
    deadline = time.time() + 120
    assert proc.stdout is not None
    seen = []
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        if m := re.search(pattern, line):
            return m.group(0)
    raise AssertionError(f"no URL matching {pattern!r} (exit {proc.poll()}): {seen[-5:]}")


def _serve(*args: str) -> subprocess.Popen:
    calibtune = str(Path(sys.executable).parent / "calibtune")
    return subprocess.Popen(
        [calibtune, *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip


def _stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)


def test_experiment_opens_on_the_training_runs(study, page):
    """A fresh browser (no remembered GenAI/training choice) opening the experiment URL that
    `calibtune ui` prints lands on the runs table with the study's parent run."""
    outcome, _ = study
    proc = _serve("ui", "--tracking-uri", outcome.tracking_uri)
    try:
        url = _printed_url(proc, r"(?<=uistudy: )http://127\.0\.0\.1:\d+/\S+")
        assert url.endswith(
            f"#/experiments/{outcome.experiment_id}/runs?workflowType=machine_learning"
        )
        page.goto(url)
        page.get_by_text("Run Name").first.wait_for()
        page.locator('[col-id="attributes.`Run Name`"][role=gridcell]').filter(
            has_text="uistudy"
        ).wait_for()
        assert "/runs" in page.url and "workflowType=genai" not in page.url, page.url
    finally:
        _stop(proc)


def test_parent_run_expands_to_its_nested_trials(study, ui, page):
    outcome, _ = study
    _training_page(page, ui, f"{outcome.experiment_id}/runs")
    name_cells = page.locator('[col-id="attributes.`Run Name`"][role=gridcell]')
    parent = name_cells.filter(has_text="uistudy")
    parent.wait_for()
    assert name_cells.filter(has_text="adafocal").count() == 0  # collapsed
    parent.locator("button").first.click()
    name_cells.filter(has_text="adafocal").nth(1).wait_for()
    assert name_cells.filter(has_text="adafocal").count() == 2
    _shot(page, "mlflow-runs")


def test_trial_metric_page_shows_val_ece_per_epoch(study, ui, page):
    outcome, trials = study
    _training_page(page, ui, f"{outcome.experiment_id}/runs/{trials[0]}/model-metrics")
    page.get_by_placeholder("Search metric charts").fill("val/ece")
    # a chart per matching metric, its legend "<run name> (val/ece)"; x axis: Step (= epoch)
    page.get_by_text(re.compile(r"\(val/ece\)$")).first.wait_for()
    page.get_by_text("Step").first.wait_for()
    assert page.get_by_text(re.compile(r"\(adaptive/")).count() == 0  # filtered to val/ece
    _shot(page, "mlflow-metrics")


@pytest.mark.parametrize("figure", ["reliability.png", "gamma_dynamics.png"])
def test_trial_figures_render_in_the_artifact_view(study, ui, page, figure):
    outcome, trials = study
    _training_page(page, ui, f"{outcome.experiment_id}/runs/{trials[0]}/artifacts/figures/{figure}")
    page.get_by_text(f"figures/{figure}").first.wait_for()
    # the preview is an <img> of the artifact (its src a blob or artifact URL), loaded
    page.wait_for_function(
        "() => [...document.images].some(i => i.complete && i.naturalWidth >= 300)"
    )
    _shot(page, f"mlflow-{figure.removesuffix('.png')}")


_SCROLL = """() => { for (const e of document.querySelectorAll('*')) {
    const s = getComputedStyle(e).overflowY;
    if ((s === 'auto' || s === 'scroll') && e.scrollHeight > e.clientHeight + 10) {
        e.scrollTop += 300;
    }
} }"""


def _scroll_to_metric(page, name: str) -> bool:
    """The compare view's metric table is virtualised: scroll it until ``name`` is rendered."""
    for _ in range(120):
        if page.get_by_text(name, exact=True).count():
            return True
        page.evaluate(_SCROLL)
        page.wait_for_timeout(150)
    return False


def test_compare_view_shows_both_trials_params_and_metrics(study, ui, page):
    outcome, trials = study
    client = MlflowClient(outcome.tracking_uri)
    lams = [client.get_run(t).data.params["loss.lam"] for t in trials]
    runs = ",".join(f'"{t}"' for t in trials)
    page.goto(
        f'{ui}/#/compare-runs?runs=[{runs}]&experiments=["{outcome.experiment_id}"]'
        "&workflowType=machine_learning"
    )
    page.get_by_text("Comparing 2 Runs").first.wait_for()
    lam_row = page.get_by_text("loss.lam", exact=True).last
    lam_row.wait_for()
    body = page.inner_text("body")
    for lam in lams:
        assert lam in body, (lam, body[:2000])
    assert _scroll_to_metric(page, "val/ece"), "val/ece not in the compare view's metrics"
    lam_row.scroll_into_view_if_needed()
    _shot(page, "mlflow-compare")


def test_optuna_dashboard_loads_the_study(study, page):
    """`calibtune dashboard` serves optuna-dashboard (a React app: the study list renders after
    its API answers); the study's link leads to its page with the history of ``val/ece``."""
    outcome, _ = study
    proc = _serve("dashboard", str(outcome.storage))
    try:
        page.goto(_printed_url(proc, r"http://127\.0\.0\.1:\d+\S*"))
        link = page.locator('a[href*="/dashboard/studies/"]', has_text="uistudy")
        link.wait_for()
        link.click()
        page.wait_for_url(re.compile(r"/dashboard/studies/\d+$"))
        page.get_by_text(re.compile(r"^uistudy \(id=\d+\)$")).wait_for()
        page.get_by_text(re.compile(r"^Best Trial \(number=\d+\)$")).wait_for()
        page.get_by_text("val/ece", exact=True).first.wait_for()  # the history's axis title
        _shot(page, "optuna-dashboard")
    finally:
        _stop(proc)


def test_optuna_dashboard_draws_each_trials_learning_curve(study, page):
    """Each trial's per-epoch ``val/ece`` is an Optuna intermediate value (one per epoch, however
    often the driver recorded the trial): the dashboard's "Intermediate values" plot draws one
    line per trial, two epochs each."""
    from calibtune.readers._summary import load_optuna_study

    outcome, _ = study
    trials = load_optuna_study("uistudy", f"sqlite:///{outcome.storage / 'optuna.db'}").trials
    assert [len(t.intermediate_values) for t in trials] == [2, 2], trials
    proc = _serve("dashboard", str(outcome.storage))
    try:
        page.goto(_printed_url(proc, r"http://127\.0\.0\.1:\d+\S*"))
        page.locator('a[href*="/dashboard/studies/"]', has_text="uistudy").click()
        page.get_by_text("Intermediate values", exact=True).wait_for()
        lines = page.locator("#graph-intermediate-values .scatterlayer .trace")
        page.wait_for_function(
            "() => document.querySelectorAll("
            "'#graph-intermediate-values .scatterlayer .trace').length >= 2"
        )
        assert lines.count() == len(trials) == 2
        points = page.locator("#graph-intermediate-values .scatterlayer .trace .point")
        assert points.count() == 4  # two epochs per trial
        page.locator("#graph-intermediate-values").scroll_into_view_if_needed()
        _shot(page, "optuna-dashboard-curves")
    finally:
        _stop(proc)
