"""Command line: ``calibtune <subcommand>`` (argument parsing only; the work is in the library).

Subcommands: ``train`` (one trial outside any search, here) and the study service's run, submit,
resume, status, logs, compare, report, export and ui (`calibtune.study._cli`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["SUBCOMMANDS", "bad_input_message", "build_parser", "format_metrics_table", "main"]


class _UsageError(Exception):
    """Bad input: reported as one line on stderr with exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block): ``calibtune ui: error: argument --port:
    expected a port 1-65535, got '99999'`` and exit code 2, like every other bad input."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def bad_input_message(exc: BaseException, path: str | os.PathLike[str] | None = None) -> str | None:
    """One line for an exception that bad input raises (a rejected value, a missing, unreadable
    or misplaced file, bytes that are not UTF-8, YAML that does not parse), else None.

    ``path`` names the file being read when the exception does not (UnicodeDecodeError)."""
    import yaml

    name = getattr(exc, "filename", None) or path or "input"
    if isinstance(exc, UnicodeDecodeError):
        return f"{name}: expected UTF-8 text, got a byte it cannot decode at offset {exc.start}"
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"{name}: expected a file or folder, found nothing at that path"
    if isinstance(exc, (ValueError, FileNotFoundError)):
        return " ".join(str(exc).split())
    if isinstance(exc, IsADirectoryError):
        return f"{name}: expected a file, got a directory"
    if isinstance(exc, NotADirectoryError):
        return f"{name}: expected a path through directories, got a file in the way"
    if isinstance(exc, PermissionError):
        return f"{name}: expected a path this user may read and write, got permission denied"
    if isinstance(exc, yaml.YAMLError):
        return f"{name}: expected valid YAML, got {' '.join(str(exc).split())[:200]}"
    return None


def _add_train(sub: Any) -> None:
    p = sub.add_parser(
        "train",
        help="run one trial (training, calibration, OOD evaluation) through Ray Train",
        description=(
            "Run one trial described by a trial-config YAML file (format: docs/trial.md) "
            "through Ray Train, print the final metrics table and leave checkpoints and "
            "artifacts under <storage_path>/<name>/. Re-running the same config resumes from "
            "its latest checkpoint."
        ),
    )
    p.add_argument("config", metavar="CONFIG.yaml", help="trial-config YAML file")
    p.add_argument(
        "--num-workers",
        type=int,
        metavar="N",
        help="Ray Train workers (overrides scaling.num_workers; 0 = in-process local mode)",
    )
    gpu = p.add_mutually_exclusive_group()
    gpu.add_argument(
        "--use-gpu",
        dest="use_gpu",
        action="store_true",
        default=None,
        help="one GPU per worker (overrides scaling.use_gpu)",
    )
    gpu.add_argument(
        "--no-use-gpu",
        dest="use_gpu",
        action="store_false",
        help="CPU only (scaling.use_gpu=false)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override one config value, VALUE parsed as YAML (repeatable), "
        "e.g. --set train.epochs=5 --set loss.params.gamma=3",
    )
    p.add_argument("--storage-path", help="directory for trial folders (overrides storage_path)")
    p.add_argument("--name", help="trial name = its folder under the storage path (overrides name)")
    p.add_argument(
        "--all-metrics",
        action="store_true",
        help="print every final metric (default: the main ones per method)",
    )
    p.set_defaults(func=_cmd_train)


#: subcommand name -> function adding its parser; the study service registers its own here.
SUBCOMMANDS: dict[str, Callable[[Any], None]] = {"train": _add_train}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="calibtune",
        description="Calibration-aware training and hyperparameter studies on Ray.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    from calibtune.study._cli import COMMANDS as study_commands

    for add in {**SUBCOMMANDS, **study_commands}.values():
        add(sub)
    return parser


_MAIN_KEYS = ("error", "ece", "adaece", "classwise_ece", "nll", "brier", "smece")
_OOD_COLS = ("auroc", "aupr", "fpr95", "auroc_msp", "auroc@ts", "auroc_msp@ts")


def _row(label: str, values: Sequence[float | None], scale: float, width: int) -> str:
    cells = "".join(f"{'-':>14}" if v is None else f"{scale * v:>14.3f}" for v in values)
    return f"{label:<{width}}{cells}"


def format_metrics_table(metrics: dict[str, float], all_metrics: bool = False) -> str:
    """Final metrics as text: test metrics (%) per post-hoc method, OOD metrics per set, fitted
    post-hoc parameters. ``all_metrics`` adds every report column and OOD metric."""
    fitted = {k.split("@", 1)[1] for k in metrics if k.startswith("test/") and "@" in k}
    methods = ["uncalibrated", *sorted(fitted)]
    cols = [c for c in _MAIN_KEYS if f"test/{c}" in metrics]
    if all_metrics:
        cols = sorted({k.split("/", 1)[1].split("@")[0] for k in metrics if k.startswith("test/")})
    lines = ["test metrics (%):", f"{'method':<14}" + "".join(f"{c:>14}" for c in cols)]
    for m in methods:
        suffix = "" if m == "uncalibrated" else f"@{m}"
        lines.append(_row(m, [metrics.get(f"test/{c}{suffix}") for c in cols], 100, 14))
    ood_keys = sorted({k[4:].rsplit("/", 1)[0] for k in metrics if k.startswith("ood/")})
    if ood_keys:
        ood_cols = list(_OOD_COLS)
        if all_metrics:
            ood_cols = sorted({k.rsplit("/", 1)[1] for k in metrics if k.startswith("ood/")})
        w = max(14, *(len(k) + 2 for k in ood_keys))
        lines += ["", "OOD detection (entropy score unless _msp; @ts = after temperature scaling):"]
        lines.append(f"{'set':<{w}}" + "".join(f"{c:>14}" for c in ood_cols))
        for key in ood_keys:
            lines.append(_row(key, [metrics.get(f"ood/{key}/{c}") for c in ood_cols], 1, w))
    params = sorted(k for k in metrics if k.startswith("posthoc/"))
    if params:
        width = max(len(k) for k in params)
        lines += ["", "post-hoc parameters (fitted on validation):"]
        lines += [f"{k:<{width}}  {metrics[k]:.4f}" for k in params]
    return "\n".join(lines)


def _train_config(args: argparse.Namespace, overrides: list[str]) -> Any:
    """The validated trial config of `calibtune train`, its storage folder checked."""
    from calibtune.study._preflight import check_storage
    from calibtune.trial import load_config

    path = args.config
    if os.path.isdir(path):
        raise _UsageError(f"CONFIG.yaml: expected a trial-config file, got a directory: {path}")
    if not os.path.exists(path):
        raise _UsageError(f"{path}: no such file")
    try:
        cfg = load_config(path, overrides)
        key = "--storage-path" if args.storage_path else f"{path}: storage_path"
        check_storage(cfg.storage_path, key)
    except Exception as exc:
        message = bad_input_message(exc, path)
        if message is None or os.environ.get("CALIBTUNE_DEBUG"):
            raise
        raise _UsageError(message) from None
    return cfg


def _cmd_train(args: argparse.Namespace) -> int:
    from calibtune.trial import TrialFailedError, run

    overrides = list(args.overrides)
    if args.num_workers is not None:
        if args.num_workers < 0:
            raise _UsageError(f"--num-workers: expected an integer >= 0, got {args.num_workers}")
        overrides.append(f"scaling.num_workers={args.num_workers}")
    if args.use_gpu is not None:
        overrides.append(f"scaling.use_gpu={'true' if args.use_gpu else 'false'}")
    if args.storage_path:
        overrides.append(f"storage_path={args.storage_path}")
    if args.name:
        overrides.append(f"name={args.name}")
    cfg = _train_config(args, overrides)
    try:
        result = run(cfg)
    except ValueError as e:  # missing dataset files, too few CPUs/GPUs for the scaling
        raise _UsageError(str(e)) from None
    except TrialFailedError as e:
        print(f"calibtune train: trial failed: {e}", file=sys.stderr)
        return 1
    print(format_metrics_table(result.metrics, args.all_metrics))
    print(f"\n{result.epochs_completed} epochs; artifacts in {result.artifacts_dir}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # named by the subcommand's parser: "calibtune run: error: unrecognized ..."
        sub = parser._subparsers._group_actions[0].choices[args.command]  # type: ignore[union-attr]
        sub.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return int(args.func(args))
    except _UsageError as e:
        print(f"calibtune {args.command}: error: {e}".replace("\n", " "), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
