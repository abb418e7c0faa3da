"""Trial-engine benchmarks; every ratio is measured within one run of this script.

1. AdaFocal epoch (training + validation pass + γ update) vs a cross-entropy epoch (training +
   the same validation pass, which every epoch does for its metrics): same model, data, seed.
   Epochs alternate between the two losses so that machine load hits both alike; medians.
2. A trial through Ray Train with 1 worker vs the same training in a bare PyTorch loop
   (`calibtune.training.train_epochs` in this process, torch limited to 1 thread like the
   1-CPU worker). Reported with and without Ray's fixed start-up cost.
3. The same trial with 2 workers (DDP, gloo) on this machine's cores: epoch-time scaling.

Usage: python bench/bench_trial.py [--quick]   (--quick: smaller sizes, for a smoke run)
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

import torch

from calibtune.data import load_splits
from calibtune.losses import build_loss
from calibtune.models import build_model
from calibtune.training import LoopSpec, lr_schedule, train_epochs
from calibtune.trial import config_from_dict, run

# Ray Train polls workers every 1 s by default; 0.2 s removes ~10 s of start-up per fit
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")


def _spec(dataset: str, model: str, loss: str, epochs: int, seed: int = 1) -> LoopSpec:
    torch.manual_seed(seed)
    s = load_splits(dataset, seed=seed)
    net = build_model(model, s.num_classes, s.input_shape)
    return LoopSpec(
        model=net,
        loss_fn=build_loss(loss),
        optimizer=torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4),
        lr_at=lr_schedule(0.05, "step", epochs, (round(3 * epochs / 7), round(5 * epochs / 7))),
        train_set=s.train,
        val_set=s.val,
        test_set=None,
        epochs=epochs,
        batch_size=128,
        augment=s.augment,
        test_every_epoch=False,
    )


def bench_adafocal_overhead(dataset: str, model: str, epochs: int) -> dict[str, float]:
    ce = _spec(dataset, model, "cross_entropy", epochs)
    ada = _spec(dataset, model, "adafocal", epochs)
    times: dict[str, list[float]] = {"cross_entropy": [], "adafocal": []}
    for e in range(1, epochs + 1):
        for name, spec in (("cross_entropy", ce), ("adafocal", ada)):
            spec.epochs = e  # one more epoch, resumed from the previous one
            t0 = time.perf_counter()
            train_epochs(spec, start_epoch=e - 1)
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v[1:]) for k, v in times.items()}  # epoch 1 warms caches
    low = {k: min(v[1:]) for k, v in times.items()}  # least disturbed by other processes
    return {
        "ce_epoch_s": med["cross_entropy"],
        "adafocal_epoch_s": med["adafocal"],
        "ratio": med["adafocal"] / med["cross_entropy"],
        "ratio_min": low["adafocal"] / low["cross_entropy"],
        "updates": len(ada.loss_fn.history),
    }


def bench_loss_cost(dataset: str, model: str, batch: int = 128) -> dict[str, float]:
    """Per-step cost split: loss forward+backward alone vs a whole model step, and one γ update."""
    s = load_splits(dataset)
    net = build_model(model, s.num_classes, s.input_shape)
    x, y = s.train.tensors[0][:batch], s.train.tensors[1][:batch]

    def per_call_ms(fn: Any, n: int) -> float:
        fn()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n * 1e3

    out: dict[str, float] = {}
    for name in ("cross_entropy", "adafocal"):
        loss = build_loss(name)
        z = torch.randn(batch, s.num_classes, requires_grad=True)
        out[f"{name}_loss_ms"] = per_call_ms(lambda: loss(z, y).backward(), 300)  # noqa: B023
        out[f"{name}_step_ms"] = per_call_ms(lambda: loss(net(x), y).backward(), 60)  # noqa: B023
    ada = build_loss("adafocal")
    probs = torch.softmax(torch.randn(len(s.val), s.num_classes), 1)
    labels = torch.randint(0, s.num_classes, (len(s.val),))
    out["update_ms"] = per_call_ms(lambda: ada.update(probs, labels), 30)
    return out


def _trial_cfg(storage: str, name: str, workers: int, epochs: int, dataset: str, model: str) -> Any:
    return config_from_dict(
        {
            "name": name,
            "storage_path": storage,
            "data": {"name": dataset, "ood": []},
            "model": {"name": model},
            "loss": {"name": "adafocal"},
            "optimizer": {"lr": 0.05},
            "train": {"epochs": epochs, "batch_size": 128, "checkpoint_every": epochs},
            "eval": {"posthoc": [], "test_every_epoch": False, "figures": False},
            "scaling": {"num_workers": workers},
        }
    )


def bench_ray_vs_bare(epochs: int, dataset: str, model: str, reps: int) -> dict[str, Any]:
    """Bare loop and 1-worker trial alternate ``reps`` times (machine load hits both alike)."""
    import ray

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    storage = tempfile.mkdtemp(prefix="bench-trial-")
    out: dict[str, Any] = {"bare_s": [], "bare_epochs_s": [], "ray1_s": [], "ray1_epochs_s": []}
    threads = torch.get_num_threads()
    for rep in range(reps):
        torch.set_num_threads(1)  # a 1-CPU Ray worker runs torch with OMP_NUM_THREADS=1
        spec = _spec(dataset, model, "adafocal", epochs)
        epoch_times: list[float] = []
        t0 = time.perf_counter()
        train_epochs(spec, on_epoch_end=lambda e, m, c: epoch_times.append(m["epoch_time"]))  # noqa: B023
        out["bare_s"].append(time.perf_counter() - t0)
        out["bare_epochs_s"].append(sum(epoch_times))
        torch.set_num_threads(threads)
        t0 = time.perf_counter()
        res = run(_trial_cfg(storage, f"w1_{rep}", 1, epochs, dataset, model))
        out["ray1_s"].append(time.perf_counter() - t0)
        out["ray1_epochs_s"].append(sum(h["epoch_time"] for h in res.history))
    t0 = time.perf_counter()
    res = run(_trial_cfg(storage, "w2", 2, epochs, dataset, model))
    out["ray2_s"] = time.perf_counter() - t0
    out["ray2_epochs_s"] = sum(h["epoch_time"] for h in res.history)
    ray.shutdown()
    out["load_after"] = os.getloadavg()[0]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    ap.add_argument("--epochs", type=int, default=None, help="epochs of the Ray-vs-bare trial")
    args = ap.parse_args()

    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, load {os.getloadavg()}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small models on a shared machine: avoid oversubscription noise
    ada_epochs = 4 if args.quick else 20
    for dataset, model in (("digits", "small_cnn"), ("mnist1d", "cnn1d")):
        r = bench_adafocal_overhead(dataset, model, ada_epochs)
        print(
            f"[1] {dataset}/{model}: CE epoch {r['ce_epoch_s'] * 1e3:.1f} ms, AdaFocal epoch "
            f"{r['adafocal_epoch_s'] * 1e3:.1f} ms (incl. {int(r['updates'])} γ updates in "
            f"{ada_epochs} epochs) -> ratio of medians {r['ratio']:.3f}, of minima "
            f"{r['ratio_min']:.3f} (target <= 1.05)"
        )
        c = bench_loss_cost(dataset, model)
        print(
            f"    per step (batch 128): loss fwd+bwd CE {c['cross_entropy_loss_ms']:.3f} ms, "
            f"AdaFocal {c['adafocal_loss_ms']:.3f} ms; model+loss step CE "
            f"{c['cross_entropy_step_ms']:.2f} ms, AdaFocal {c['adafocal_step_ms']:.2f} ms; "
            f"one γ update {c['update_ms']:.2f} ms"
        )
    torch.set_num_threads(threads)

    epochs = args.epochs or (3 if args.quick else 250)
    reps = 1 if args.quick else 2
    r = bench_ray_vs_bare(epochs, "mnist1d", "cnn1d", reps)
    for k in range(reps):
        print(
            f"[2] rep {k + 1}: {epochs}-epoch AdaFocal trial mnist1d/cnn1d: bare loop "
            f"{r['bare_s'][k]:.1f} s; Ray Train 1 worker {r['ray1_s'][k]:.1f} s end to end, "
            f"{r['ray1_epochs_s'][k]:.1f} s in epochs -> epoch ratio "
            f"{r['ray1_epochs_s'][k] / r['bare_epochs_s'][k]:.3f}; fixed start-up + final "
            f"evaluation {r['ray1_s'][k] - r['ray1_epochs_s'][k]:.1f} s"
        )
    bare, ray1 = sum(r["bare_epochs_s"]), sum(r["ray1_epochs_s"])
    print(
        f"    pooled: Ray 1 worker / bare = {ray1 / bare:.3f} (target <= 1.10) excluding start-up; "
        f"end to end {sum(r['ray1_s']) / sum(r['bare_s']):.3f}"
    )
    print(
        f"[3] 2 workers (gloo DDP): {r['ray2_s']:.1f} s end to end, "
        f"epochs {r['ray2_epochs_s']:.1f} s -> epoch speed-up vs 1 worker "
        f"{(ray1 / reps) / r['ray2_epochs_s']:.2f}x"
    )
    print(f"    load average after the runs: {r['load_after']:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
