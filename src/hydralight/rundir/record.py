"""The files that record what a run was and what it measured: config.yaml and plan.yaml at the start,
manifest.json throughout, results.json at the end. Plain data in, files out: launchers and reports use it
without torch or Lightning."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from hydralight.errors import UserError
from hydralight.rundir.layout import LOCK_LEFTOVERS, MARK, RECORD_ONLY, RunDir
from hydralight.rundir.redaction import redact, redact_hydra_records

PACKAGES = ("torch", "torchvision", "pytorch-lightning", "torchmetrics", "hydra-core", "omegaconf", "wandb", "submitit")


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(redact(dict(data)), indent=2, sort_keys=True) + "\n")


# A record file larger than this is no record of a run (config.yaml and manifest.json are a few kB).
RECORD_MAX_BYTES = 8 << 20
# YAML aliases a record may hold: the project writes none; a few allow a config written by hand.
_MAX_ALIASES = 64
# Values a record holds with its aliases expanded (a run's config has a few thousand): fewer aliases than the
# bound above, each naming a list of the one before, still expand past any memory or time a reader has.
_MAX_EXPANDED = 200_000


def _read_record_bytes(path: Path) -> bytes:
    """A run dir's record file, read as untrusted data: never through a link, never a device or a pipe (which
    could block), never more than `RECORD_MAX_BYTES`. Raises OSError or ValueError."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        if info.st_size > RECORD_MAX_BYTES:
            raise ValueError(f"{info.st_size} bytes, more than a run's record holds")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(RECORD_MAX_BYTES + 1)
    finally:
        os.close(fd)


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON file's object; None when it is missing or unreadable (a record being written, an old format, a
    link, a file too large to be a record)."""
    try:
        data = json.loads(_read_record_bytes(path))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class _BoundedLoader(yaml.SafeLoader):
    """yaml's safe loader, refusing a document with more aliases than a record has (an alias bomb grows without
    bound while it is built)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases = getattr(self, "_aliases", 0) + 1
            if self._aliases > _MAX_ALIASES:
                raise yaml.YAMLError(f"more than {_MAX_ALIASES} aliases")
        return super().compose_node(parent, index)


def _expands_past(data: Any, limit: int) -> bool:
    """Whether `data` walked as its readers walk it (a shared list once for each place it stands) holds more than
    `limit` values; stops counting there."""
    pending, seen = [data], 0
    while pending:
        value = pending.pop()
        seen += 1
        if seen > limit:
            return True
        if isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
    return False


def read_yaml_record(path: Path, label: str, kind: type = dict) -> Any:
    """A YAML record of a run dir (config.yaml, plan.yaml: a mapping; Hydra's overrides.yaml: a list, `kind`),
    read as untrusted data (`_read_record_bytes`, a bounded count of aliases); anything else is a UserError
    naming the file."""
    try:
        text = _read_record_bytes(path).decode("utf-8")
        # Without an anchor (`&`) a document has no alias to count: libyaml's loader, 20x faster (a report
        # reads two records of every job).
        fast = "&" not in text and yaml.__with_libyaml__
        data = yaml.load(text, Loader=yaml.CSafeLoader if fast else _BoundedLoader)  # noqa: S506
        if not fast and _expands_past(data, _MAX_EXPANDED):
            raise ValueError(f"its aliases expand to more than {_MAX_EXPANDED} values")
    except FileNotFoundError:
        raise UserError(f"{label}: {path} is missing") from None
    except (OSError, ValueError, RecursionError, yaml.YAMLError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UserError(
            f"{label}: {path} cannot be read as a run's record ({reason}); it is not one this project wrote"
        ) from None
    if data is None:
        return kind()
    if not isinstance(data, kind):
        what = "mapping" if kind is dict else kind.__name__
        raise UserError(f"{label}: {path} holds a {type(data).__name__}, not the {what} a run's record is")
    return data


def save_config(run_dir: RunDir, config: Mapping[str, Any], plan: Mapping[str, Any]) -> None:
    """Write the resolved config (what `resume=RUN_DIR` continues) and the run plan (what extra ranks run)."""
    run_dir.path.mkdir(parents=True, exist_ok=True)
    redact_hydra_records(run_dir.path)
    run_dir.config.write_text(yaml.safe_dump(redact(dict(config)), sort_keys=False))
    run_dir.plan.write_text(yaml.safe_dump(redact(dict(plan)), sort_keys=False))


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, cwd=Path(__file__).parent)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def versions() -> dict[str, str | None]:
    import platform

    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


class Manifest:
    """`manifest.json`: what ran (command, overrides, code, packages, machine, plan) and what came out."""

    def __init__(
        self, run_dir: RunDir, plan: Mapping[str, Any], machine: Mapping[str, Any], overrides: list[str]
    ) -> None:
        self.path = run_dir.manifest
        commit = _git("rev-parse", "HEAD")
        self.data: dict[str, Any] = {
            "status": "running",
            "command": [sys.executable, *sys.argv],
            "overrides": list(overrides),
            "run_dir": str(run_dir.path),
            "git": {"commit": commit, "dirty": bool(_git("status", "--porcelain")) if commit else None},
            "versions": versions(),
            "machine": dict(machine),
            "plan": dict(plan),
            "started_at": now(),
            "finished_at": None,
            "metrics": {},
            "best_checkpoint": None,
        }

    def write(self, **updates: Any) -> dict[str, Any]:
        self.data.update(updates)
        write_json(self.path, self.data)
        return self.data

    def finish(self, status: str, **updates: Any) -> dict[str, Any]:
        return self.write(status=status, finished_at=now(), **updates)


def record_failure(run_dir: RunDir, reason: str, overrides: list[str] | None = None) -> None:
    """Mark a job's manifest failed with its reason (writing a small one if the job was refused before it had one)."""
    data = read_json(run_dir.manifest) or {"run_dir": str(run_dir.path), "overrides": overrides, "started_at": None}
    if data.get("status") in (None, "running", "failed"):
        data.update(status="failed", error=reason, finished_at=now())
    run_dir.path.mkdir(parents=True, exist_ok=True)
    write_json(run_dir.manifest, data)
    redact_hydra_records(run_dir.path)  # a job refused before it saved its config


def remove_empty_folders(folders: Iterable[Path]) -> None:
    """Remove each folder (the deepest first) while it is empty; one that holds anything stays, and so do
    the folders above it."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # not empty (something else came in), or gone already
            return


def discard_unused_run_dir(path: Path, keep_folder: bool = False) -> bool:
    """Remove a run dir that holds only its start-up record (a refused or plan-only run); keep anything else.
    `keep_folder`: the folder was there before the project used it, and stays (emptied of the record)."""
    if not path.is_dir():
        return False
    redact_hydra_records(path)  # a plan-only job of a sweep: the sweep's record stays
    return _discard_record_only(path, keep_folder)


def _discard_record_only(path: Path, keep_folder: bool) -> bool:
    entries = list(path.iterdir()) if path.is_dir() else []
    if not path.is_dir() or any(
        e.name not in RECORD_ONLY and e.suffix != ".log" and not e.name.startswith(LOCK_LEFTOVERS) for e in entries
    ):
        return False
    for entry in entries:  # gone already counts as removed (another process of the launch was first)
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    if keep_folder:
        return True
    with contextlib.suppress(FileNotFoundError):
        path.rmdir()
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", path.parent.name):
        with contextlib.suppress(OSError):  # the date folder Hydra made for it, when nothing else is in there
            path.parent.rmdir()
    return True


def discard_refused_sweep(config: Any, keep_folder: bool = False) -> None:
    """What a sweep refused before its first job, or one that only printed its plans, wrote goes (Hydra's
    record, the marker), and its folder too unless the folder was there before (`keep_folder`, or its marker
    says so)."""
    path = Path(str(config.hydra.sweep.dir))
    mark = read_json(path / MARK)
    _discard_record_only(path, keep_folder or (mark is not None and mark.get("made_folder") is False))


@contextlib.contextmanager
def sweep_dir_kept_as_it_was(config: Any, when: Callable[[], bool] = lambda: True) -> Iterator[None]:
    """A sweep that changed nothing (`when`: it only printed its jobs' plans, or every job was refused) leaves
    its sweep dir as it was: Hydra's record of it put back, the folder gone unless it was there before."""
    path = Path(str(config.hydra.sweep.dir))
    existed, record = path.exists(), FileSnapshot([path / "multirun.yaml"])
    try:
        yield
    finally:
        if when():
            record.restore()
            discard_refused_sweep(config, keep_folder=existed)


class FileSnapshot:
    """Some files as they are now (or their absence), to put back if what follows is refused."""

    def __init__(self, paths: Iterable[Path]) -> None:
        self.before = {p: p.read_bytes() if p.is_file() else None for p in paths}

    @classmethod
    def of_folder(cls, folder: Path) -> FileSnapshot:
        return cls(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else cls([])

    def restore(self, folder: Path | None = None) -> None:
        """Put every file back; with `folder`, also remove the files made there since."""
        made = (
            [p for p in folder.iterdir() if p.is_file() and p not in self.before] if folder and folder.is_dir() else []
        )
        for path in made:
            path.unlink()
        for path, before in self.before.items():
            if before is None:
                path.unlink(missing_ok=True)
                continue
            temporary = path.with_name(f".{path.name}.restore")
            try:
                temporary.write_bytes(before)
                os.replace(temporary, path)
            except OSError as err:
                temporary.unlink(missing_ok=True)
                if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                path.write_bytes(before)  # a full disk: in place, in the room the newer file frees
        if folder is not None and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


# Budgets a continuation extends: a larger one is the point of continuing, said by the run's own lines.
BUDGETS = ("max_steps", "max_epochs", "max_time")


def trainer_changes(run_dir: RunDir, config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The Trainer settings (precision, gradient clipping, ...) this attempt changes from the run's recorded
    config.yaml, budgets aside: Lightning applies them from the step the run continues at."""
    try:
        then = (read_yaml_record(run_dir.config, "this run dir") or {}).get("trainer") or {}
    except UserError:
        return []
    now = config.get("trainer") or {}
    return [
        {"setting": f"trainer.{key}", "was": then.get(key), "now": now.get(key)}
        for key in sorted(set(then) | set(now))
        if key not in BUDGETS and then.get(key) != now.get(key)
    ]


class RunRecord:
    """The record files of one run: config.yaml and plan.yaml at start, manifest.json throughout,
    results.json at the end. Only the writer (rank 0) writes."""

    def __init__(
        self,
        run_dir: RunDir,
        config: Mapping[str, Any],
        plan: Mapping[str, Any],
        machine: Mapping[str, Any],
        overrides: list[str],
        writer: bool,
    ) -> None:
        self.run_dir = run_dir
        self.writer = writer
        self.extra: dict[str, Any] = {}  # what callbacks measured, for results.json and the manifest
        self._manifest = None
        # What this attempt replaces, put back if it is refused before it saves a checkpoint (`restore`).
        self._before = self._ranks_before = FileSnapshot([])
        self._checkpoints_before: set[tuple[str, int, int]] = set()
        if writer:
            # The history and what training ended with too: an attempt rewrites them from the step it continues.
            records = [run_dir.config, run_dir.plan, run_dir.manifest, run_dir.history, run_dir.fit_end]
            self._before = FileSnapshot(records)
            self._ranks_before = FileSnapshot.of_folder(run_dir.rank_record(0).parent)
            self._checkpoints_before = self._checkpoints()
            earlier = read_json(run_dir.manifest) or {}
            continues = bool((plan.get("resume") or {}).get("own"))
            changed = trainer_changes(run_dir, config) if continues else []
            save_config(run_dir, config, plan)
            self._manifest = Manifest(run_dir, plan, machine, overrides)
            self._manifest.data["tags"] = list(config.get("tags") or [])
            # Which training this is: kept while the run continues its own checkpoints, new when the dir starts
            # afresh (a tracker's run follows it, never mixing two trainings of one dir).
            self._manifest.data["lineage"] = earlier.get("lineage", "") if continues else now()
            # Each attempt's changes of how Lightning trains, kept: config.yaml holds the latest values only.
            self._manifest.data["trainer_changes"] = [*earlier.get("trainer_changes", []), *changed]
            self._manifest.write()
            if changed:
                said = ", ".join(f"{c['setting']} {c['was']} -> {c['now']}" for c in changed)
                print(
                    f"note: this continuation trains on with {said}; the steps before it had the earlier values "
                    "(config.yaml now holds the new ones; manifest.json's trainer_changes keeps both)",
                    file=sys.stderr,
                    flush=True,
                )

    @property
    def manifest(self) -> dict[str, Any] | None:
        return self._manifest.data if self._manifest else None

    @contextlib.contextmanager
    def timed(self, key: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.extra[key] = round(time.perf_counter() - start, 3)

    def __enter__(self) -> RunRecord:
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, tb: Any) -> None:
        if kind is not None and self._manifest is not None:
            status = "interrupted" if isinstance(error, (SystemExit, KeyboardInterrupt)) else "failed"
            reason = (
                str(error).strip().splitlines()[0] if error is not None and str(error).strip() else type(error).__name__
            )
            self._manifest.finish(status, error=reason, **self.extra)

    def _checkpoints(self) -> set[tuple[str, int, int]]:
        folder = self.run_dir.checkpoints
        if not folder.is_dir():
            return set()
        return {(p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in folder.iterdir() if p.is_file()}

    def restore_if_nothing_saved(self) -> bool:
        """A refused attempt that saved no checkpoint leaves the run's record as it was (config.yaml, plan.yaml,
        manifest.json, the history, fit_end.json and ranks/ of the attempt that made its checkpoints), so
        `resume=RUN_DIR` and the records still describe them. True if it restored (the writer only)."""
        if not self.writer or self._checkpoints() != self._checkpoints_before:
            return False
        self._before.restore()
        self._ranks_before.restore(self.run_dir.rank_record(0).parent)
        self._manifest = None  # nothing more is written for this attempt
        return True

    def finish(self, results: Mapping[str, Any]) -> None:
        """Write results.json and mark the manifest finished (the writer only)."""
        if not self.writer:
            return
        results = {**results, **self.extra}
        write_json(self.run_dir.results, results)
        if self._manifest is not None:
            self._manifest.finish(
                "finished", metrics=results.get("metrics", {}), best_checkpoint=results.get("best_checkpoint"),
                **self.extra,
            )  # fmt: skip
