"""Issue 13 (trial overhead): the faster end-of-trial paths give what the plain paths gave."""

from __future__ import annotations

import pytest
import torch

from calibtune.posthoc import FocalTemperatureScaling
from calibtune.posthoc._focal import focal_top_label_grid
from calibtune.posthoc._grid import binned_criterion_grid


@pytest.mark.parametrize("criterion", ["ece", "adaece"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_focal_ts_batched_curve_equals_one_call_per_temperature(criterion, dtype) -> None:
    g = torch.Generator().manual_seed(3)
    z = (torch.randn(300, 10, generator=g, dtype=torch.float64) * 3).to(dtype)
    y = torch.randint(0, 10, (300,), generator=g)
    fitted = FocalTemperatureScaling(criterion=criterion).fit(z, y)
    gam = torch.tensor(fitted.gammas, dtype=torch.float64)
    temps = torch.tensor(fitted.temperatures, dtype=torch.float64)
    ref = torch.empty(gam.numel(), temps.numel(), dtype=torch.float64)
    for ts, vals, correct in focal_top_label_grid(z, y, gam, temps):
        for j in range(ts.stop - ts.start):  # the plain path: one criterion call per T
            ref[:, ts.start + j] = binned_criterion_grid(criterion, vals[:, j], correct, 15)
    assert torch.equal(fitted.curve, ref)
