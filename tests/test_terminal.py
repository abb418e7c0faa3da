"""What a user sees in the terminal: `calibtune run` prints its set-up line, one line per trial
and the table, without Ray's noise (token-auth notice, Tune's configuration box and tables,
the TensorBoard hint, forwarded worker logs); the live status line is a TTY-only display."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from calibtune.study._display import Counts, status_line

ROOT = Path(__file__).resolve().parents[1]
NOISE = (
    "Token authentication",
    "TensorBoard",
    "Configuration for experiment",
    "Trial status:",
    "PlacementGroupCleaner",
    "Started a local Ray instance",
    "View detailed results here",
    "(pid=",
    "RayTrainWorker",
    "INFO mlflow",  # store migrations
    "ExperimentalWarning",  # Optuna's, for TPE's group option
)


def test_status_line_counts_best_elapsed_and_eta():
    line = status_line(Counts(done=2, running=2, failed=1, total=8), "val/ece", 0.02134, 90.0)
    # 3 trials ended in 90 s: 30 s each, 5 left -> 2:30
    assert line == (
        "trials 2 done, 2 running, 1 failed of 8 | best val/ece 0.0213 | 1:30 elapsed, ETA 2:30"
    )
    assert status_line(Counts(0, 2, 0, 8), "val/ece", None, 5.0).endswith(
        "best val/ece n/a | 0:05 elapsed, ETA ?"
    )


def _study_file(tmp_path: Path, sampler: str) -> Path:
    raw = {
        "name": "term",
        "trial": {
            "data": {"name": "digits"},
            "model": {"name": "mlp"},
            "train": {"epochs": 1, "batch_size": 64},
        },
        "losses": ["cross_entropy", "focal"],
        "search": {
            "sampler": sampler,
            "num_samples": 2,
            "max_concurrent": 2,
            "objectives": [{"metric": "val/ece", "mode": "min"}],
        },
        "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "term"},
        "storage": str(tmp_path / "studies"),
    }
    study = tmp_path / "term.yaml"
    study.write_text(yaml.safe_dump(raw, sort_keys=False))
    return study


def _check_run_output(out: str) -> list[str]:
    """The lines of a successful `calibtune run` of `_study_file`: set-up, two trial lines,
    the table, the closing line, and none of Ray's, MLflow's or Optuna's noise."""
    lines = out.splitlines()
    assert lines[0].startswith("[calibtune] study term: 2 trials, 2 at a time on a local Ray")
    trial_lines = [ln for ln in lines if ln.startswith("[calibtune] trial ")]
    assert len(trial_lines) == 2, out[-3000:]
    assert all(" done: val/ece=" in ln for ln in trial_lines)
    assert any(ln.startswith("| ") and "val/ece" in ln for ln in lines), out[-3000:]
    assert "study term: 2 finished, 0 failed" in out
    found = [n for n in NOISE if n in out]
    assert not found, (found, out[-3000:])
    return lines


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_run_prints_setup_trials_and_table_without_ray_noise(tmp_path):
    study = _study_file(tmp_path, "random")
    calibtune = Path(sys.executable).parent / "calibtune"
    run = subprocess.run(
        [str(calibtune), "run", str(study)],
        cwd=tmp_path, capture_output=True, text=True, timeout=380,
    )  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    _check_run_output(out)
    assert "\r" not in out  # not a TTY: no live line


def _read_pty(fd: int, proc: subprocess.Popen, timeout: float) -> str:
    """Everything written to the pseudo-terminal until the process exits (or ``timeout``)."""
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if ready:
            try:
                data = os.read(fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_live_status_line_on_a_real_terminal(tmp_path):
    """On a TTY the live line (``trials … of 2 | slots … | best … | … elapsed, ETA …``) is
    redrawn in place and erased before every other line, so the finished output reads clean."""
    study = _study_file(tmp_path, "tpe")
    calibtune = Path(sys.executable).parent / "calibtune"
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [str(calibtune), "run", str(study)],
        cwd=tmp_path, stdin=follower, stdout=follower, stderr=follower, close_fds=True,
    )  # fmt: skip
    os.close(follower)
    try:
        raw = _read_pty(leader, proc, 380)
    finally:
        os.close(leader)
    assert proc.wait(timeout=30) == 0, raw[-3000:]
    live = re.findall(r"\r\x1b\[K(trials \d+ done, \d+ running, \d+ failed of 2 \| [^\r\n]*)", raw)
    assert live, raw[-3000:]
    assert re.fullmatch(
        r"trials \d done, \d running, 0 failed of 2 \| slots \d+/\d+ \| "
        r"best val/ece (n/a|\d\.\d{4}) \| "
        r"\d+:\d\d elapsed, ETA (\?|\d+:\d\d)",
        live[-1],
    ), live[-1]
    # erased, not left behind: every live line is followed by the next "\r\x1b[K"
    erased = re.findall(r"\r\x1b\[Ktrials [^\r\n]*(?=\r\x1b\[K)", raw)
    assert len(erased) == len(live), raw[-3000:]
    shown = re.sub(r"\r\x1b\[K(trials [^\r\n]*)?", "", raw).replace("\r\n", "\n")
    assert not re.search(r"trials \d+ done", shown), shown[-3000:]
    _check_run_output(shown)


def test_train_prints_one_line_per_epoch(tmp_path, capsys):
    from calibtune.cli import main

    cfg = tmp_path / "t.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "name": "term",
                "data": {"name": "digits", "ood": []},
                "model": {"name": "mlp"},
                "loss": {"name": "cross_entropy"},
                "train": {"epochs": 2, "batch_size": 64},
                "eval": {"posthoc": []},
            }
        )
    )
    assert main(["train", str(cfg), "--storage-path", str(tmp_path / "runs")]) == 0
    epochs = [ln for ln in capsys.readouterr().out.splitlines() if "] epoch " in ln]
    assert [ln.split(":")[0] for ln in epochs] == ["[calibtune] epoch 1/2", "[calibtune] epoch 2/2"]
    assert all("train/loss " in ln and "val/ece " in ln for ln in epochs), epochs


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_train_with_workers_prints_epoch_lines_without_ray_prefixes(tmp_path):
    cfg = tmp_path / "t.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "name": "termw",
                "data": {"name": "digits", "ood": []},
                "model": {"name": "mlp"},
                "loss": {"name": "cross_entropy"},
                "train": {"epochs": 2, "batch_size": 64},
                "eval": {"posthoc": []},
            }
        )
    )
    calibtune = Path(sys.executable).parent / "calibtune"
    run = subprocess.run(
        [str(calibtune), "train", str(cfg), "--num-workers", "1",
         "--storage-path", str(tmp_path / "runs")],
        cwd=tmp_path, capture_output=True, text=True, timeout=380,
    )  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    epochs = [ln for ln in out.splitlines() if "] epoch " in ln]
    assert [ln.split(":")[0] for ln in epochs] == [
        "[calibtune] epoch 1/2",
        "[calibtune] epoch 2/2",
    ], out[-3000:]
    found = [n for n in NOISE if n in out]
    assert not found, (found, out[-3000:])
