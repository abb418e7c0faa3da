"""`calibtune train`: one trial outside any search, through Ray Train, and its final metrics
as text (`format_metrics_table`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from calibtune._provenance import installed_versions, read_provenance, version_drift
from calibtune._usage import UsageError, bad_input_message
from calibtune.cluster import check_storage, init_ray
from calibtune.data import check_fetched
from calibtune.metrics import keys as K
from calibtune.study import train_progress
from calibtune.trial import (
    TrialFailedError,
    check_resources,
    load_config,
    local_machine,
    run,
)

__all__ = ["format_metrics_table", "train"]

_MAIN_KEYS = ("error", "ece", "adaece", "classwise_ece", "nll", "brier", "smece")


_OOD_COLS = ("auroc", "aupr", "fpr95", "auroc_msp", "auroc@ts", "auroc_msp@ts")


def _row(label: str, values: Sequence[float | None], scale: float, width: int) -> str:
    cells = "".join(f"{'-':>14}" if v is None else f"{scale * v:>14.3f}" for v in values)
    return f"{label:<{width}}{cells}"


def _parsed(metrics: dict[str, float]) -> list[Any]:
    out = []
    for k in metrics:
        try:
            out.append(K.parse(k))
        except ValueError:
            continue
    return out


def format_metrics_table(metrics: dict[str, float], all_metrics: bool = False) -> str:
    """Final metrics as text: test metrics (%) per post-hoc method, OOD metrics per set, fitted
    post-hoc parameters. ``all_metrics`` adds every report column and OOD metric."""
    keys = [k for k in _parsed(metrics) if not k.stat]
    test = [k for k in keys if k.split == "test"]
    methods = ["", *sorted({k.method for k in test if k.method})]
    cols = [c for c in _MAIN_KEYS if any(k.name == c and not k.method for k in test)]
    if all_metrics:
        cols = sorted({k.name for k in test})
    lines = ["test metrics (%):", f"{'method':<14}" + "".join(f"{c:>14}" for c in cols)]
    for m in methods:
        values = [metrics.get(f"test/{c}@{m}" if m else f"test/{c}") for c in cols]
        lines.append(_row(m or "uncalibrated", values, 100, 14))
    lines += _ood_lines(metrics, [k for k in keys if k.split == "ood"], all_metrics)
    params = sorted(str(k) for k in keys if k.split == "posthoc")
    if params:
        width = max(len(k) for k in params)
        lines += ["", "post-hoc parameters (fitted on validation):"]
        lines += [f"{k:<{width}}  {metrics[k]:.4f}" for k in params]
    return "\n".join(lines)


def _ood_lines(metrics: dict[str, float], ood: list[Any], all_metrics: bool) -> list[str]:
    sources = sorted({K.ood_source(k.ood, k.severity) for k in ood})
    if not sources:
        return []
    cols = list(_OOD_COLS)
    if all_metrics:
        cols = sorted({f"{k.name}@{k.method}" if k.method else k.name for k in ood})
    w = max(14, *(len(s) + 2 for s in sources))
    lines = ["", "OOD detection (entropy score unless _msp; @ts = after temperature scaling):"]
    lines.append(f"{'set':<{w}}" + "".join(f"{c:>14}" for c in cols))
    for src in sources:
        lines.append(_row(src, [metrics.get(f"ood/{src}/{c}") for c in cols], 1, w))
    return lines


def _train_config(args: argparse.Namespace, overrides: list[str]) -> Any:
    """The validated trial config of `calibtune train`, its storage folder checked."""
    path = args.config
    if os.path.isdir(path):
        raise UsageError(f"CONFIG.yaml: expected a trial-config file, got a directory: {path}")
    if not os.path.exists(path):
        raise UsageError(f"{path}: no such file")
    try:
        cfg = load_config(path, overrides)
        key = "--storage-path" if args.storage_path else f"{path}: storage_path"
        check_storage(cfg.storage_path, key)
    except Exception as exc:
        message = bad_input_message(exc, path)
        if message is None or os.environ.get("CALIBTUNE_DEBUG"):
            raise
        raise UsageError(message) from None
    return cfg


def _warn_version_drift(path: str) -> None:
    """One line on stderr when an exported config's recorded library versions differ from the
    installed ones (the results may then differ from the study's)."""
    try:
        prov = read_provenance(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return
    if not prov:  # not exported: nothing to compare, and no import of every library (mlflow)
        return
    drift = version_drift(prov, installed_versions())
    if drift:
        print(
            f"calibtune train: warning: {path} was exported with other versions "
            f"({', '.join(drift)}); results may differ from its study's",
            file=sys.stderr,
        )


def _check_fetched(cfg: Any) -> None:
    """Refuse, before Ray starts, a set fetched by ``calibtune data fetch`` whose files changed
    since (one ``os.stat`` per file against the fetch record; docs/data.md)."""
    try:
        check_fetched(cfg.data.name, cfg.data.root, cfg.data.ood, cfg.data.shift)
    except ValueError as e:
        raise UsageError(str(e)) from None


def train(args: argparse.Namespace) -> int:
    overrides = list(args.overrides)
    if args.num_workers is not None:
        if args.num_workers < 0:
            raise UsageError(f"--num-workers: expected an integer >= 0, got {args.num_workers}")
        overrides.append(f"scaling.num_workers={args.num_workers}")
    if args.use_gpu is not None:
        overrides.append(f"scaling.use_gpu={'true' if args.use_gpu else 'false'}")
    if args.storage_path:
        overrides.append(f"storage_path={args.storage_path}")
    if args.name:
        overrides.append(f"name={args.name}")
    cfg = _train_config(args, overrides)
    _warn_version_drift(args.config)
    _check_fetched(cfg)
    # workers on a local Ray: their output (Ray Train's lines, worker prefixes) stays in Ray's
    # logs unless --verbose; the epoch lines are relayed (on a cluster they come prefixed)
    local_ray = "RAY_ADDRESS" not in os.environ
    if cfg.scaling.num_workers and local_ray:  # refused before a local Ray starts
        have, where = local_machine()
        try:
            check_resources(cfg, have, where)
        except ValueError as e:
            raise UsageError(f"{args.config}: {e}, or set RAY_ADDRESS to a cluster's") from None
    relay = bool(cfg.scaling.num_workers) and not args.verbose and local_ray
    if relay:
        init_ray(None, verbose=False)
    try:
        with train_progress(cfg.train.epochs, relay) as lines:
            result = run(cfg, callbacks=[lines])
    except ValueError as e:  # missing dataset files, too few CPUs/GPUs for the scaling
        raise UsageError(str(e)) from None
    except TrialFailedError as e:
        print(f"calibtune train: trial failed: {e}", file=sys.stderr)
        return 1
    print(format_metrics_table(result.metrics, args.all_metrics))
    where = (result.trial_dir / "artifacts").uri
    print(f"\n{result.epochs_completed} epochs; artifacts in {where}")
    return 0
