"""Numerics demo: every calibration metric before and after every post-hoc method.

A fixed-seed synthetic classifier whose logits are the true logits scaled by 2.5 (so it is
over-confident, like the networks of Guo et al. 2017): labels are drawn from the true
probabilities, post-hoc methods are fitted on a validation split and evaluated on a test split.

Run: ``python -m calibtune.demo`` (``make quickstart``).
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd
import torch

from .metrics import REPORT_KEYS, calibration_report
from .posthoc import build_posthoc, list_posthoc


def synthetic_overconfident(
    n: int = 10_000, k: int = 10, scale: float = 2.5, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits (n, k) of an over-confident model and labels (n,) drawn from the true posterior.

    True logits z ~ N(0, 1.5²) per class; labels y ~ Categorical(softmax(z)); the model outputs
    ``scale · z``, i.e. it is calibrated exactly at temperature T = ``scale``.
    """
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=torch.float64) * 1.5
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    return z * scale, y


def demo_table(n: int = 10_000, seed: int = 0, n_bins: int = 15) -> pd.DataFrame:
    """Rows: ``uncalibrated`` and each registered post-hoc method; columns: the report metrics
    on the test half, plus the fitted parameters."""
    logits, labels = synthetic_overconfident(n=n, seed=seed)
    half = n // 2
    val_z, val_y, test_z, test_y = logits[:half], labels[:half], logits[half:], labels[half:]
    rows = {"uncalibrated": calibration_report(logits=test_z, labels=test_y, n_bins=n_bins)}
    fitted: dict[str, str] = {"uncalibrated": ""}
    for name in list_posthoc():
        method = build_posthoc(name).fit(val_z, val_y)
        rows[name] = calibration_report(
            probs=method.calibrate(test_z), labels=test_y, n_bins=n_bins
        )
        fitted[name] = ", ".join(f"{k}={v:.3g}" for k, v in method.params().items())
    table = pd.DataFrame.from_dict(rows, orient="index")[list(REPORT_KEYS)]
    table = table * 100  # percentages, as the papers report them
    table.insert(len(table.columns), "fitted", pd.Series(fitted))
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calibtune.demo", description=__doc__)
    parser.add_argument("--n", type=int, default=10_000, help="samples (half val, half test)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    table = demo_table(n=args.n, seed=args.seed)
    print(
        f"Synthetic over-confident classifier (N={args.n}, K=10, true T=2.5, seed={args.seed}); "
        "post-hoc fitted on the validation half, metrics (%) on the test half:\n"
    )
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.to_string(float_format=lambda v: f"{v:.2f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
