"""`make gpu-check`: the trial path on a real GPU, end to end, in one table.

Steps (each timed; any failure makes the exit status 1; a step the hardware cannot hold is a
``skipped: why`` row):

1. the suite's CUDA tests (losses, compiled losses against the float64 reference, metrics,
   post-hoc on CUDA, the GPU utilisation keys);
2. CIFAR-10 in the official python-pickle format (50,000/10,000 images with learnable class
   patterns) and SVHN's ``test_32x32.mat``, written to a temporary folder;
3. a ResNet-50 trial, 2 epochs, local mode (``num_workers: 0``), OOD svhn +
   ``cifar10c_generated`` (CIFAR-10-C itself is fetched, not written here), ``ts``;
4. the same in Ray Train worker mode (1 worker, nccl);
5. a 2-trial study through ``calibtune run`` (Tune + Optuna + MLflow), then ``compare`` and
   ``export``;
6. a study trial in worker mode with ``max_failures: 1`` whose Train worker is SIGKILLed right
   after its first checkpoint: the restarted worker finishes, every epoch once in the trial's
   history and once in its MLflow run;
7. 2 Ray Train workers on 2 GPUs (DDP over nccl; not shown with one GPU), ``max_failures: 1``: one
   rank is SIGKILLed at the end of epoch 2, the group resumes from epoch 1's checkpoint, both
   ranks in ``workers.json`` of the resumed attempt;
8. 4 trials packed on one GPU (``{GPU: 0.25}``, 4 at once): all finish, at least two overlap
   in time, each trial's per-process peak (``gpu_mem_gib``) stays under a quarter of the device,
   and a process holding that share (`calibtune.trial._placement.hold_share`) cannot allocate
   past it;
9. a trial checkpointed on the GPU with every GPU visible resumes on another GPU index
   (``CUDA_VISIBLE_DEVICES`` = the last GPU: fewer visible than at the save; skipped with one
   GPU), then on the CPU;
10. ``loss.compile: on`` against ``off``: the wall time of the same 2-epoch trial, compile time
    included. The rule for ``auto`` (compiles on CUDA today): if ``on`` is not faster than
    ``off`` here, ``auto`` must not compile — change `calibtune.losses.wants_compile` and say
    why. Not yet measured: no GPU has run this step (bench/README.md records what has).

11. one epoch with every host sync of its training pass counted (``set_sync_debug_mode``
    ``warn``; on the CPU, the reads that would sync): red past 3 (a sync per step);
12. the trial's training throughput against a plain-PyTorch loop on the same model, batch,
    precision, memory format and resident data, in this process: red below 0.85× (goal
    0.95×), or when the whole epoch (``epoch_samples_per_s``) takes more than 1.35× its
    training pass;
13. one checkpoint: fp32 logits on the GPU against the CPU's, bf16 inference's ECE and NLL
    against fp32's (bounds in bench/_gpu_verdicts.py);
14. ``train.deterministic: true``: 3 epochs against 2 + 1 resumed, identical history;
15. ``loss.compile: on`` really compiled: dynamo frames, no graph break, no eager fallback,
    ``suppress_errors`` off, recompiles under dynamo's limit;
16. what ships: the paper studies' settings (fp32, 1 Train worker, ``checkpoint_every: 10``,
    ResNet-110 and WRN-26-10), fp16, ``sync_batchnorm`` on 2 GPUs, AdaFocal ``update_every: 2``.

Steps 11-15 run in this process (local-mode trials) and hand their numbers to the pure rules of
bench/_gpu_verdicts.py (tests/test_gpu_check_verdicts.py, tests/test_gpu_check_steps.py feed
them a slow loop, a sync per step, disagreeing logits, an eager fallback, one GPU). With one
GPU the DDP rows (7, ``sync_batchnorm``) say ``not shown (1 GPU)``, never ok, and the closing
summary line says the DDP path is unproven; the packed step (8) also bounds every process's
NVML memory by its share and their sum by the device.

``--bench`` then runs bench/bench_gpu.py (issue 21's GPU benchmark) on the same device.
Without CUDA it says so and exits 0. ``--cpu --small`` runs the same steps on the CPU with small
data and small models (gloo instead of nccl, ``{CPU: 0.25}`` packing, ``auto`` against ``off``
since ``auto`` is eager on the CPU): ``make gpu-check-dry``. ``--tiny`` shrinks that further
(fewer images, no cifar10c, bootstrap 10) for `make test` (tests/test_gpu_check.py): every step's
code runs, on less data. Each command runs as ``python -m calibtune`` of this checkout.
"""

from __future__ import annotations

import argparse
import contextlib
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
sys.path.insert(0, str(ROOT / "bench"))
import _gpu_steps as S  # noqa: E402
import _gpu_verdicts as V  # noqa: E402


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


class Skip(Exception):
    """A step this machine cannot hold (e.g. 2 GPUs on a machine with one): a ``skipped`` row."""


class NotShown(Exception):
    """A claim this machine cannot show (DDP on one GPU): a ``not shown (why)`` row, never ok."""


class Check:
    """Runs the steps, keeps (step, result, seconds), prints the table."""

    def __init__(self, work: Path, env: dict[str, str]) -> None:
        self.work, self.env, self.rows = work, env, []

    def step(self, name: str, fn: Callable[[], str]) -> None:
        t0 = time.perf_counter()
        try:
            result = f"ok ({fn()})"
        except Skip as why:
            result = f"skipped: {why}"
        except NotShown as why:
            result = V.Verdict(None, str(why)).row()
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
        # CIFAR-10-C is a fetched set (`calibtune data fetch`): its generated stand-in here
        "data": {"name": "cifar10", "root": str(data), "ood": ["svhn", "cifar10c_generated"],
                 "shift": []},
        "model": {"name": "small_cnn" if args.small else "resnet50"},
        "loss": {"name": "focal", "params": {"gamma": 3.0}},
        "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4},
        "train": {"epochs": 2, "batch_size": 128, "loader_workers": 4 if not args.small else 0,
                  "precision": args.precision, "channels_last": not args.cpu},
        "eval": {"posthoc": ["ts"], "bootstrap": 10 if args.tiny else 50},
        "scaling": {"num_workers": 0, "use_gpu": not args.cpu},
    }  # fmt: skip
    if args.tiny:
        cfg["data"]["ood"] = ["svhn"]
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


def kill_at(c: Check, argv: list[str], tag: str, point: str = "after_checkpoint:1") -> str:
    """Run ``python -m calibtune ARGV`` with the failpoint ``point`` (``name:epoch``), SIGKILL
    the Train worker that reaches it first, and wait for the command (Ray restarts the worker
    group: ``max_failures`` 1); its output, or RuntimeError."""
    points = c.work / f"failpoints_{tag}"
    points.mkdir(exist_ok=True)
    env = {"CALIBTUNE_FAILPOINT": point, "CALIBTUNE_FAILPOINT_DIR": str(points)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "calibtune", *argv],
        cwd=c.work, env={**c.env, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    hit = points / f"{point.partition(':')[0]}.hit"
    deadline = time.time() + 400
    while not hit.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    if not hit.exists():
        proc.kill()
        raise RuntimeError(f"the worker never reached {point}: {proc.communicate()[0][-300:]}")
    time.sleep(0.3)  # the pid is written before the pause starts
    os.kill(int(hit.read_text()), signal.SIGKILL)
    out, _ = proc.communicate(timeout=500)
    if proc.returncode != 0:
        raise RuntimeError(f"calibtune {argv[0]} exited {proc.returncode}: {out.strip()[-300:]}")
    return out


def kill_worker(c: Check, args: argparse.Namespace, data: Path) -> str:
    """SIGKILL the Train worker at its first checkpoint; Ray restarts it (max_failures 1)."""
    from mlflow.tracking import MlflowClient

    path = study_file(c, args, data, "gpu_kill", num_workers=1, max_failures=1, epochs=2)
    raw = yaml.safe_load(path.read_text())
    raw["losses"], raw["search"]["num_samples"] = [{"name": "cross_entropy"}], 1
    raw["trial"]["model"]["name"] = "small_cnn"
    _write(path, raw)
    kill_at(c, ["run", str(path), "--quiet"], "kill")
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


def _epochs(c: Check, name: str) -> list[int]:
    hist = (c.work / "trials" / name / "artifacts" / "history.jsonl").read_text()
    return [json.loads(line)["epoch"] for line in hist.splitlines()]


def ddp_two_workers(c: Check, args: argparse.Namespace, data: Path) -> str:
    """2 Train workers (nccl on 2 GPUs, gloo on the CPU), one SIGKILLed at the end of epoch 2,
    after epoch 1's checkpoint was reported: the group resumes from that checkpoint; each epoch
    once, both ranks in the resumed attempt's ``workers.json``."""
    import torch

    if (hidden := V.ddp(0 if args.cpu else torch.cuda.device_count(), args.cpu)) is not None:
        raise NotShown(hidden.text)
    over = {"model__name": "small_cnn", "data__ood": [], "train__loader_workers": 0,
            "scaling__num_workers": 2, "scaling__max_failures": 1}  # fmt: skip
    path = _write(c.work / "ddp2.yaml", trial_config(args, data, "ddp2", **over))
    argv = ["train", str(path), "--storage-path", str(c.work / "trials")]
    kill_at(c, argv, "ddp2", point="epoch_end:2")
    if _epochs(c, "ddp2") != [1, 2]:
        raise RuntimeError(f"expected epochs [1, 2] once each, got {_epochs(c, 'ddp2')}")
    workers = json.loads((c.work / "trials" / "ddp2" / "artifacts" / "workers.json").read_text())
    ranks = [r["rank"] for r in workers["ranks"]]
    if ranks != [0, 1] or workers["start_epoch"] != 1:
        raise RuntimeError(f"expected ranks [0, 1] resumed after epoch 1, got {workers}")
    backend = "gloo" if args.cpu else "nccl"
    return f"2 ranks ({backend}), one killed in epoch 2, resumed from epoch 1; epochs [1, 2] once"


def _capped_allocation() -> str:
    """In a fresh process: hold a quarter of GPU 0 (`hold_share`), then ask for a third of it."""
    code = (
        "import torch\n"
        "from calibtune.trial._placement import hold_share\n"
        "dev = torch.device('cuda', 0)\n"
        "hold_share({'CPU': 1.0, 'GPU': 0.25}, dev)\n"
        "n = torch.cuda.get_device_properties(dev).total_memory // 3\n"
        "try:\n"
        "    torch.empty(n, dtype=torch.uint8, device=dev)\n"
        "    print('allocated')\n"
        "except torch.OutOfMemoryError:\n"
        "    print('refused')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)  # fmt: skip
    return out.stdout.strip() or out.stderr.strip()[-200:]


def packed_trials(c: Check, args: argparse.Namespace, data: Path) -> str:
    """4 trials at once on one GPU (``{GPU: 0.25}``; ``{CPU: 0.25}`` on the CPU): all finish,
    two or more overlap, each stays under its memory share, which a process cannot pass."""
    from mlflow.tracking import MlflowClient

    share = {"CPU": 0.25} if args.cpu else {"CPU": 1.0, "GPU": 0.25}
    path = study_file(c, args, data, "gpu_packed", resources_per_worker=share, epochs=1)
    raw = yaml.safe_load(path.read_text())
    raw["losses"] = [{"name": "cross_entropy"}, {"name": "focal"}]
    raw["search"].update(num_samples=4, max_concurrent=4)
    raw["trial"]["model"]["name"] = "small_cnn"
    raw["trial"]["data"]["ood"] = []
    _write(path, raw)
    nvml = contextlib.nullcontext() if args.cpu else S.NvmlPeaks(0)
    with nvml:
        c.calibtune("run", str(path), "--quiet")
    client = MlflowClient(raw["tracking"]["uri"])
    exp = client.get_experiment_by_name("gpu_packed")
    runs = [
        r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" in r.data.tags
    ]
    done = [r for r in runs if r.info.status == "FINISHED"]
    if len(done) != 4:
        raise RuntimeError(f"expected 4 finished trials, got {[r.info.status for r in runs]}")
    spans = sorted((r.info.start_time, r.info.end_time) for r in done)
    overlap = max(sum(a <= s < b for a, b in spans) for s, _ in spans)
    if overlap < 2:
        raise RuntimeError(f"expected packed trials to overlap, got spans {spans}")
    out = f"4 finished, up to {overlap} at once"
    if args.cpu:
        return out + "; memory cap: CUDA only"
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    reserved = [
        float(r.data.metrics["gpu_mem_reserved_gib"]) * 2**30
        for r in done
        if "gpu_mem_reserved_gib" in r.data.metrics
    ]
    mem = S.require(V.memory(nvml.peak, nvml.sum_peak, total, 0.25, reserved))
    capped = _capped_allocation()
    if capped != "refused":
        raise RuntimeError(f"a third of the GPU past a 0.25 share: expected refused, got {capped}")
    return out + f"; {mem}; past the 0.25 cap: refused"


def resume_elsewhere(c: Check, args: argparse.Namespace, data: Path) -> str:
    """Epochs 1-2 with every GPU visible, epoch 3 resumed on another GPU index where there are
    two (``CUDA_VISIBLE_DEVICES`` = the last one: fewer GPUs visible than at the save), then one
    more epoch on the CPU."""
    import torch

    over = {"model__name": "small_cnn", "data__ood": [], "train__loader_workers": 0}
    run_trial(c, args, data, "gpu_then_cpu", **over)
    path = _write(c.work / "gpu_then_cpu.yaml", trial_config(args, data, "gpu_then_cpu", **over))
    store = ("--storage-path", str(c.work / "trials"))
    gpus = 0 if args.cpu else torch.cuda.device_count()
    done, where = 2, ["epochs 1-2 on " + ("the CPU" if args.cpu else f"{gpus} visible GPU(s)")]
    if gpus >= 2:
        done += 1
        env = {**c.env, "CUDA_VISIBLE_DEVICES": str(gpus - 1)}
        calibtune_cli(("train", str(path), *store, "--set", f"train.epochs={done}"),
                      c.work, env, 600)  # fmt: skip
        where.append(f"{done} on GPU {gpus - 1} alone")
    else:
        where.append("another GPU index: skipped (1 GPU)" if not args.cpu else "")
    done += 1
    c.calibtune("train", str(path), *store, "--set", f"train.epochs={done}", "--no-use-gpu")
    if _epochs(c, "gpu_then_cpu") != list(range(1, done + 1)):
        raise RuntimeError(
            f"expected epochs 1..{done} after resuming, got {_epochs(c, 'gpu_then_cpu')}"
        )
    where.append(f"{done} on the CPU")
    return ", ".join(w for w in where if w)


def compile_on_off(c: Check, args: argparse.Namespace, data: Path) -> str:
    """The same 2-epoch trial with ``loss.compile`` on and off (``auto``, eager, on the CPU):
    wall time including compilation, and what it says about ``auto``."""
    modes = ("auto", "off") if args.cpu else ("on", "off")
    wall = {}
    for mode in modes:
        t0 = time.perf_counter()
        run_trial(c, args, data, f"compile_{mode}", loss__compile=mode, data__ood=[],
                  loss__name="adafocal", loss__params={})  # fmt: skip
        wall[mode] = time.perf_counter() - t0
    on, off = (wall[m] for m in modes)
    if args.cpu:
        return f"{modes[0]} {on:.1f} s, off {off:.1f} s (CPU: both eager; the rule needs a GPU)"
    verdict = "auto may compile" if on < off else "auto must not compile: change the default"
    return f"on {on:.1f} s, off {off:.1f} s (2 epochs, compile included): {verdict}"


def _quick(args: argparse.Namespace, data: Path, name: str, **over: object) -> dict:
    """A trial config for the in-process steps: no OOD sets, no post-hoc fits."""
    return trial_config(args, data, name, data__ood=[], eval__posthoc=[], **over)


def _device(args: argparse.Namespace) -> object:
    import torch

    return torch.device("cpu") if args.cpu else torch.device("cuda", 0)


def _inproc(c: Check) -> Path:
    return c.work / "inproc"


def sync_epoch(c: Check, args: argparse.Namespace, data: Path) -> str:
    cfg = _quick(args, data, "syncs", train__batch_size=32 if args.small else 128)
    return S.sync_step(cfg, _inproc(c), _device(args))


def speed_vs_plain(c: Check, args: argparse.Namespace, data: Path) -> str:
    return S.speed_step(_quick(args, data, "speed"), _inproc(c), _device(args), dry=args.cpu)


def numbers(c: Check, args: argparse.Namespace, data: Path) -> str:
    return S.numbers_step(_quick(args, data, "numbers", train__epochs=1), _inproc(c), _device(args))


def deterministic_resume(c: Check, args: argparse.Namespace, data: Path) -> str:
    return S.resume_step(_quick(args, data, "determinism"), _inproc(c))


def compiled_path(c: Check, args: argparse.Namespace, data: Path) -> str:
    cfg = _quick(args, data, "compiled", loss__name="adafocal", loss__params={})
    return S.compile_step(cfg, _inproc(c))


def paper_settings(c: Check, args: argparse.Namespace, data: Path) -> str:
    """The shipped paper studies' settings: fp32, one Train worker, ``checkpoint_every: 10``,
    ResNet-110 and WRN-26-10 (small_cnn stand-ins with ``--small``)."""
    models = ("small_cnn",) if args.small else ("resnet110", "wide_resnet26_10")
    out = []
    for model in models:
        out.append(run_trial(c, args, data, f"paper_{model}", model__name=model, data__ood=[],
                             train__precision="fp32", train__checkpoint_every=10,
                             scaling__num_workers=1))  # fmt: skip
    return f"{', '.join(models)}: " + "; ".join(out)


def fp16_trial(c: Check, args: argparse.Namespace, data: Path) -> str:
    """fp16 (autocast and GradScaler); one epoch on the CPU, whose fp16 kernels are slow."""
    epochs = 1 if args.cpu else 2
    return run_trial(c, args, data, "fp16", train__precision="fp16", train__epochs=epochs,
                     data__ood=[])  # fmt: skip


def sync_batchnorm(c: Check, args: argparse.Namespace, data: Path) -> str:
    """``scaling.sync_batchnorm`` with 2 Train workers on 2 GPUs (CUDA only: torch's
    SyncBatchNorm; one GPU shows nothing of it)."""
    import torch

    if args.cpu:
        raise NotShown("CUDA only")
    if (hidden := V.ddp(torch.cuda.device_count())) is not None:
        raise NotShown(hidden.text)
    return run_trial(c, args, data, "syncbn", data__ood=[], scaling__num_workers=2,
                     scaling__sync_batchnorm=True)  # fmt: skip


def adafocal_every(c: Check, args: argparse.Namespace, data: Path) -> str:
    return run_trial(c, args, data, "adafocal_every", data__ood=[], loss__name="adafocal",
                     loss__params={"update_every": 2})  # fmt: skip


def cuda_tests(c: Check) -> str:
    proc = subprocess.run(
        # compiled parity for one loss per kernel family: all 18 would be 18 CUDA compilations
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k",
         "cuda and (not compiled or adafocal or dual_focal or fcl or label_smoothing or mbls)",
         "tests/test_losses.py", "tests/test_losses_compile.py", "tests/test_metrics.py",
         "tests/test_posthoc.py", "tests/test_device_path.py"],
        cwd=ROOT, env=c.env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-200:]
    if proc.returncode != 0 or " passed" not in last:
        raise RuntimeError(last)
    # the float32 head, checkpoints across devices and the memory share, whole files
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
         "tests/test_precision_head.py", "tests/test_checkpoint_devices.py",
         "tests/test_gpu_share.py"],
        cwd=ROOT, env=c.env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    more = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-200:]
    if proc.returncode != 0 or " passed" not in more:
        raise RuntimeError(more)
    return f"{last}; {more}"


#: ``--steps`` key -> (table row, step); in this order
STEPS: dict[str, tuple[str, Callable[[Check, argparse.Namespace, Path], str]]] = {
    "local": ("trial, local mode", lambda c, a, d: run_trial(c, a, d, "local")),
    "worker": (
        "trial, Train worker",
        lambda c, a, d: run_trial(c, a, d, "worker", scaling__num_workers=1),
    ),
    "study": ("study: run, compare, export", run_study),
    "kill": ("worker SIGKILL, restart", kill_worker),
    "ddp2": ("2 Train workers, one killed, resumed", ddp_two_workers),
    "packed": ("4 trials packed on one GPU", packed_trials),
    "resume": ("GPU checkpoint resumes elsewhere", resume_elsewhere),
    "compile": ("loss.compile on vs off", compile_on_off),
    "sync": ("one epoch, host syncs counted", sync_epoch),
    "speed": ("training speed vs plain PyTorch", speed_vs_plain),
    "numbers": ("one checkpoint: device vs CPU logits, bf16 vs fp32", numbers),
    "determinism": ("3 epochs vs 2 + 1 resumed, deterministic", deterministic_resume),
    "compiled": ("loss.compile on: compiled, no eager fallback", compiled_path),
    "paper": ("paper settings: fp32, 1 worker, checkpoint_every 10", paper_settings),
    "fp16": ("trial, fp16", fp16_trial),
    "syncbn": ("sync_batchnorm, 2 Train workers", sync_batchnorm),
    "adafocal": ("AdaFocal, update_every 2", adafocal_every),
}

#: the rows that show the DDP path: all ok, or the summary says it is unproven
DDP_TITLES = (STEPS["ddp2"][0], STEPS["syncbn"][0])


def _steps(value: str) -> list[str]:
    keys = list(STEPS) if value == "all" else [k.strip() for k in value.split(",") if k.strip()]
    unknown = [k for k in keys if k not in STEPS]
    if unknown or not keys:
        raise argparse.ArgumentTypeError(
            f"expected 'all' or steps among {', '.join(STEPS)}, got {value!r}"
        )
    return [k for k in STEPS if k in keys]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="run on the CPU (a dry run of the steps)")
    ap.add_argument("--small", action="store_true", help="small data and models")
    ap.add_argument("--tiny", action="store_true", help="with --small: less data (make test)")
    ap.add_argument("--precision", default="bf16", choices=["fp32", "bf16", "fp16"])
    steps = ", ".join(STEPS)
    ap.add_argument("--steps", default="all", type=_steps,
                    help=f"comma-separated steps (data are always written): {steps}")  # fmt: skip
    ap.add_argument("--out", type=Path, help="also write the table to this file")
    ap.add_argument("--bench", action="store_true", help="then run bench/bench_gpu.py")
    args = ap.parse_args(argv)
    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("gpu-check: needs a CUDA GPU (none is visible here); nothing to check")
        return 0
    args.small = args.small or args.tiny
    args.n_train, n_test = (2_000, 500) if args.small else (50_000, 10_000)
    if args.tiny:
        args.n_train, n_test = 500, 200
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
        for key in args.steps:
            title, fn = STEPS[key]
            c.step(title, lambda fn=fn: fn(c, args, data))
    summary = V.summary(c.rows, DDP_TITLES, dry=args.cpu)
    print(c.table())
    print(summary)
    if args.out:
        args.out.write_text(c.table() + "\n\n" + summary + "\n")
    if args.bench:
        flags = [f for f, on in (("--cpu", args.cpu), ("--small", args.small)) if on]  # no --tiny
        subprocess.run([sys.executable, str(ROOT / "bench" / "bench_gpu.py"), *flags], env=env)
    return 1 if c.failed else 0


def _write_data(data: Path, n_train: int, n_test: int) -> str:
    write_cifar10(data, n_train, n_test)
    write_svhn(data, max(n_test, 1_000 if n_test >= 500 else n_test) if n_test < 10_000 else 26_032)
    return f"{n_train:,}/{n_test:,} images"


if __name__ == "__main__":
    sys.exit(main())
