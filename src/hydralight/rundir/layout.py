"""Every file name of a run dir and of a sweep dir, in one place: what a run writes, and where the next
attempt, a sweep summary or a report finds it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# What a run writes before it has done anything: Hydra's record and log, our config, plan and manifest.
CONFIG = "config.yaml"
PLAN = "plan.yaml"
MANIFEST = "manifest.json"
LOCK = ".lock"
# Written first into every run dir the project uses: what makes a folder the project's to clean up.
MARK = ".hydralight"
HYDRA_RECORD = ".hydra"
RECORD_ONLY = frozenset({HYDRA_RECORD, "multirun.yaml", CONFIG, PLAN, MANIFEST, LOCK, MARK})
# What a takeover of a stale lock leaves beside it when it is killed midway (filelock's lease markers).
LOCK_LEFTOVERS = f"{LOCK}.break."
# What it writes while and after it trains.
RESULTS = "results.json"
CHECKPOINTS = "checkpoints"
LAST = "last.ckpt"
HISTORY = "csv/metrics.csv"
FIT_END = "fit_end.json"
RANKS = "ranks"
# The sweep dir: jobs submitted (launchers), the search's trials and best, the study's storage.
JOBS = "jobs.json"
# What a sweep report wrote into a folder, with each file's hash (hydralight.reports.files).
REPORT_RECORD = ".hydralight-report.json"
SEARCH = "search.json"
BEST = "best.yaml"
STUDY = "optuna.db"


@dataclass(frozen=True)
class RunDir:
    """The files of one run dir."""

    path: Path

    @classmethod
    def at(cls, path: str | Path) -> RunDir:
        return cls(Path(path))

    @property
    def config(self) -> Path:
        """The resolved config the run was started with (what `resume=RUN_DIR` continues)."""
        return self.path / CONFIG

    @property
    def plan(self) -> Path:
        """The run plan (what extra DDP ranks run)."""
        return self.path / PLAN

    @property
    def manifest(self) -> Path:
        return self.path / MANIFEST

    @property
    def results(self) -> Path:
        return self.path / RESULTS

    @property
    def fit_end(self) -> Path:
        """What training ended with (its step, final metrics, the history's length): what an attempt that
        continues after the training, killed in its test, reports and keeps."""
        return self.path / FIT_END

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def last(self) -> Path:
        """The checkpoint the run continues from: written whenever training may stop."""
        return self.path / CHECKPOINTS / LAST

    @property
    def history(self) -> Path:
        """Every logged metric, one row per step, kept across resumes."""
        return self.path / HISTORY

    @property
    def lock(self) -> Path:
        return self.path / LOCK

    @property
    def overrides(self) -> Path:
        """Hydra's record of the job's command-line overrides."""
        return self.path / HYDRA_RECORD / "overrides.yaml"

    def rank_record(self, rank: int) -> Path:
        return self.path / RANKS / f"rank{rank}.json"


@dataclass(frozen=True)
class SweepDir:
    """The files of one sweep dir: numbered job dirs and what the launchers and the search write."""

    path: Path

    @property
    def jobs(self) -> Path:
        return self.path / JOBS

    @property
    def search(self) -> Path:
        return self.path / SEARCH

    @property
    def best(self) -> Path:
        return self.path / BEST

    @property
    def study(self) -> Path:
        return self.path / STUDY

    def job(self, number: int | str) -> RunDir:
        return RunDir(self.path / str(number))


def not_a_checkpoint_file(path: str | Path) -> str | None:
    """Why `path` cannot be a checkpoint file (missing, a folder, a device), in words; None for a regular file."""
    path = Path(path)
    if path.is_file():
        return None
    if path.is_dir() and any(path.glob("*.distcp")):
        return (
            "is a sharded checkpoint (a folder of per-rank shards, strategy.checkpoint=sharded), which only the run "
            "that wrote it reads; train with strategy.checkpoint=full for one file that any run can read"
        )
    if path.is_dir():
        inside = path / CHECKPOINTS / LAST if (path / CHECKPOINTS / LAST).is_file() else path / LAST
        hint = f" (a run dir's is {inside})" if inside.is_file() else ""
        return f"is a folder; pass a .ckpt file{hint}"
    if path.exists():
        return "is not a regular file (a device or a pipe); pass the .ckpt file of a run (its checkpoints/ folder)"
    return "does not exist; pass the .ckpt file of a run (its checkpoints/ folder)"


def history_column(header: list[str], name: str) -> str | None:
    """The history's column of a logged value: its own name, or `<name>_epoch` for a value logged per step and per
    epoch (`on_step=True, on_epoch=True`: the loggers get the two forked names, never the plain one)."""
    return next((column for column in (name, f"{name}_epoch") if column in header), None)
