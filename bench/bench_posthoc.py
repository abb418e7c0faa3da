"""Post-hoc calibration fits: vectorised grid search vs a naive loop over the grid, one run.

Data: a fixed-seed over-confident classifier, validation logits N × K (default 5000 × 100,
labels drawn from softmax(z / 2)). Timed, each measured in this run on the same data:

* ``ts``: `TemperatureScaling` (criterion ece, 100-point grid T = 0.1 … 10). Naive baseline:
  ``for T in grid: metrics.ece(torch.softmax(z / T, 1), y)``, argmin. Target ≤ 0.3 s.
* ``focal_ts``: `FocalTemperatureScaling` (default 9 × 500 grid, equal-mass ECE). Naive baseline:
  ``for γ, T: metrics.adaece(focal_calibration_map(torch.softmax(z / T, 1), γ), y)``. Target
  ≤ 10 s. ``--quick`` times the naive loop on every 10th T only and extrapolates (×10, printed
  as such); its choice then comes from that coarser grid and may differ.
* ``ts_nll``, ``ets``, ``spline``: fit times only (no grid).
* ``--new``: only the issue-14 methods (vector/matrix scaling, Dirichlet-ODIR, histogram binning,
  isotonic) and ``ts_nll`` as the reference, fit and calibrate (on the same N × K logits) timed
  in alternation — each round times every method once — and reported as medians and as ratios
  to ``ts_nll``'s fit in the same run.

Both wall time and this process's CPU time are printed: on a shared, loaded machine the wall
time of multi-threaded torch ops can be several times the CPU time. Vectorised fits report the
median of ``--repeats`` runs after a warm-up; the naive loops run once. The chosen parameters of
the vectorised and naive searches are printed side by side (they must agree).
Run: ``python bench/bench_posthoc.py [--threads 2] [--n 5000] [--k 100] [--quick] [--new]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from calibtune import metrics as M
from calibtune.posthoc import (
    DEFAULT_FOCAL_TEMPERATURES,
    DEFAULT_GAMMAS,
    DEFAULT_TEMPERATURES,
    build_posthoc,
    focal_calibration_map,
)


def _timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w0, time.process_time() - c0, out


def _median_timed(fn: Callable[[], Any], repeats: int) -> tuple[float, float, Any]:
    fn()
    runs = [_timed(fn) for _ in range(repeats)]
    return (
        statistics.median(r[0] for r in runs),
        statistics.median(r[1] for r in runs),
        runs[-1][2],
    )


def naive_ts(z: torch.Tensor, y: torch.Tensor) -> float:
    scores = [M.ece(torch.softmax(z / t, 1), y) for t in DEFAULT_TEMPERATURES]
    return DEFAULT_TEMPERATURES[min(range(len(scores)), key=scores.__getitem__)]


def naive_focal_ts(
    z: torch.Tensor, y: torch.Tensor, temps: tuple[float, ...]
) -> tuple[float, float]:
    best = (float("inf"), 0.0, 0.0)
    for t in temps:
        q = torch.softmax(z / t, 1)
        for g in DEFAULT_GAMMAS:
            s = M.adaece(focal_calibration_map(q, g), y)
            if s < best[0]:
                best = (s, t, g)
    return best[1], best[2]


NEW_METHODS = ("vector_scaling", "matrix_scaling", "dirichlet", "hist_binning", "isotonic")


def bench_new(z: torch.Tensor, y: torch.Tensor, repeats: int) -> None:
    """Fit and calibrate times of the issue-14 methods, alternating methods within each round."""
    names = ("ts_nll", *NEW_METHODS)
    for name in names:  # warm-up
        build_posthoc(name).fit(z, y).calibrate(z)
    fit_s: dict[str, list[float]] = {n: [] for n in names}
    cal_s: dict[str, list[float]] = {n: [] for n in names}
    fitted: dict[str, Any] = {}
    for _ in range(repeats):
        for name in names:
            wall, _, m = _timed(lambda name=name: build_posthoc(name).fit(z, y))
            fit_s[name].append(wall)
            wall, _, _ = _timed(lambda m=m: m.calibrate(z))
            cal_s[name].append(wall)
            fitted[name] = m
    ref = statistics.median(fit_s["ts_nll"])
    width = max(len(n) for n in names)
    print(f"{'method':<{width}}  {'fit s':>8}  {'x ts_nll':>8}  {'calibrate s':>11}  params")
    for name in names:
        f, c = statistics.median(fit_s[name]), statistics.median(cal_s[name])
        shown = {k: round(v, 4) for k, v in list(fitted[name].params().items())[:3]}
        print(f"{name:<{width}}  {f:8.3f}  {f / ref:8.1f}  {c:11.4f}  {shown}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    ap.add_argument("--n", type=int, default=5000, help="validation samples")
    ap.add_argument("--k", type=int, default=100, help="classes")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each vectorised fit")
    ap.add_argument("--quick", action="store_true", help="naive focal loop on every 10th T only")
    ap.add_argument("--new", action="store_true", help="only the issue-14 methods (+ ts_nll)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    g = torch.Generator().manual_seed(0)
    z = torch.randn(args.n, args.k, generator=g) * 3
    y = torch.multinomial(torch.softmax(z.double() / 2.0, 1), 1, generator=g).squeeze(1)
    print(
        f"validation logits {args.n} x {args.k}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s)"
    )
    if args.new:
        bench_new(z, y, args.repeats)
        return
    rows: list[tuple[str, float, float, str]] = []

    wall, cpu, ts = _median_timed(lambda: build_posthoc("ts").fit(z, y), args.repeats)
    rows.append(("ts (100-point grid, ECE)", wall, cpu, f"T={ts.T}"))
    n_wall, n_cpu, n_t = _timed(lambda: naive_ts(z, y))
    rows.append(("  naive loop over the grid", n_wall, n_cpu, f"T={n_t}"))
    ts_ratio = n_wall / wall

    wall, cpu, fts = _median_timed(lambda: build_posthoc("focal_ts").fit(z, y), args.repeats)
    rows.append(("focal_ts (9 x 500 grid, AdaECE)", wall, cpu, f"{fts.params()}"))
    temps = DEFAULT_FOCAL_TEMPERATURES[::10] if args.quick else DEFAULT_FOCAL_TEMPERATURES
    n_wall, n_cpu, (n_t, n_g) = _timed(lambda: naive_focal_ts(z, y, temps))
    scale = len(DEFAULT_FOCAL_TEMPERATURES) / len(temps)
    label = "  naive loop over the grid" + (" (1/10 of T, x10)" if args.quick else "")
    rows.append((label, n_wall * scale, n_cpu * scale, f"T={n_t}, gamma_ev={n_g}"))
    focal_ratio = n_wall * scale / wall

    for name in ("ts_nll", "ets", "spline"):
        wall, cpu, m = _median_timed(lambda name=name: build_posthoc(name).fit(z, y), args.repeats)
        params = m.params()
        shown = {k: round(v, 4) for k, v in list(params.items())[:4]}
        rows.append((name, wall, cpu, f"{shown}"))

    width = max(len(r[0]) for r in rows)
    print(f"{'fit':<{width}}  {'wall s':>8}  {'cpu s':>8}  chosen")
    for name, wall, cpu, chosen in rows:
        print(f"{name:<{width}}  {wall:8.3f}  {cpu:8.3f}  {chosen}")
    print(f"speed-up vs naive (wall): ts {ts_ratio:.1f}x, focal_ts {focal_ratio:.1f}x")


if __name__ == "__main__":
    main()
