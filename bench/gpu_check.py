"""`make gpu-check`: the trial path on a real GPU, end to end, in one table (≤ 8 min on one H100).

Steps (each timed; any failure makes the exit status 1):

1. the suite's CUDA tests (losses, compiled losses against the float64 reference, metrics,
   post-hoc on CUDA);
2. CIFAR-10 in the official python-pickle format (50,000/10,000 images with learnable class
   patterns) and SVHN's ``test_32x32.mat``, written to a temporary folder;
3. a ResNet-50 trial, 2 epochs, local mode (``num_workers: 0``), OOD svhn + cifar10c, ``ts``;
4. the same in Ray Train worker mode (1 worker, nccl);
5. a 2-trial study through ``calibtune run`` (Tune + Optuna + MLflow), then ``compare`` and
   ``export``;
6. a study trial in worker mode with ``max_failures: 1`` whose Train worker is SIGKILLed right
   after its first checkpoint: the restarted worker finishes, every epoch once in the trial's
   history and once in its MLflow run;
7. a trial checkpointed on the GPU resumes on the CPU (one more epoch there).

``--bench`` then runs bench/bench_gpu.py (issue 21's GPU benchmark) on the same device.
Without CUDA it says so and exits 0. ``--cpu --small`` runs the same steps on the CPU with small
data and small models (gloo instead of nccl): that is how `make test` keeps the script working
(tests/test_gpu_check.py). Each command runs as ``python -m calibtune`` of this checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]


def write_cifar10(root: Path, n_train: int, n_test: int, seed: int = 0) -> None:
    """``root/cifar-10-batches-py``: data_batch_1..5, test_batch, batches.meta (pickled dicts
    with ``data`` (N, 3072) uint8 and ``labels``); class c is a fixed random 32×32×3 pattern
    plus noise, so a model learns it within an epoch."""
    rng = np.random.default_rng(seed)
    patterns = rng.integers(0, 256, size=(10, 3072)).astype(np.int16)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)

    def batch(n: int, label: str) -> dict:
        y = rng.integers(0, 10, size=n)
        noise = rng.integers(-96, 97, size=(n, 3072), dtype=np.int16)
        data = np.clip(patterns[y] // 2 + 64 + noise, 0, 255).astype(np.uint8)
        return {"batch_label": label, "labels": y.tolist(), "data": data,
                "filenames": [f"{label}_{i}.png" for i in range(n)]}  # fmt: skip

    per = n_train // 5
    for b in range(5):
        _dump(folder / f"data_batch_{b + 1}", batch(per, f"training batch {b + 1} of 5"))
    _dump(folder / "test_batch", batch(n_test, "testing batch 1 of 1"))
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship"]
    _dump(folder / "batches.meta", {"label_names": [*names, "truck"], "num_cases_per_batch": per})


def write_svhn(root: Path, n: int, seed: int = 1) -> None:
    """``root/test_32x32.mat`` as the official file: X (32, 32, 3, N) uint8, y (N, 1), 0 as 10."""
    from scipy.io import savemat

    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(32, 32, 3, n), dtype=np.uint8)
    y = rng.integers(1, 11, size=(n, 1)).astype(np.uint8)
    root.mkdir(parents=True, exist_ok=True)
    savemat(root / "test_32x32.mat", {"X": x, "y": y})


def _dump(path: Path, obj: object) -> None:
    with path.open("wb") as f:
        pickle.dump(obj, f, protocol=2)


def calibtune_cli(args: tuple[str, ...], cwd: Path, env: dict[str, str], timeout: float) -> str:
    """``python -m calibtune ARGS`` of this checkout; its stdout, or RuntimeError with the tail."""
    proc = subprocess.run(
        [sys.executable, "-m", "calibtune", *args],
        cwd=cwd,
        env={**env, "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"calibtune {args[0]} exited {proc.returncode}: {' | '.join(tail)}")
    return proc.stdout


class Check:
    """Runs the steps, keeps (step, result, seconds), prints the table."""

    def __init__(self, work: Path, env: dict[str, str]) -> None:
        self.work, self.env, self.rows = work, env, []

    def step(self, name: str, fn: Callable[[], str]) -> None:
        t0 = time.perf_counter()
        try:
            result = f"ok ({fn()})"
        except Exception as exc:  # a failed step is a row, the next steps still run
            result = f"FAILED: {' '.join(str(exc).split())[:300]}"
        self.rows.append((name, result, time.perf_counter() - t0))
        print(f"[gpu-check] {name}: {result} ({self.rows[-1][2]:.1f} s)", flush=True)

    def calibtune(self, *args: str, timeout: float = 600) -> str:
        return calibtune_cli(args, self.work, self.env, timeout)

    def table(self) -> str:
        lines = ["| step | result | seconds |", "|---|---|---|"]
        lines += [f"| {n} | {r} | {s:.1f} |" for n, r, s in self.rows]
        return "\n".join(lines)

    @property
    def failed(self) -> bool:
        return any(r.startswith("FAILED") for _, r, _ in self.rows)


def trial_config(args: argparse.Namespace, data: Path, name: str, **over: object) -> dict:
    """A trial config in the shape of studies/mukhoti2020_focal_cifar10.yaml, shortened."""
    cfg: dict = {
        "name": name,
        "seed": 1,
        "data": {"name": "cifar10", "root": str(data), "ood": ["svhn", "cifar10c"]},
        "model": {"name": "small_cnn" if args.small else "resnet50"},
        "loss": {"name": "focal", "params": {"gamma": 3.0}},
        "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4},
        "train": {"epochs": 2, "batch_size": 128, "loader_workers": 4 if not args.small else 0,
                  "precision": args.precision, "channels_last": not args.cpu},
        "eval": {"posthoc": ["ts"], "bootstrap": 50},
        "scaling": {"num_workers": 0, "use_gpu": not args.cpu},
    }  # fmt: skip
    for key, value in over.items():
        node = cfg
        *parents, leaf = key.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return cfg


def _write(path: Path, obj: dict) -> Path:
    path.write_text(yaml.safe_dump(obj, sort_keys=False))
    return path


def run_trial(c: Check, args: argparse.Namespace, data: Path, name: str, **over: object) -> str:
    cfg = trial_config(args, data, name, **over)
    path = _write(c.work / f"{name}.yaml", cfg)
    c.calibtune("train", str(path), "--storage-path", str(c.work / "trials"))
    metrics = json.loads((c.work / "trials" / name / "artifacts" / "metrics.json").read_text())
    hist = (c.work / "trials" / name / "artifacts" / "history.jsonl").read_text().splitlines()
    epochs = [json.loads(line)["epoch"] for line in hist]
    if epochs != list(range(1, cfg["train"]["epochs"] + 1)):
        raise RuntimeError(f"expected epochs 1..{cfg['train']['epochs']} once each, got {epochs}")
    speed = max(json.loads(line)["train_time"] for line in hist[-1:])
    n = 45_000 if not args.small else int(0.9 * args.n_train)
    auroc = next((v for k, v in metrics.items() if k.startswith("ood/svhn") and "auroc" in k), None)
    return f"test/ece={metrics['test/ece']:.4f}, svhn auroc={auroc}, {n / speed:,.0f} img/s"


def study_file(
    c: Check, args: argparse.Namespace, data: Path, name: str, **scaling: object
) -> Path:
    base = trial_config(args, data, "x")
    for key in ("name", "seed", "loss"):
        base.pop(key)
    base["data"]["ood"] = ["svhn"]
    base["train"]["epochs"] = scaling.pop("epochs", 1)
    base["scaling"].update(scaling)
    study = {
        "name": name,
        "trial": base,
        "losses": [{"name": "adafocal"}, {"name": "dual_focal"}],
        "search": {"sampler": "random", "num_samples": 2, "max_concurrent": 1,
                   "objectives": [{"metric": "val/ece@ts", "mode": "min"}]},
        "tracking": {"uri": f"sqlite:///{c.work / 'mlflow.db'}", "experiment": name},
        "storage": str(c.work / "studies"),
    }  # fmt: skip
    return _write(c.work / f"{name}.yaml", study)


def run_study(c: Check, args: argparse.Namespace, data: Path) -> str:
    path = study_file(c, args, data, "gpu_study")
    c.calibtune("run", str(path), "--quiet")
    table = c.calibtune("compare", str(path), "--format", "csv")
    rows = [r for r in table.strip().splitlines()[1:] if ",finished," in r]
    if len(rows) != 2:
        raise RuntimeError(f"expected 2 finished trials in compare, got: {table.strip()[:300]}")
    c.calibtune("export", str(path), "--top", "1", "--out", str(c.work / "exported"))
    return f"2 finished, exported {len(list((c.work / 'exported').glob('*.yaml')))}"


def kill_worker(c: Check, args: argparse.Namespace, data: Path) -> str:
    """SIGKILL the Train worker at its first checkpoint; Ray restarts it (max_failures 1)."""
    from mlflow.tracking import MlflowClient

    path = study_file(c, args, data, "gpu_kill", num_workers=1, max_failures=1, epochs=2)
    raw = yaml.safe_load(path.read_text())
    raw["losses"], raw["search"]["num_samples"] = [{"name": "cross_entropy"}], 1
    raw["trial"]["model"]["name"] = "small_cnn"
    _write(path, raw)
    points = c.work / "failpoints"
    points.mkdir(exist_ok=True)
    env = {"CALIBTUNE_FAILPOINT": "after_checkpoint:1", "CALIBTUNE_FAILPOINT_DIR": str(points)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "calibtune", "run", str(path), "--quiet"],
        cwd=c.work, env={**c.env, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    hit = points / "after_checkpoint.hit"
    deadline = time.time() + 400
    while not hit.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    if not hit.exists():
        proc.kill()
        raise RuntimeError(
            f"the worker never reached its first checkpoint: {proc.communicate()[0][-300:]}"
        )
    time.sleep(0.3)  # the pid is written before the pause starts
    os.kill(int(hit.read_text()), signal.SIGKILL)
    out, _ = proc.communicate(timeout=500)
    if proc.returncode != 0:
        raise RuntimeError(f"calibtune run exited {proc.returncode}: {out.strip()[-300:]}")
    client = MlflowClient(raw["tracking"]["uri"])
    exp = client.get_experiment_by_name("gpu_kill")
    runs = [
        r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" in r.data.tags
    ]
    steps = sorted(int(m.step) for m in client.get_metric_history(runs[0].info.run_id, "epoch"))
    if len(runs) != 1 or steps != [1, 2]:
        raise RuntimeError(
            f"expected one trial run with epochs [1, 2] once, got {len(runs)}, {steps}"
        )
    return "worker restarted; epochs [1, 2] once in MLflow"


def gpu_to_cpu(c: Check, args: argparse.Namespace, data: Path) -> str:
    """Two epochs checkpointed on the GPU, then a third epoch resumed on the CPU."""
    over = {"model__name": "small_cnn", "data__ood": [], "train__loader_workers": 0}
    run_trial(c, args, data, "gpu_then_cpu", **over)
    cfg = trial_config(args, data, "gpu_then_cpu", **over)
    path = _write(c.work / "gpu_then_cpu.yaml", cfg)
    c.calibtune("train", str(path), "--storage-path", str(c.work / "trials"),
                "--set", "train.epochs=3", "--no-use-gpu")  # fmt: skip
    hist = (c.work / "trials" / "gpu_then_cpu" / "artifacts" / "history.jsonl").read_text()
    epochs = [json.loads(line)["epoch"] for line in hist.splitlines()]
    if epochs != [1, 2, 3]:
        raise RuntimeError(f"expected epochs [1, 2, 3] after resuming on the CPU, got {epochs}")
    return "epochs 1-2 on the GPU, 3 on the CPU"


def cuda_tests(c: Check) -> str:
    proc = subprocess.run(
        # compiled parity for one loss per kernel family: all 18 would be 18 CUDA compilations
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k",
         "cuda and (not compiled or adafocal or dual_focal or fcl or label_smoothing or mbls)",
         "tests/test_losses.py", "tests/test_losses_compile.py", "tests/test_metrics.py",
         "tests/test_posthoc.py"],
        cwd=ROOT, env=c.env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-200:]
    if proc.returncode != 0 or " passed" not in last:
        raise RuntimeError(last)
    return last


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="run on the CPU (a dry run of the steps)")
    ap.add_argument("--small", action="store_true", help="small data and models")
    ap.add_argument("--precision", default="bf16", choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--out", type=Path, help="also write the table to this file")
    ap.add_argument("--bench", action="store_true", help="then run bench/bench_gpu.py")
    args = ap.parse_args(argv)
    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("gpu-check: needs a CUDA GPU (none is visible here); nothing to check")
        return 0
    args.n_train, n_test = (2_000, 500) if args.small else (50_000, 10_000)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    with tempfile.TemporaryDirectory(prefix="calibtune-gpu-check-") as tmp:
        work = Path(tmp)
        data = work / "data"
        c = Check(work, env)
        device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
        print(f"[gpu-check] torch {torch.__version__}, {device}")
        if not args.cpu:
            c.step("CUDA unit tests", lambda: cuda_tests(c))
        c.step("write CIFAR-10 and SVHN", lambda: _write_data(data, args.n_train, n_test))
        c.step("trial, local mode", lambda: run_trial(c, args, data, "local"))
        c.step(
            "trial, Train worker",
            lambda: run_trial(c, args, data, "worker", scaling__num_workers=1),
        )
        c.step("study: run, compare, export", lambda: run_study(c, args, data))
        c.step("worker SIGKILL, restart", lambda: kill_worker(c, args, data))
        c.step("GPU checkpoint resumes on CPU", lambda: gpu_to_cpu(c, args, data))
    print(c.table())
    if args.out:
        args.out.write_text(c.table() + "\n")
    if args.bench:
        flags = [f for f, on in (("--cpu", args.cpu), ("--small", args.small)) if on]
        subprocess.run([sys.executable, str(ROOT / "bench" / "bench_gpu.py"), *flags], env=env)
    return 1 if c.failed else 0


def _write_data(data: Path, n_train: int, n_test: int) -> str:
    write_cifar10(data, n_train, n_test)
    write_svhn(data, max(n_test, 1_000) if n_test < 10_000 else 26_032)
    return f"{n_train:,}/{n_test:,} images"


if __name__ == "__main__":
    sys.exit(main())
