"""Command line: ``calibtune <subcommand>`` (argument parsing only; the work is in the library).

Subcommands: ``train`` (one trial outside any search, here) and the study service's run, submit,
resume, status, logs, compare, report, export and ui (`calibtune.commands._study`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from calibtune._commands import Command, OneOf, add_commands, arg
from calibtune._data_cli import DATA
from calibtune._lazy import exit_without_teardown, gc_paused
from calibtune._provenance import installed_versions, read_provenance, version_drift
from calibtune._usage import UsageError, bad_input_message
from calibtune.cluster import check_storage, init_ray, quiet_output
from calibtune.commands import COMMANDS as STUDY_COMMANDS
from calibtune.metrics import keys as K
from calibtune.study import train_progress

# Lazy: `calibtune.trial` (torch, Ray) is imported by `train` alone, so that `calibtune --help`
# and the study subcommands start in a fraction of a second (bench/bench_cli.py).

__all__ = ["SUBCOMMANDS", "build_parser", "command", "format_metrics_table", "main"]


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block): ``calibtune ui: error: argument --port:
    expected a port 1-65535, got '99999'`` and exit code 2, like every other bad input."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="calibtune",
        description="Calibration-aware training and hyperparameter studies on Ray.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_commands(sub, SUBCOMMANDS)
    return parser


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
    from calibtune.trial import load_config

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
    from calibtune.data import check_fetched

    try:
        check_fetched(cfg.data.name, cfg.data.root, cfg.data.ood, cfg.data.shift)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _cmd_train(args: argparse.Namespace) -> int:
    if not args.verbose:
        quiet_output()
    from calibtune.trial import TrialFailedError, run

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
        from calibtune.trial import check_resources, local_machine

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


#: the one subcommand defined here: a trial outside any search
TRAIN = Command(
    "run one trial (training, calibration, OOD evaluation) through Ray Train",
    _cmd_train,
    (
        arg("config", metavar="CONFIG.yaml", help="trial-config YAML file"),
        arg(
            "--num-workers",
            type=int,
            metavar="N",
            help="Ray Train workers (overrides scaling.num_workers; 0 = in-process local mode)",
        ),
        OneOf(
            (
                arg(
                    "--use-gpu",
                    dest="use_gpu",
                    action="store_true",
                    default=None,
                    help="one GPU per worker (overrides scaling.use_gpu)",
                ),
                arg(
                    "--no-use-gpu",
                    dest="use_gpu",
                    action="store_false",
                    help="CPU only (scaling.use_gpu=false)",
                ),
            )
        ),
        arg(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY.PATH=VALUE",
            help="override one config value, VALUE parsed as YAML (repeatable), "
            "e.g. --set train.epochs=5 --set loss.params.gamma=3",
        ),
        arg("--storage-path", help="directory for trial folders (overrides storage_path)"),
        arg("--name", help="trial name = its folder under the storage path (overrides name)"),
        arg(
            "--all-metrics",
            action="store_true",
            help="print every final metric (default: the main ones per method)",
        ),
        arg("--verbose", action="store_true", help="Ray's worker prefixes and logs"),
    ),
    "Run one trial described by a trial-config YAML file (format: docs/trial.md) through "
    "Ray Train, print the final metrics table and leave checkpoints and artifacts under "
    "<storage_path>/<name>/. Re-running the same config resumes from its latest checkpoint.",
)
#: every subcommand, in ``calibtune --help`` order: ``train``, then the study service's, then
#: ``data`` (fetch, verify)
SUBCOMMANDS: dict[str, Command] = {"train": TRAIN, **STUDY_COMMANDS, "data": DATA}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # named by the subcommand's parser: "calibtune run: error: unrecognized ..."
        sub = parser._subparsers._group_actions[0].choices[args.command]  # type: ignore[union-attr]
        sub.error(f"unrecognized arguments: {' '.join(extra)}")
    # only where this process is the command (argv from the command line): `gc_paused` keeps the
    # block's cyclic garbage until exit, which a longer-lived caller of `main([...])` would not want
    one_shot = SUBCOMMANDS[args.command].one_shot and argv is None
    try:
        with gc_paused() if one_shot else contextlib.nullcontext():
            return int(args.func(args))
    except UsageError as e:
        print(f"calibtune {args.command}: error: {e}".replace("\n", " "), file=sys.stderr)
        return 2


def command() -> None:
    """The ``calibtune`` executable and ``python -m calibtune``: `main` on the command line's
    arguments, then exit without the interpreter's teardown (`exit_without_teardown`). A Ray
    this process connected to or started is shut down first, directly: Ray's own exit hook
    pauses 0.5 s for worker logs still in flight, and every trial has ended by now."""
    code = main()
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()
    exit_without_teardown(code)


if __name__ == "__main__":
    command()
