"""Several small trials on one GPU: ``scaling.resources_per_worker: {GPU: 0.25}`` in local mode
asks Tune for a quarter GPU per trial, so four trials share one GPU. Scheduled here on a local
Ray started with one *logical* GPU (Ray assigns GPU ids without touching a device)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from calibtune.study import load_study
from calibtune.study._trainable import trial_resources
from calibtune.trial import config_from_dict

ROOT = Path(__file__).resolve().parents[1]


def _study(tmp: Path, gpu: float, workers: int = 0) -> Path:
    raw = {
        "name": "packed",
        "trial": {
            "data": {"name": "digits"},
            "model": {"name": "small_cnn"},
            "train": {"epochs": 1},
            "scaling": {
                "num_workers": workers,
                "use_gpu": True,
                "resources_per_worker": {"GPU": gpu, "CPU": 0.5},
            },
        },
        "losses": ["cross_entropy"],
        "search": {"sampler": "random", "num_samples": 4, "max_concurrent": 4,
                   "objectives": [{"metric": "val/ece", "mode": "min"}]},
        "storage": str(tmp / "studies"),
    }  # fmt: skip
    path = tmp / f"packed_{gpu}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_a_fractional_gpu_is_the_local_trials_tune_resource(tmp_path):
    assert trial_resources(load_study(_study(tmp_path, 0.25))) == {"cpu": 0.5, "gpu": 0.25}
    whole = load_study(_study(tmp_path, 1.0))
    assert trial_resources(whole)["gpu"] == 1.0


@pytest.mark.parametrize("workers", [2, 4])
def test_several_workers_on_a_fraction_of_a_gpu_are_refused_in_one_line(workers):
    raw = {
        "scaling": {"num_workers": workers, "use_gpu": True, "resources_per_worker": {"GPU": 0.5}}
    }
    with pytest.raises(ValueError) as info:
        config_from_dict(raw)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("scaling.resources_per_worker.GPU: expected a whole GPU per worker")
    assert msg.endswith("got 0.5")


SCHEDULE = """
import json, sys, time
import ray
from ray import tune
from calibtune.study import load_study
from calibtune.study._trainable import trial_resources

ray.init(address="local", num_cpus=4, num_gpus=1, include_dashboard=False, log_to_driver=False)

def trial(config):
    t0 = time.time()
    time.sleep(2.0)
    tune.report({"start": t0, "end": time.time(), "gpus": ",".join(map(str, ray.get_gpu_ids()))})

resources = trial_resources(load_study(sys.argv[1]))
tuner = tune.Tuner(
    tune.with_resources(trial, resources),
    param_space={"i": tune.grid_search([0, 1, 2, 3])},
    run_config=tune.RunConfig(storage_path=sys.argv[2], verbose=0),
)
rows = [r.metrics for r in tuner.fit()]
print(json.dumps([[r["start"], r["end"], r["gpus"]] for r in rows]))
"""


def _max_overlap(rows: list[list]) -> int:
    events = sorted([(s, 1) for s, _, _ in rows] + [(e, -1) for _, e, _ in rows])
    now = best = 0
    for _, d in events:
        now += d
        best = max(best, now)
    return best


@pytest.mark.slow
@pytest.mark.parametrize(("gpu", "together"), [(0.25, 4), (1.0, 1)])
def test_tune_packs_quarter_gpu_trials_four_at_a_time_on_one_gpu(tmp_path, gpu, together):
    script = tmp_path / "schedule.py"
    script.write_text(SCHEDULE)
    proc = subprocess.run(
        [sys.executable, str(script), str(_study(tmp_path, gpu)), str(tmp_path / "ray")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(rows) == 4
    assert {g for _, _, g in rows} == {"0"}  # every trial was given the one GPU
    assert _max_overlap(rows) == together
