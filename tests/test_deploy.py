"""deploy/ (issue 28 item 6): the KubeRay RayJob and the Ray cluster-launcher config are
generated from what `calibtune submit` sends (`job_spec`), current, and the shapes they promise
(a CPU head, GPU workers from zero, the versions of constraints.txt)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from calibtune.cluster._deploy import EXAMPLE, example_spec, pins, render

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"


def test_the_recipes_are_current() -> None:
    for name, text in render().items():
        assert (DEPLOY / name).read_text() == text, (
            f"deploy/{name} is stale: python -m calibtune.cluster._deploy"
        )


def test_the_rayjob_runs_what_submit_sends() -> None:
    job = yaml.safe_load((DEPLOY / "rayjob.yaml").read_text())
    spec = example_spec()
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    assert job["spec"]["entrypoint"] == spec["entrypoint"]
    assert yaml.safe_load(job["spec"]["runtimeEnvYAML"]) == spec["runtime_env"]
    argv = spec["entrypoint"].split()
    assert argv[:3] == ["python", "-m", "calibtune"]
    assert argv[argv.index("--storage") + 1] == EXAMPLE["storage"]
    cluster = job["spec"]["rayClusterSpec"]
    (head,) = cluster["headGroupSpec"]["template"]["spec"]["containers"]
    assert "nvidia.com/gpu" not in head["resources"]["limits"]
    assert cluster["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"
    (gpu,) = cluster["workerGroupSpecs"]
    assert gpu["minReplicas"] == 0 and gpu["maxReplicas"] >= 1
    (worker,) = gpu["template"]["spec"]["containers"]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert cluster["enableInTreeAutoscaling"] is True
    have = pins((ROOT / "constraints.txt").read_text())
    assert cluster["rayVersion"] == have["ray"] and f":{have['ray']}-" in head["image"]
    installed = spec["runtime_env"]["pip"]["packages"]
    for name in ("torch", "mlflow", "optuna"):  # the versions the job's probe compares
        assert f"{name}=={have[name]}" in installed


def test_the_launcher_config_is_valid_for_ray_up() -> None:
    import jsonschema
    import ray.autoscaler

    config = yaml.safe_load((DEPLOY / "cluster.yaml").read_text())
    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(config, schema)  # the schema `ray up` checks a config against
    types = config["available_node_types"]
    assert types[config["head_node_type"]]["resources"]["GPU"] == 0
    (gpu,) = [t for name, t in types.items() if name != config["head_node_type"]]
    assert gpu["min_workers"] == 0 and gpu["resources"]["GPU"] == 1
    ray_version = pins((ROOT / "constraints.txt").read_text())["ray"]
    assert f":{ray_version}-" in config["docker"]["image"]
    assert any("-c /home/ray/calibtune/constraints.txt" in c for c in config["setup_commands"])
    assert any("--dashboard-port=8265" in c for c in config["head_start_ray_commands"])
