"""Issue 13 (trial overhead): the faster end-of-trial paths give what the plain paths gave."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from calibtune.metrics import keys as K
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


def _plain_final(val, val_y, test, test_y, posthoc, ood, n_bins=15):
    """The reference path: every method fitted and every probability computed afresh where it
    is used (what `evaluate_final` did before issue 13)."""
    from calibtune import metrics as M
    from calibtune.metrics import keys as K
    from calibtune.posthoc import build_posthoc

    def report(probs, labels, method, split):
        rep = M.calibration_report(probs=probs, labels=labels, n_bins=n_bins)
        return {K.key(split, k, method): float(v) for k, v in rep.items() if np.isscalar(v)}

    def probs(method, z):
        return torch.as_tensor(np.asarray(method.calibrate(z)))

    rep = M.calibration_report(logits=test, labels=test_y, n_bins=n_bins)
    out = {K.key("test", k): float(v) for k, v in rep.items() if np.isscalar(v)}
    for name in posthoc:
        m = build_posthoc(name).fit(val, val_y)
        out.update(report(probs(m, test).double(), test_y, name, "test"))
        out.update(report(probs(m, val).double(), val_y, name, "val"))
        out.update({K.posthoc_key(name, k): float(v) for k, v in m.params().items()})
        if name in ("ts", "focal_ts"):  # grid fits: T at the grid's first or last value
            edge = m.T in (min(m.temperatures), max(m.temperatures))
            out[K.posthoc_key(name, K.T_AT_EDGE)] = float(edge)
    ts = build_posthoc("ts").fit(val, val_y)
    for item in ood:
        for method in K.OOD_METHODS:
            if method:
                p_in, p_out = probs(ts, test), probs(ts, item.logits)
            else:
                p_in, p_out = (
                    torch.softmax(test.double(), 1),
                    torch.softmax(item.logits.double(), 1),
                )
            for score in K.OOD_SCORES:
                for measure, fn in (
                    ("auroc", M.ood_auroc),
                    ("aupr", M.ood_aupr),
                    ("fpr95", M.fpr_at_95_tpr),
                ):
                    out[K.ood_key(item.key, measure, score, method)] = fn(p_in, p_out, score)
    return out


def test_evaluate_final_equals_the_plain_reference_path() -> None:
    from calibtune.training import OODLogits, evaluate_final

    g = torch.Generator().manual_seed(5)
    val, test = (torch.randn(n, 10, generator=g) * 3 for n in (200, 250))
    val_y, test_y = (torch.randint(0, 10, (n,), generator=g) for n in (200, 250))
    ood = [OODLogits(k, torch.randn(150, 10, generator=g) * s) for k, s in (("a", 1), ("b/s2", 2))]
    posthoc = {"focal_ts": {}, "ts": {}}
    got = evaluate_final(val, val_y, test, test_y, posthoc=posthoc, ood=ood).metrics
    want = _plain_final(val, val_y, test, test_y, posthoc, ood)
    # the plain path predates the selective/refinement keys: those come from their own module
    # (tests/test_uncertainty.py checks their values)
    extra = {
        K.key(s, m, p) for s in ("val", "test") for m in K.FINAL_ONLY_KEYS for p in ("", *posthoc)
    }
    assert sorted(set(got) - extra) == sorted(want)
    assert set(got) - set(want) == extra
    assert {k: float(got[k]) for k in want} == {k: float(v) for k, v in want.items()}


def _run(tmp_path):
    from mlflow.tracking import MlflowClient

    from calibtune.record._tracking import experiment_id

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    return uri, client, client.create_run(experiment_id(uri, "x")).info.run_id


def test_background_epoch_logging_logs_every_epoch_once_before_the_final_metrics(tmp_path):
    import pickle

    from calibtune.record._tracking import MlflowTrialCallback

    uri, client, run_id = _run(tmp_path)
    cb = MlflowTrialCallback(uri, run_id, background=True)
    for e in (1, 2, 3):
        cb.on_epoch(e, {"val/ece": 0.1 * e})
    cb.on_epoch(2, {"val/ece": 9.0})  # already logged: skipped
    cb = pickle.loads(pickle.dumps(cb))  # with a batch possibly in flight (as to a worker)
    cb.on_trial_end({"test/ece@ts": 0.05}, None)
    hist = client.get_metric_history(run_id, "val/ece")
    assert sorted((m.step, round(m.value, 9)) for m in hist) == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert client.get_run(run_id).data.metrics["test/ece.ts"] == 0.05


def test_background_epoch_logging_raises_the_batch_error_at_the_next_flush(tmp_path):
    from mlflow.exceptions import MlflowException

    from calibtune.record._tracking import MlflowTrialCallback

    uri, client, run_id = _run(tmp_path)
    cb = MlflowTrialCallback(uri, run_id, background=True)
    cb.on_epoch(1, {"val/ece": 0.1})
    cb.flush()
    client.delete_run(run_id)
    cb.on_epoch(2, {"val/ece": 0.2})  # returns; the batch fails in its thread
    with pytest.raises(MlflowException, match="active"):
        cb.flush()
    cb.flush()  # the error is raised once
