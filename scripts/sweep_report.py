"""`python scripts/sweep_report.py MULTIRUN_DIR [--out DIR]`: table and plots of a finished (or running) sweep."""

import argparse
import sys
from pathlib import Path

from hydralight.errors import UserError
from hydralight.reports.sweep import write_report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "sweep_dir", type=Path, help="the multirun dir of a sweep, e.g. multirun/2026-01-31/12-00-00-000000"
    )
    parser.add_argument("--out", type=Path, default=None, help="where to write the report (default: the sweep dir)")
    args = parser.parse_args()
    try:
        summary = write_report(args.sweep_dir, args.out)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(summary["files"][0].read_text(), end="")
    if summary["pending"]:
        print(f"\n{len(summary['pending'])} job(s) not finished: {', '.join(summary['pending'])}", file=sys.stderr)
    print("written: " + ", ".join(str(p) for p in summary["files"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
