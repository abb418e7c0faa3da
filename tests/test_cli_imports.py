"""The CLI answers without importing what it does not need (issue 13, target 4): `--help` of every
subcommand touches no third-party library heavier than PyYAML, and compare/report/export read a
finished study without torch, torchvision or Ray. Each check runs the CLI in a fresh interpreter
and lists the heavy modules left in ``sys.modules`` (not a timed test: bench/bench_cli.py times
it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
#: never needed to parse arguments; torch/torchvision/Ray never needed to read a study back
PARSING_FORBIDDEN = ("torch", "torchvision", "ray", "mlflow", "optuna", "pandas", "numpy")
READING_FORBIDDEN = ("torch", "torchvision", "ray")

_PROBE = """
import json, sys
from calibtune.cli import main
for argv in json.loads(sys.argv[1]):
    try:
        rc = main(argv)
    except SystemExit as e:  # --help
        rc = e.code
    if rc:
        sys.exit(f"calibtune {argv}: exit {rc}")
print(json.dumps(sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)))
"""


def _heavy_after(argvs: list[list[str]], forbidden: tuple[str, ...], cwd: Path) -> list[str]:
    """The modules of ``forbidden`` imported after running each of ``argvs`` in one fresh
    interpreter (calibtune from this checkout)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(argvs), json.dumps(forbidden)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_help_of_every_subcommand_imports_nothing_heavy(tmp_path: Path) -> None:
    from calibtune.cli import SUBCOMMANDS
    from calibtune.study._cli import COMMANDS

    argvs = [["--help"]] + [[name, "--help"] for name in {**SUBCOMMANDS, **COMMANDS}]
    assert _heavy_after(argvs, PARSING_FORBIDDEN, tmp_path) == []


def _finished_study(root: Path) -> tuple[Path, str]:
    """A study written the way calibtune writes one (parent run with the versions it recorded,
    state file, study copy) with one finished trial holding metrics and its config.yaml."""
    from calibtune._provenance import installed_versions
    from calibtune.study import StudyDir, load_study
    from calibtune.study._studydir import StudyState
    from calibtune.study._tracking import ChildRun, _client, log_metrics, open_study_run

    study = {
        "name": "fast",
        "trial": {"data": {"name": "digits", "ood": []}, "model": {"name": "mlp"}},
        "losses": [{"name": "cross_entropy"}],
        "search": {"num_samples": 1, "objectives": [{"metric": "val/ece", "mode": "min"}]},
    }
    path = root / "fast.yaml"
    path.write_text(yaml.safe_dump(study))
    cfg = load_study(path)
    sd = StudyDir.at(cfg.name, root / "studies")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    versions = {f"version.{k}": v for k, v in installed_versions().items()}
    parent = open_study_run(uri, cfg.experiment, cfg.name, tags=versions)
    sd.write_state(StudyState(uri, parent.experiment_id, parent.run_id, str(path)))
    sd.write_study(cfg)
    child = ChildRun(uri, parent.experiment_id, parent.run_id, "t0001", "fast_t0001")
    run_id = child.open({"loss": "cross_entropy", "loss_label": "cross_entropy"}, {})
    metrics = {"val/ece": 0.05, "test/error": 0.1, "test/ece": 0.06, "test/ece@ts": 0.02}
    log_metrics(uri, run_id, {**metrics, "posthoc/ts/T": 1.5})
    _client(uri).log_text(run_id, yaml.safe_dump({"name": "t", **study["trial"]}), "config.yaml")
    child.close("finished")
    return sd.path, run_id


@pytest.mark.timeout(300)
def test_compare_report_export_read_a_study_without_torch_or_ray(tmp_path: Path) -> None:
    study, _ = _finished_study(tmp_path)
    out = tmp_path / "exported"
    argvs = [
        ["compare", str(study)],
        ["report", str(study), "--out", str(tmp_path / "report.md")],
        ["export", str(study), "--out", str(out)],
    ]
    assert _heavy_after(argvs, READING_FORBIDDEN, tmp_path) == []
    # they did their work: the report names the trial, the export is the trial's config
    assert "t0001" in (tmp_path / "report.md").read_text()
    exported = yaml.safe_load((out / "fast-cross_entropy-top1.yaml").read_text())
    assert exported["model"] == {"name": "mlp"}


def test_read_head_takes_name_and_objectives_without_validating_the_rest(tmp_path: Path) -> None:
    from calibtune.study._config import StudyError
    from calibtune.study._studydir import STUDY_COPY, StudyDir

    sd = StudyDir.at("fast", tmp_path)
    sd.path.mkdir(parents=True)
    copy = sd.path / STUDY_COPY
    objectives = ["val/ece", {"metric": "val/nll", "mode": "max"}]
    trial = {"model": {"name": "no_such_model"}}  # read_study() refuses this; read_head() skips it
    copy.write_text(
        yaml.safe_dump({"name": "fast", "trial": trial, "search": {"objectives": objectives}})
    )
    name, objs, _ = sd.read_head()
    assert name == "fast"
    assert [(o.metric, o.mode) for o in objs] == [("val/ece", "min"), ("val/nll", "max")]
    with pytest.raises(StudyError, match="no_such_model"):
        sd.read_study()
    copy.write_text(yaml.safe_dump({"name": "fast", "search": {"objectives": ["test/ece"]}}))
    with pytest.raises(StudyError, match=r"objectives\[0\]\.metric: expected a validation metric"):
        sd.read_head()
