"""The GPU benchmark of issue 21, in one run on one device (`make gpu-check GPU_CHECK_ARGS=--bench`
or ``python bench/bench_gpu.py``).

Rows, all ResNet-50 (``--model``: another registered network) at batch 128 on CIFAR-10-format
data (45,000 training images written in the official format; ``--small``: small_cnn, 2,000
images), one torch thread as in a trial:

1. **bare loop, fp32, DataLoader** — a plain PyTorch loop over the dataset's batched fetch
   (the project's data pipeline before issue 21, ``loader_workers`` processes);
2. **bare loop, bf16 + channels_last, DataLoader**;
3. **bare loop, bf16 + channels_last, resident** — `calibtune.training.DeviceBatches`: the
   uint8 images on the device, augmented and normalised there;
4. **calibtune trial, local mode** and 5. **worker mode** (1 Train worker, nccl) at the settings
   of row 3: training images/s from the trial's own ``samples_per_s`` (best epoch), and the trial's
   wall time against its epochs' time;
6. **packed study**: 4 small_cnn trials (2 epochs) with ``{GPU: 0.25}`` against the same study
   one at a time (``{GPU: 1}``): wall-time ratio;
7. the loss table: ``bench/bench_losses.py --device cuda --rounds 10``;
8. the compiled loss table (issue 21 item 6): ``bench/bench_losses.py --device cuda --rounds 10
   --compiled-only`` — the losses of ``--compiled-losses`` (default: one of each kernel family,
   ``COMPILED_DEFAULT``; ``all``: every loss but mmce) through ``torch.compile`` vs eager vs
   ``F.cross_entropy`` at B = 128, 1024 × K = 10, 100, 1000 (``--small``: focal and adafocal,
   2 rounds). Each cell compiles once, so all 18 losses are 108 compilations: more than one
   10-minute command on the lent GPU machine.

Images/s of the bare loops: the median of the epochs after the first (``--epochs``, default 3).
Prints a markdown table with the device and torch version; numbers go to bench/README.md only
as measured. Without CUDA it says so and exits 0; ``--cpu --small`` is a dry run on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from gpu_check import calibtune_cli, write_cifar10  # noqa: E402


def bare_loop(args: argparse.Namespace, data: Path, precision: str, resident: bool) -> float:
    """Images/s of a plain training loop (SGD, cross-entropy, the dataset's augmentation)."""
    from torch.utils.data import DataLoader

    from calibtune.data import load_splits
    from calibtune.models import build_model
    from calibtune.training import DeviceBatches, Precision, epoch_index_batches

    dev = args.device
    s = load_splits("cifar10", root=str(data), seed=1, val_fraction=0.1)
    prec = Precision(precision, dev, channels_last=precision != "fp32")
    net = prec.prepare(build_model(args.model, 10, (3, 32, 32)).to(dev))
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    owner = DeviceBatches(s.train, dev, channels_last=prec.channels_last)
    rates = []
    for epoch in range(1, args.epochs + 1):
        idx = epoch_index_batches(len(s.train), 128, seed=1, epoch=epoch)
        if resident:
            batches = owner.batches(idx, train=True)
        else:
            pin, workers = dev.type == "cuda", args.loader_workers
            loader = DataLoader(
                s.train,
                batch_sampler=[b.tolist() for b in idx],
                num_workers=workers,
                pin_memory=pin,
            )
            batches = (
                (x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)) for x, y in loader
            )
        _sync(dev)
        t0 = time.perf_counter()
        for x, y in batches:
            if prec.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            loss = torch.nn.functional.cross_entropy(prec.forward(net, x), y)
            prec.step(loss, opt, net.parameters(), None)
        _sync(dev)
        rates.append(len(s.train) / (time.perf_counter() - t0))
    return statistics.median(rates[1:] or rates)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _calibtune(*argv: str, cwd: Path) -> str:
    return calibtune_cli(argv, cwd, dict(os.environ), timeout=1200)


def trial(args: argparse.Namespace, data: Path, work: Path, workers: int) -> tuple[float, str]:
    """(training images/s, wall vs epochs) of a calibtune trial at bare-loop row 3's settings."""
    name = f"bench_{workers}"
    cfg = {
        "name": name, "seed": 1,
        "data": {"name": "cifar10", "root": str(data), "ood": [], "shift": []},
        "model": {"name": args.model}, "loss": {"name": "cross_entropy"},
        "optimizer": {"lr": 0.05},
        "train": {"epochs": args.epochs, "batch_size": 128, "precision": "bf16",
                  "channels_last": True},
        "eval": {"posthoc": [], "bootstrap": 0, "figures": False},
        "scaling": {"num_workers": workers, "use_gpu": args.device.type == "cuda"},
    }  # fmt: skip
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    t0 = time.perf_counter()
    _calibtune("train", str(path), "--storage-path", str(work / "trials"), cwd=work)
    wall = time.perf_counter() - t0
    hist = (work / "trials" / name / "artifacts" / "history.jsonl").read_text().splitlines()
    rows = [json.loads(h) for h in hist]
    epochs = sum(r["epoch_time"] for r in rows)
    return max(r["samples_per_s"] for r in rows), f"wall {wall:.1f} s, epochs {epochs:.1f} s"


def packed(args: argparse.Namespace, data: Path, work: Path, gpu: float) -> float:
    """Wall time of a 4-trial small_cnn study at ``gpu`` GPUs per trial."""
    name = f"packed_{int(gpu * 100)}"
    study = {
        "name": name,
        "trial": {"data": {"name": "cifar10", "root": str(data), "ood": [], "shift": []},
                  "model": {"name": "small_cnn"}, "train": {"epochs": 2, "batch_size": 128},
                  "eval": {"posthoc": ["ts"], "bootstrap": 0},
                  "scaling": {"num_workers": 0, "use_gpu": args.device.type == "cuda",
                              "resources_per_worker": {"GPU": gpu, "CPU": 1}}},
        "losses": ["focal"],
        "space": {"optimizer.lr": {"type": "float", "low": 0.01, "high": 0.1}},
        "search": {"sampler": "random", "num_samples": 4, "max_concurrent": 4,
                   "objectives": [{"metric": "val/ece", "mode": "min"}]},
        "tracking": {"uri": f"sqlite:///{work / 'mlflow.db'}", "experiment": name},
        "storage": str(work / "studies"),
    }  # fmt: skip
    if args.device.type != "cuda":
        del study["trial"]["scaling"]["resources_per_worker"]["GPU"]
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(study))
    t0 = time.perf_counter()
    _calibtune("run", str(path), "--quiet", cwd=work)
    return time.perf_counter() - t0


BARE = [
    ("bare loop, fp32, DataLoader", "fp32", False),
    ("bare loop, bf16 + channels_last, DataLoader", "bf16", False),
    ("bare loop, bf16 + channels_last, resident", "bf16", True),
]


# one loss per kernel: the fused p_y kernel (focal, AdaFocal's schedule, dual focal, FCL's Brier
# term), label smoothing's scatter, and a regularised loss (MbLS)
COMPILED_DEFAULT = "focal,adafocal,dual_focal,fcl,label_smoothing,mbls"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--loader-workers", type=int, default=4)
    ap.add_argument("--compiled-losses", default=COMPILED_DEFAULT, help="row 8's losses, or all")
    ap.add_argument(
        "--model",
        help="network of rows 1-5 (default resnet50; small_cnn with --small): a paper study's "
        "seconds per epoch are 45,000 / its network's fp32 images/s",
    )
    args = ap.parse_args()
    if not args.cpu and not torch.cuda.is_available():
        print("bench_gpu: needs a CUDA GPU (none is visible here)")
        return 0
    args.device = torch.device("cpu" if args.cpu else "cuda")
    args.model = args.model or ("small_cnn" if args.small else "resnet50")
    torch.set_num_threads(1)
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="calibtune-bench-gpu-") as tmp:
        work, data = Path(tmp), Path(tmp) / "data"
        write_cifar10(data, 2_000 if args.small else 50_000, 500 if args.small else 10_000)
        for label, prec, res in BARE:
            rows.append((label, f"{bare_loop(args, data, prec, res):,.0f} img/s"))
        for label, workers in [("calibtune trial, local mode", 0), ("calibtune trial, worker", 1)]:
            rate, wall = trial(args, data, work, workers)
            rows.append((label, f"{rate:,.0f} img/s ({wall})"))
        one, four = packed(args, data, work, 1.0), packed(args, data, work, 0.25)
        rows.append(("packed study, 4 × small_cnn", f"{one:.1f} s one at a time, {four:.1f} s "
                     f"packed ({one / four:.2f}×)"))  # fmt: skip
    device = torch.cuda.get_device_name(0) if args.device.type == "cuda" else "CPU"
    print(f"device: {device}, torch {torch.__version__}\n\n| row | result |\n|---|---|")
    for label, result in rows:
        print(f"| {label} | {result} |")
    losses = [sys.executable, str(ROOT / "bench" / "bench_losses.py"), "--device",
              args.device.type, "--rounds", "10" if not args.small else "2"]  # fmt: skip
    print(subprocess.run(losses, capture_output=True, text=True, cwd=ROOT).stdout)
    which = "focal,adafocal" if args.small else args.compiled_losses
    compiled = [*losses, "--compiled-only", *([] if which == "all" else ["--losses", which])]
    print(subprocess.run(compiled, capture_output=True, text=True, cwd=ROOT).stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
