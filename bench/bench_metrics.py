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


if __name__ == "__main__":
    main()
