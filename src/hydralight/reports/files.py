"""The files a report writes: made in a staging folder, then put in place only where nothing of someone else's
is replaced (a file the report did not write, one changed since, a link to anywhere); a report refused writes
nothing. What it wrote, with each file's hash, is kept beside them (`.hydralight-report.json`)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from hydralight.errors import UserError
from hydralight.rundir.layout import REPORT_RECORD

MARK = REPORT_RECORD


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _written(out_dir: Path) -> dict[str, str]:
    """name -> hash of each file a report wrote into `out_dir`."""
    mark = out_dir / MARK
    if mark.is_symlink() or not mark.is_file():
        return {}
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(mark.read_text())
        if isinstance(data, dict) and all(isinstance(v, str) for v in data.values()):
            return {str(k): v for k, v in data.items()}
    return {}


@contextlib.contextmanager
def staged(out_dir: Path) -> Iterator[Path]:
    """A folder to write the report into; on leaving, its files replace those of `out_dir` (see the module)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".report-", dir=out_dir))
    try:
        yield stage
        _place(stage, out_dir)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _place(stage: Path, out_dir: Path) -> None:
    written = _written(out_dir)
    names = sorted(p.name for p in stage.iterdir())
    for name in [*names, MARK]:
        target = out_dir / name
        if target.is_symlink():
            raise UserError(
                f"{target} is a link; a report writes only files of its own, never through a link, and wrote "
                "nothing: remove the link, or give --out another folder"
            )
        # A file without a record of its hash (one of the user's, or a report of a version that kept none and
        # may have been edited since) is not known to be the report's own.
        ours = name == MARK or (name in written and _digest(target) == written[name])
        if target.exists() and not ours:
            raise UserError(
                f"{target} is not known as this report's own (no record of it, or changed since), and the report "
                "would replace it; nothing was written: move it away, or give --out another folder"
            )
    for name in names:
        os.replace(stage / name, out_dir / name)
    record = {**written, **{name: _digest(out_dir / name) for name in names}}
    temporary = stage / MARK
    temporary.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    os.replace(temporary, out_dir / MARK)
