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

    argvs = [["--help"]] + [[name, "--help"] for name in SUBCOMMANDS]
    argvs += [["data", action, "--help"] for action in ("fetch", "verify")]
    assert _heavy_after(argvs, PARSING_FORBIDDEN, tmp_path) == []


def _finished_study(root: Path, config: bool = True) -> tuple[Path, str]:
    """A study written the way calibtune writes one (parent run with the versions it recorded,
    state file, study copy) with one finished trial holding metrics and its config.yaml (unless
    not ``config``) and one failed trial that logged ``val/nll`` before it failed."""
    from calibtune._provenance import installed_versions
    from calibtune.record._tracking import (
        TAG_T_GRID_ENDS,
        ChildRun,
        _client,
        log_metrics,
        open_study_run,
    )
    from calibtune.study import StudyDir, load_study
    from calibtune.studyfile._studydir import StudyState

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
    versions[TAG_T_GRID_ENDS] = '{"ts": [0.1, 10.0]}'  # as a study records it when it starts
    parent = open_study_run(uri, cfg.experiment, cfg.name, tags=versions)
    sd.write_state(StudyState(uri, parent.experiment_id, parent.run_id, str(path)))
    sd.write_study(cfg)
    child = ChildRun(uri, parent.experiment_id, parent.run_id, "t0001", "fast_t0001")
    run_id = child.open({"loss": "cross_entropy", "loss_label": "cross_entropy"}, {})
    metrics = {"val/ece": 0.05, "test/error": 0.1, "test/ece": 0.06, "test/ece@ts": 0.02}
    log_metrics(uri, run_id, {**metrics, "posthoc/ts/T": 1.5})
    if config:
        trial = yaml.safe_dump({"name": "t", **study["trial"]})
        _client(uri).log_text(run_id, trial, "config.yaml")
    child.close("finished")
    failed = ChildRun(uri, parent.experiment_id, parent.run_id, "t0002", "fast_t0002")
    log_metrics(
        uri,
        failed.open({"loss": "cross_entropy", "loss_label": "cross_entropy"}, {}),
        {"val/nll": 0.3},
    )
    failed.fail("diverged")
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
    from calibtune.studyfile._config import StudyError
    from calibtune.studyfile._studydir import STUDY_COPY, StudyDir

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


def test_gc_paused_pauses_the_collector_and_freezes_what_the_block_left() -> None:
    import gc

    from calibtune._lazy import gc_paused

    before = gc.get_freeze_count()
    try:
        with gc_paused():
            assert not gc.isenabled()
            kept = [[i] for i in range(1000)]  # tracked containers made inside the block
        assert gc.isenabled()
        assert gc.get_freeze_count() >= before + len(kept)
        gc.disable()  # a caller that had it off gets it back off
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()


_SEEN: dict[str, bool] = {}


def _collector_probe(args) -> bool:
    """A handler (named ``"module:function"`` in the table) recording whether the cyclic
    collector was on while it ran; returns False (exit code 0) the first time per command."""
    import gc

    return bool(_SEEN.setdefault(args.command, gc.isenabled()))


def test_only_the_one_shot_commands_run_with_the_collector_paused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dataclasses
    import gc

    from calibtune import cli

    one_shot = {name for name, c in cli.SUBCOMMANDS.items() if c.one_shot}
    assert one_shot == {"compare", "report", "export"}
    seen = _SEEN
    seen.clear()
    for name in ("compare", "train"):  # the handler sees the collector off only if one-shot
        probe = dataclasses.replace(cli.SUBCOMMANDS[name], run=f"{__name__}:_collector_probe")
        monkeypatch.setitem(cli.SUBCOMMANDS, name, probe)
    try:  # as the `calibtune` command: the arguments come from the command line
        monkeypatch.setattr(sys, "argv", ["calibtune", "compare", "x"])
        assert cli.main() == 0  # the probe returns False: exit code 0
        monkeypatch.setattr(sys, "argv", ["calibtune", "train", "x.yaml"])
        assert cli.main() == 1
    finally:
        gc.unfreeze()
    assert seen == {"compare": False, "train": True}
    assert gc.isenabled()
    seen.clear()  # called from Python with its own arguments: the collector stays on
    assert cli.main(["compare", "x"]) == 1
    assert seen == {"compare": True}


@pytest.mark.timeout(300)
def test_tables_from_the_commands_one_query_equal_the_tables_read_alone(tmp_path: Path) -> None:
    """compare/report/export read the trials once and hand them to every table; the tables (and
    export's refusals) are those each function reads on its own (the failed trial included)."""
    from calibtune.readers._results import (
        best_trials,
        compare_table,
        locate_study,
        report_table,
        trials_frame,
    )

    study, run_id = _finished_study(tmp_path)
    ref = locate_study(study)
    trials = trials_frame(ref, include_unfinished=True)
    assert sorted(trials["status"]) == ["failed", "finished"]
    assert compare_table(ref, trials=trials).equals(compare_table(ref))
    assert report_table(ref, trials=trials).equals(report_table(ref))
    assert list(best_trials(ref, trials=trials)["run_id"]) == [run_id]
    for shared in (None, trials):  # val/nll: logged by the failed trial only
        with pytest.raises(ValueError, match="expected a metric the finished trials logged"):
            best_trials(ref, "val/nll", trials=shared)


@pytest.mark.timeout(300)
def test_export_of_a_trial_without_its_config_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from calibtune.cli import main

    study, _ = _finished_study(tmp_path, config=False)
    capsys.readouterr()  # MLflow's log lines from making the store
    assert main(["export", str(study), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "calibtune export: error: trial t0001: expected a logged config.yaml artifact, found none"
    )
    assert "No such artifact: 'config.yaml'" in err
    assert len(err.strip().splitlines()) == 1
