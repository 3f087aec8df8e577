"""`python -m hydralight.report MULTIRUN_DIR [--out DIR] [--group-over KEYS]` (or `hydralight-report ...`): table
and plots of a finished (or running) sweep; jobs that differ only in the grouped keys (seed by default) are one row:
mean, std, min, max, n."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hydralight.errors import UserError
from hydralight.reports.sweep import write_report


def group_keys(text: str) -> list[str]:
    """`seed,data.split_seed` -> its keys; `none` (or nothing) groups nothing: one row per job."""
    keys = [k.strip() for k in text.split(",") if k.strip()]
    return [] if keys in ([], ["none"]) else keys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hydralight-report", description=__doc__)
    parser.add_argument(
        "sweep_dir", type=Path, help="the multirun dir of a sweep, e.g. multirun/2026-01-31/12-00-00-000000"
    )
    parser.add_argument("--out", type=Path, default=None, help="where to write the report (default: the sweep dir)")
    parser.add_argument(
        "--group-over",
        type=group_keys,
        default=None,
        metavar="KEYS",
        help="override keys whose runs are one setting, comma-separated (default: seed, when the sweep varies it; "
        "none: one row per job)",
    )
    args = parser.parse_args(argv)
    try:
        summary = write_report(args.sweep_dir, args.out, args.group_over)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(summary["files"][0].read_text(), end="")
    if summary["pending"]:
        print(f"\n{len(summary['pending'])} job(s) not finished: {', '.join(summary['pending'])}", file=sys.stderr)
    print("written: " + ", ".join(str(p) for p in summary["files"]))
    return 0


def cli() -> None:
    """The `hydralight-report` command."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
