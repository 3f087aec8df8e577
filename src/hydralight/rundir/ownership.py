"""Which folders are the project's to write into and to clean up.

A run dir is the project's when the project made it, or when it holds the project's marker (`.hydralight`,
written before anything else) or the manifest of an earlier version's run. A folder holding anything else is
the user's: it is refused before anything is written there, and nothing in it is ever removed. A refused run
removes only what its own attempt added, and the folder itself only when the project made it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from hydralight.errors import UserError
from hydralight.rundir.layout import (
    BEST,
    CONFIG,
    JOBS,
    LOCK,
    LOCK_LEFTOVERS,
    MANIFEST,
    MARK,
    REPORT_RECORD,
    SEARCH,
    STUDY,
)
from hydralight.rundir.record import read_json

# What Hydra writes into a job's dir before the task runs: its record and its log file.
_HYDRA_WRITES = (".hydra", "multirun.yaml")
# What a sweep dir of an earlier version holds beside its job dirs: Hydra's record, the launchers', the
# search's and the report's files.
_SWEEP_WRITES = frozenset(
    {
        "multirun.yaml",
        JOBS,
        SEARCH,
        BEST,
        STUDY,
        "sbatch",
        ".submitit",
        "report.md",
        "report.csv",
        "report_jobs.csv",
        REPORT_RECORD,
    }
)


def _entries(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []


def _mark(path: Path) -> dict | None:
    data = read_json(path / MARK)
    return data if data is not None and data.get("by") == "hydralight" else None


def is_project_dir(path: Path) -> bool:
    """Whether `path` holds the project's marker, or the manifest of a run of an earlier version."""
    if _mark(path) is not None:
        return True
    manifest = read_json(path / MANIFEST)
    return manifest is not None and {"status", "run_dir", "started_at"} <= manifest.keys()


def foreign_entries(path: Path, hydra_wrote: bool = False, found: frozenset[str] | None = None) -> list[str]:
    """The entries of a folder that is not the project's (what the user keeps there); [] for the project's
    own dirs, a missing or empty folder. `hydra_wrote`: Hydra has written its record and log there already;
    `found`: what the folder held before Hydra wrote them (when known, only those count)."""
    if is_project_dir(path):
        return []
    ours = (LOCK,) if (path / MARK).is_symlink() else (LOCK, MARK)
    hydras = hydra_wrote and found is None  # not known: Hydra's names are taken for this attempt's
    return [
        name
        for name in (sorted(found) if found is not None else _entries(path))
        if name not in ours
        and not name.startswith(LOCK_LEFTOVERS)
        and not (hydras and (name in _HYDRA_WRITES or name.endswith(".log")))
    ]


def link_out_of(path: Path, limit: int = 10_000) -> tuple[Path, str] | None:
    """A link inside the run dir that a write through it would change something of someone else's by (one to a
    file outside, or to a file of the run dir that is not a checkpoint: `results.json -> notes.txt`), with its
    target; None when there is none. Lightning's `last.ckpt -> epoch...ckpt` is fine, so is wandb's
    `wandb/latest-run -> offline-run-...`, and so are the links in the logs of an earlier attempt's wandb run
    (wandb links its core's log in the user's cache there): every attempt's wandb run writes a folder of its own,
    never through an earlier one's. Something that is neither a file, a folder nor a link (a named pipe, a
    socket: writing a record to it would block or go elsewhere) is returned with an empty target."""
    root = path.resolve()
    seen = 0
    for folder, dirs, names in os.walk(path):  # never into linked folders: a linked folder is itself checked
        for name in [*dirs, *names]:
            seen += 1
            if seen > limit:
                return None  # no run dir holds that many files: not worth walking further
            entry = Path(folder) / name
            if not entry.is_symlink() and not entry.is_dir() and not entry.is_file():
                return entry, ""
            if not entry.is_symlink() or _wandb_log(entry, path):
                continue
            target = entry.resolve()
            lightnings = target.suffix == ".ckpt" and entry.suffix == ".ckpt"  # save_last="link"
            wandbs = target.is_relative_to(root / "wandb") and entry.relative_to(path).parts[0] == "wandb"  # latest-run
            if not target.is_relative_to(root) or not (lightnings or wandbs):
                return entry, os.readlink(entry)
    return None


def _wandb_log(entry: Path, run_dir: Path) -> bool:
    """A file in the logs of a wandb run kept in the run dir (`wandb/offline-run-<time>-<id>/logs/...`)."""
    parts = entry.relative_to(run_dir).parts
    return len(parts) >= 4 and parts[0] == "wandb" and "run-" in parts[1] and parts[2] == "logs"


def check_usable(path: Path, key: str, hydra_wrote: bool = False, found: frozenset[str] | None = None) -> None:
    """Refuse, in one line and before anything is written, a run dir that is a file or a folder of the user's,
    or one holding a link that a run would write through to a file outside it."""
    if path.exists() and not path.is_dir():
        raise UserError(f"{key}={path} is a file, not a folder; give a new folder for the run")
    if path.is_dir() and _holds_a_sweep(path):
        raise UserError(
            f"{key}={path} is the dir of a sweep of this project; a run goes into a dir of its own (a job of the "
            "sweep continues with the sweep's own -m command): name another folder"
        )
    # A folder of the user's first: its links are its own (a project's folder and its config link), not ours to
    # have removed.
    foreign = foreign_entries(path, hydra_wrote, found)
    _refuse_foreign(key, path, foreign, "a run dir of this project, to continue its run")
    if path.is_dir() and (link := link_out_of(path)) is not None:
        entry, target = link
        if not target:
            raise UserError(
                f"{key}={path} holds {entry.relative_to(path)}, which is neither a file nor a folder (a pipe, a "
                "socket); a run writes only files of its own, and nothing was written: remove it"
            )
        where = "in it" if entry.resolve().is_relative_to(path.resolve()) else "outside the run dir"
        raise UserError(
            f"{key}={path} holds {entry.relative_to(path)}, a link to {target} ({where}); a run writes only files of "
            "its own, never through a link, and nothing was written: remove the link"
        )


def _holds_a_sweep(path: Path) -> bool:
    return (path / "multirun.yaml").is_file() or (_mark(path) or {}).get("kind") == "sweep"


def _holds_a_run(path: Path) -> bool:
    return not _holds_a_sweep(path) and ((path / MANIFEST).is_file() or (path / CONFIG).is_file())


def _refuse_foreign(key: str, path: Path, found: list[str], ours: str) -> None:
    """The one line that refuses a folder holding files the project did not write (`found`), if any."""
    if found:
        shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
        raise UserError(
            f"{key}={path} already holds files this project did not write ({shown}); nothing was written there. "
            f"Give a new or an empty folder (or {ours})"
        )


def check_sweep_usable(path: Path, key: str = "hydra.sweep.dir") -> None:
    """Refuse, in one line and before Hydra writes its record there, a sweep dir that is a file or a folder
    of the user's: one holding anything but a sweep's own files and this project's job dirs."""
    if path.exists() and not path.is_dir():
        raise UserError(f"{key}={path} is a file, not a folder; give a new folder for the sweep")
    if path.is_dir() and _holds_a_run(path):
        raise UserError(
            f"{key}={path} holds a run of this project; a sweep goes into a dir of its own: name another folder"
        )
    if _mark(path) is not None:
        return
    names = _entries(path)
    jobs = {n for n in names if (path / n).is_dir() and not (path / n).is_symlink() and is_project_dir(path / n)}
    # A sweep's own files are taken for an earlier version's beside its job dirs only: alone, they are the
    # user's (a multirun.yaml of theirs was rewritten).
    found = [
        name
        for name in names
        if name != MARK and name not in jobs and not (jobs and (name in _SWEEP_WRITES or name.endswith(".png")))
    ]
    _refuse_foreign(key, path, found, "a sweep dir of this project, to continue its sweep")


def claim_sweep_dir(path: Path, key: str = "hydra.sweep.dir") -> None:
    """Check a sweep dir (`check_sweep_usable`), make it if missing, and mark it the project's."""
    check_sweep_usable(path, key)
    made = not path.is_dir()
    path.mkdir(parents=True, exist_ok=True)
    if _mark(path) is None:
        _write_mark(path, made, kind="sweep")


@dataclass(frozen=True)
class Claim:
    """A run dir taken by one attempt: whether the project made the folder, and what was there before."""

    path: Path
    made_folder: bool
    before: frozenset[str]
    # Folders above it that this attempt made for it (the deepest first), removed with it when left empty.
    made_parents: tuple[Path, ...] = ()

    @classmethod
    def take(
        cls, path: Path, key: str = "hydra.run.dir", hydra_wrote: bool = False, found: frozenset[str] | None = None
    ) -> Claim:
        """Check that `path` may be used (`check_usable`), make it if missing, and mark it the project's.
        `hydra_wrote`: Hydra has made the folder and written its record there; `found`: what it held before
        (an empty folder is taken as made for this run, as is one holding Hydra's files only when that is not
        known)."""
        check_usable(path, key, hydra_wrote, found)
        before = frozenset(_entries(path))
        mark = _mark(path)
        if mark is not None:
            made = bool(mark.get("made_folder", False))
        elif is_project_dir(path):  # a run of an earlier version: it made the folder
            made = True
        elif hydra_wrote:  # all it holds is Hydra's record of this very attempt (check_usable saw to that)
            made, before = not found, found or frozenset()
        else:
            made = not path.is_dir()
        parents = tuple(p for p in path.parents if not p.exists())
        path.mkdir(parents=True, exist_ok=True)
        if mark is None:
            _write_mark(path, made)
        unshare(path)
        return cls(path, made, before, parents)

    def discard_added(self) -> None:
        """Remove what this attempt added to the run dir (never what was there before), and the folder too when
        the project made it and nothing is left."""
        for name in _entries(self.path):
            if name in self.before or name == LOCK:
                continue
            entry = self.path / name
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    entry.unlink()
        self.remove_if_empty()

    def remove_if_empty(self) -> bool:
        """Remove the folder (and the folders made for it) when the project made it and it holds nothing but
        the marker."""
        if not self.made_folder or set(_entries(self.path)) - {MARK}:
            return False
        try:
            (self.path / MARK).unlink(missing_ok=True)
            if self.path.exists():
                self.path.rmdir()
            for parent in self.made_parents:
                parent.rmdir()
        except OSError:  # something else came in meanwhile: it stays
            return False
        return True


def unshare(path: Path, limit: int = 10_000) -> None:
    """Give each hard-linked file of a run dir a copy of its own (a run dir copied with `cp -al`), before the run
    writes or appends to it: the other name, in the run it was copied from, keeps its bytes."""
    seen = 0
    for folder, _, names in os.walk(path):
        for name in names:
            seen += 1
            if seen > limit:
                return  # no run dir holds that many files: not worth walking further
            entry = Path(folder) / name
            if entry.is_symlink() or not entry.is_file() or entry.stat().st_nlink < 2:
                continue
            own = entry.with_name(f".{name}.own")
            shutil.copy2(entry, own)
            os.replace(own, entry)


def _write_mark(path: Path, made_folder: bool, kind: str = "run") -> None:
    """Write the marker, never through a link someone left in its place."""
    payload = json.dumps({"by": "hydralight", "made_folder": made_folder, "kind": kind}).encode()
    target = path / MARK
    if target.is_symlink():
        raise UserError(f"{target} is a link; this project writes its marker only as a file of its own: remove it")
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, payload)
    finally:
        os.close(fd)
