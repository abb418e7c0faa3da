"""`calibtune compare`, `report` and `export`: a finished study read back from MLflow and its
study folder, without torch or Ray (tests/test_cli_imports.py).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from calibtune._usage import usage
from calibtune.cluster import check_dir, check_out_file, check_tracking_uri
from calibtune.readers import (
    compare_table,
    export_best,
    format_table,
    locate_study,
    report_table,
    trials_frame,
)
from calibtune.record import data_note, resolve_tracking_uri

__all__ = ["compare", "export", "report"]


def _finished_study(args: argparse.Namespace) -> tuple[Any, Any]:
    """The `StudyRef` of compare/report/export and its trials (`trials_frame`, unfinished ones
    included: the command's one MLflow query): its tracking store checked (exists, answers) and
    holding at least one finished trial; else a one-line ValueError."""
    if args.tracking_uri:
        uri = resolve_tracking_uri(args.tracking_uri)
        check_tracking_uri(uri, "--tracking-uri", must_exist=True)
    ref = locate_study(args.study, args.storage, args.tracking_uri)
    if not args.tracking_uri:
        check_tracking_uri(ref.tracking_uri, f"study {ref.name}: tracking_uri", must_exist=True)
    trials = trials_frame(ref, include_unfinished=True)
    counts = trials["status"].value_counts().to_dict() if not trials.empty else {}
    if not counts.get("finished"):
        seen = ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "no trials"
        raise ValueError(f"study {ref.name}: expected finished trials, found none yet ({seen})")
    return ref, trials


def compare(args: argparse.Namespace) -> int:
    with usage():
        ref, trials = _finished_study(args)
        metrics = [m.strip() for m in args.metrics.split(",")] if args.metrics else None
        table = compare_table(ref, metrics, args.sort, trials=trials)
    print(format_table(table, args.format), end="")
    _data_note(trials[trials["trial_id"].isin(table["trial_id"])])
    return 0


def _data_note(trials: Any) -> None:
    """Data lineage: one line on stderr when the table's trials saw different data."""
    if note := data_note(trials.to_dict("records")):
        print(f"calibtune: {note}", file=sys.stderr)


def report(args: argparse.Namespace) -> int:
    with usage():
        out = check_out_file(args.out, "--out") if args.out else None
        ref, trials = _finished_study(args)
        if args.baseline is not None:
            # the paired bootstrap runs on torch: only `report --baseline` imports it
            from calibtune.readers import paired_table

            table = paired_table(ref, args.baseline, trials=trials)
        else:
            table = report_table(ref, trials=trials)
        if table.empty:  # finished trials, but none reported the objective
            raise ValueError(
                f"study {ref.name}: expected a finished trial that reported "
                f"{ref.objectives[0][0]}, found none"
            )
        text = format_table(table, args.format)
    print(text, end="")
    _data_note(trials[trials["status"] == "finished"])
    if out is not None:
        with usage(out):
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(out.name + ".tmp")
            tmp.write_text(text)
            tmp.replace(out)
    return 0


def export(args: argparse.Namespace) -> int:
    with usage():
        if args.top < 1:
            raise ValueError(f"--top: expected an integer >= 1, got {args.top}")
        check_dir(args.out, "--out", min_free=0)
        ref, trials = _finished_study(args)
        paths = export_best(ref, args.out, args.top, args.metric, trials=trials)
    for path in paths:
        print(path)
    return 0
