"""Run every benchmark in bench/ one after another (`make bench`).

Each script prints its own ratios, measured within its own run; numbers are recorded by hand in
bench/README.md. ``--quick`` is passed to the scripts that have a smoke mode.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
QUICK = {"bench_posthoc.py", "bench_trial.py"}
SKIP_IN_ALL = {"bench_load.py"}  # `make load`: a long study of its own


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smoke mode where supported")
    parser.add_argument("only", nargs="*", help="script names to run (default: all)")
    args = parser.parse_args()
    scripts = sorted(HERE.glob("bench_*.py"))
    if args.only:
        scripts = [s for s in scripts if s.stem in args.only or s.name in args.only]
    else:
        scripts = [s for s in scripts if s.name not in SKIP_IN_ALL]
    failed = []
    for script in scripts:
        cmd = [sys.executable, str(script)]
        if args.quick and script.name in QUICK:
            cmd.append("--quick")
        print(f"\n===== {script.name} =====", flush=True)
        if subprocess.run(cmd).returncode != 0:
            failed.append(script.name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
