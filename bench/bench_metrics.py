"""calibration_report on 10k×100 probabilities vs the same numbers from the reference packages.

Baseline: torchmetrics (ECE l1, MCE, classwise ECE as K binary calls), netcal (equal-mass ECE),
relplot (smECE) and uncertainty-calibration (debiased ECE), each called separately as a user
without calibtune would. ECE_SWEEP has no package implementation and is not in the baseline.
One torch thread; the clock is the process's CPU time (``time.process_time``), so other processes
on a shared machine do not inflate it. After a warm-up of each, ``--rounds`` rounds time one call
of ours and one of the baseline back to back (alternating); the ratio printed is min(baseline) /
min(ours): interference only ever adds time, so the minima are the cleanest estimates.
Run: ``python bench/bench_metrics.py [--rounds 9]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from calibtune.metrics import calibration_report


def _cpu_time(fn: Callable[[], object]) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def _alternating_minima(
    a: Callable[[], object], b: Callable[[], object], rounds: int
) -> tuple[float, float]:
    """min CPU time of ``a`` and of ``b`` over ``rounds`` alternating calls, after a warm-up."""
    a(), b()
    times_a, times_b = [], []
    for _ in range(rounds):
        times_a.append(_cpu_time(a))
        times_b.append(_cpu_time(b))
    return min(times_a), min(times_b)


def main() -> None:
    import calibration as cal
    import relplot
    from netcal.metrics import ECE as NetcalECE
    from torchmetrics.functional.classification import (
        binary_calibration_error,
        multiclass_calibration_error,
    )

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    n, k = 10_000, 100
    probs = torch.softmax(torch.randn(n, k, generator=g) * 3, 1)
    labels = torch.multinomial(probs, 1, generator=g).squeeze(1)
    probs_np, labels_np = probs.numpy().astype(np.float64), labels.numpy()

    def baseline() -> dict[str, float]:
        conf, pred = probs.max(1)
        correct = (pred == labels).double().numpy()
        onehot = torch.nn.functional.one_hot(labels, k)
        return {
            "ece": float(multiclass_calibration_error(probs, labels, k, n_bins=15, norm="l1")),
            "mce": float(multiclass_calibration_error(probs, labels, k, n_bins=15, norm="max")),
            "classwise_ece": float(
                np.mean(
                    [
                        float(binary_calibration_error(probs[:, c], onehot[:, c], n_bins=15))
                        for c in range(k)
                    ]
                )
            ),
            "adaece": float(NetcalECE(bins=15, equal_intervals=False).measure(probs_np, labels_np)),
            "smece": float(relplot.smECE(conf.double().numpy(), correct)),
            "ece_debiased": float(
                cal.lower_bound_scaling_ce(
                    probs_np,
                    labels_np,
                    p=2,
                    debias=True,
                    num_bins=15,
                    binning_scheme=cal.get_equal_bins,
                    mode="top-label",
                )
            ),
            "nll": float(torch.nn.functional.nll_loss(probs.log(), labels)),
            "brier": float((probs - onehot).square().sum(1).mean()),
        }

    ours_t, base_t = _alternating_minima(
        lambda: calibration_report(probs=probs, labels=labels), baseline, args.rounds
    )
    ours, ref = calibration_report(probs=probs, labels=labels), baseline()
    print(f"calibration_report 10k x 100 (all {len(ours)} metrics): {ours_t * 1e3:8.1f} ms")
    print(f"reference packages ({len(ref)} metrics):             {base_t * 1e3:8.1f} ms")
    print(f"speed-up: {base_t / ours_t:.1f}x")
    print("agreement (ours - reference):")
    for key, val in ref.items():
        print(f"  {key:14s} {ours[key] - val:+.2e}")


def bootstrap_case(rounds: int = 3, n_resamples: int = 1000, loop_resamples: int = 10) -> None:
    """Bootstrap CIs (issue 14) on the same 10k x 100 problem, cases alternated in each round:
    the vectorised `bootstrap_values` of every report metric but smECE over ``n_resamples``
    resamples, a plain loop of the report's own metric functions (smECE left out) over
    ``loop_resamples`` of the same resamples, and smECE alone per resample (relplot). Prints the
    median per case, the loop's per-resample cost extrapolated to ``n_resamples`` and the ratio.
    Run: ``python bench/bench_metrics.py bootstrap``."""

    from calibtune.metrics import bootstrap_indices, bootstrap_values
    from calibtune.metrics.keys import BOOTSTRAP_KEYS

    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(0)
    n, k = 10_000, 100
    logits = torch.randn(n, k, generator=g) * 3
    labels = torch.multinomial(torch.softmax(logits, 1), 1, generator=g).squeeze(1)
    idx = bootstrap_indices(n, n_resamples, seed=0)

    def vectorised() -> object:
        return bootstrap_values(logits=logits, labels=labels, indices=idx, metrics=BOOTSTRAP_KEYS)

    def loop() -> object:
        from calibtune.metrics import _calibration as C  # the report's own metric functions

        funcs = {
            "ece": C._ece,
            "adaece": C._adaece,
            "classwise_ece": C._classwise_ece,
            "mce": C._mce,
            "ece_debiased": C._ece_debiased,
        }
        out = []
        for b in range(loop_resamples):
            z, y = logits[idx[b]], labels[idx[b]]
            log_p = torch.log_softmax(z.double(), 1)
            prep = C._Prepared(log_p.exp(), y)
            r = {m: f(prep, 15) for m, f in funcs.items()}
            r["nll"] = float(-log_p.gather(1, y[:, None]).mean())
            r.update(brier=C._brier(prep), error=float(1 - prep.correct64.mean()))
            r["ece_sweep"] = C._ece_sweep(prep)
            out.append(r)
        return out

    def smece() -> object:
        return bootstrap_values(logits=logits, labels=labels, indices=idx[:3], metrics=["smece"])

    times: dict[str, list[float]] = {"vectorised": [], "loop": [], "smece": []}
    print(f"load average before: {os.getloadavg()}")
    for _ in range(rounds):
        for name, fn in (("vectorised", vectorised), ("loop", loop), ("smece", smece)):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    print(f"load average after:  {os.getloadavg()}")
    vec = statistics.median(times["vectorised"])
    per_loop = statistics.median(times["loop"]) / loop_resamples
    per_smece = statistics.median(times["smece"]) / 3
    print(
        f"vectorised bootstrap, {n_resamples} resamples x {len(BOOTSTRAP_KEYS)} metrics: "
        f"{vec:.2f} s"
    )
    print(f"plain loop (report functions, no smECE): {per_loop * 1e3:.1f} ms/resample")
    print(
        f"  -> {per_loop * n_resamples:.1f} s for {n_resamples}; ratio loop/vectorised "
        f"{per_loop * n_resamples / vec:.1f}x"
    )
    print(
        f"smECE alone (relplot): {per_smece * 1e3:.1f} ms/resample "
        f"-> {per_smece * n_resamples:.1f} s for {n_resamples}"
    )


def _bootstrap_module(checkout: str | None) -> object:
    """This checkout's `calibtune.metrics._bootstrap`, or the one in ``checkout`` (loaded as a
    sibling module of this package, so its relative imports resolve here)."""
    import importlib.util

    from calibtune.metrics import _bootstrap

    if checkout is None:
        return _bootstrap
    path = f"{checkout}/calibtune/metrics/_bootstrap.py"
    spec = importlib.util.spec_from_file_location("calibtune.metrics._bootstrap_other", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sweep_case(against: str | None = None, rounds: int = 9) -> None:
    """Bootstrap CIs of the trial-sized problems (issue 13, target 1): N = 359 (the digits test
    split), K = 10, 200 resamples (a trial's default), for an accurate model (logit margin 4:
    most resamples stay monotone to large bin counts, so the sweep ECE dominates) and a poor one
    (margin 2: the sweep stops early), and N = 10k, K = 100, 1000 resamples; this checkout
    alternated with ``against`` (another checkout) in each round, medians, one thread.
    Run: ``python bench/bench_metrics.py sweep [OTHER_CHECKOUT]``."""
    from calibtune.metrics.keys import BOOTSTRAP_KEYS

    torch.set_num_threads(1)
    mods = {"this": _bootstrap_module(None)}
    if against:
        mods["against"] = _bootstrap_module(against)
    print(f"load average before: {os.getloadavg()}")
    for n, k, b, margin in ((359, 10, 200, 4.0), (359, 10, 200, 2.0), (10_000, 100, 1000, 4.0)):
        g = torch.Generator().manual_seed(0)
        y = torch.randint(0, k, (n,), generator=g)
        z = torch.randn(n, k, generator=g)
        z[torch.arange(n), y] += margin
        p = torch.softmax(z.double(), 1)
        idx = mods["this"].bootstrap_indices(n, b, 0)
        times: dict[str, list[float]] = {name: [] for name in mods}
        for r in range(rounds):
            for name in mods if r % 2 else reversed(list(mods)):
                t0 = time.perf_counter()
                mods[name].bootstrap_values(probs=p, labels=y, indices=idx, metrics=BOOTSTRAP_KEYS)
                times[name].append(time.perf_counter() - t0)
        med = {name: statistics.median(t) for name, t in times.items()}
        line = ", ".join(f"{name} {t * 1e3:.1f} ms" for name, t in med.items())
        ratio = f" (against/this {med['against'] / med['this']:.2f}x)" if against else ""
        print(f"N={n} K={k} B={b} margin {margin}: {line}{ratio}")
    print(f"load average after:  {os.getloadavg()}")


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["bootstrap"]:
        bootstrap_case()
    elif sys.argv[1:2] == ["sweep"]:
        sweep_case(sys.argv[2] if len(sys.argv) > 2 else None)
    else:
        main()
