"""What the job dirs of a sweep say about how each job ended: read from the files the runs wrote, by the
sweep's summary line, the search (a trial's objective) and the reports alike."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydralight.errors import UserError
from hydralight.rundir.layout import HYDRA_RECORD, RunDir, SweepDir
from hydralight.rundir.record import read_json, read_yaml_record

# The word of a validation metric's name that its test counterpart replaces with "test": val/acc, val_loss,
# valid-acc, loss/validation.
_VALIDATION_WORD = re.compile(r"(?<![A-Za-z0-9])(val|valid|validation)(?![A-Za-z0-9])")


def test_counterpart(metric: str) -> str:
    """The test metric of the same quantity as a validation metric, as modules name them: test/acc for val/acc,
    test_loss for val_loss (Lightning's docs), loss/test for loss/val; test_<name> for a name with no such word."""
    counterpart, found = _VALIDATION_WORD.subn("test", metric, count=1)
    return counterpart if found else f"test_{metric}"


# finished | failed | interrupted | running | never started
FAILED = ("failed", "interrupted")
# Jobs of the sweep this process runs that were refused (job name -> reason). A job dir that holds an earlier
# run's results keeps them as they were, so its files cannot say that this sweep's job was refused.
REFUSED_HERE: dict[str, str] = {}


@dataclass
class JobOutcome:
    """One job of a sweep: its overrides, status, the reason it failed, and its records."""

    name: str
    run_dir: RunDir
    overrides: dict[str, str]
    status: str = "running"
    reason: str | None = None
    results: dict[str, Any] | None = None
    manifest: dict[str, Any] = field(default_factory=dict)
    plan: dict[str, Any] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.status == "finished"

    @property
    def objective(self) -> tuple[str | None, float | None]:
        """(metric, its best validation value) as results.json records it; the value is None when the run
        never validated it."""
        objective = (self.results or {}).get("objective") or {}
        value = objective.get("value")
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return objective.get("metric"), float(value)
        return objective.get("metric"), None


def _overrides(items: Any) -> dict[str, str]:
    return dict(str(item).split("=", 1) for item in items or [] if "=" in str(item))


def _record_or(path: Path, kind: type) -> Any:
    """A job's YAML record, or an empty one when it is missing or not a record (a report reads on)."""
    try:
        return read_yaml_record(path, "job", kind) if path.is_file() else kind()
    except UserError:
        return kind()


def read_job(path: Path) -> JobOutcome:
    run_dir = RunDir(path)
    job = JobOutcome(path.name, run_dir, _overrides(_record_or(run_dir.overrides, list)))
    job.results = read_json(run_dir.results)
    job.status = "finished" if job.results is not None else "running"
    job.plan = _record_or(run_dir.plan, dict)
    if (manifest := read_json(run_dir.manifest)) is not None:
        job.manifest = manifest
        job.plan = job.plan or manifest.get("plan") or {}
        job.status = manifest.get("status") or job.status
        job.reason = manifest.get("error")
        # A job refused before Hydra's record was kept (a value its plan refused) has its overrides only here.
        job.overrides = job.overrides or _overrides(manifest.get("overrides"))
    return job


def find_jobs(sweep_dir: Path) -> list[JobOutcome]:
    """Every job of a sweep dir, those submitted that never started included, by job number."""
    if not sweep_dir.is_dir():
        raise UserError(f"{sweep_dir} is not a folder; pass the multirun dir of a sweep (multirun/<date>/<time>)")
    dirs = [
        p for p in sweep_dir.iterdir() if p.is_dir() and ((p / HYDRA_RECORD).is_dir() or RunDir(p).manifest.is_file())
    ]
    jobs = [read_job(p) for p in dirs]
    submitted = read_json(SweepDir(sweep_dir).jobs) or {}
    for name, entry in submitted.items():
        if not (sweep_dir / name).is_dir():
            jobs.append(JobOutcome(name, RunDir(sweep_dir / name), _overrides(entry.get("overrides")), "never started"))
    if not jobs:
        raise UserError(f"no jobs in {sweep_dir}: expected the numbered job folders of `python train.py -m ...`")
    number = lambda job: (not job.name.isdigit(), int(job.name) if job.name.isdigit() else 0, job.name)  # noqa: E731
    return sorted(jobs, key=number)


def sweep_line(sweep_dir: Path) -> tuple[str, bool]:
    """One line on how a sweep ended (jobs done, failed with their reasons, not finished), and whether all finished."""
    jobs = find_jobs(sweep_dir)
    refused = [j for j in jobs if j.finished and j.name in REFUSED_HERE]
    done = [j for j in jobs if j.finished and j not in refused]
    failed = [j for j in jobs if j.status in FAILED]
    other = [j for j in jobs if not j.finished and j not in failed]
    line = f"sweep {sweep_dir}: {len(done)} of {len(jobs)} jobs done"
    if failed:
        reasons = "; ".join(f"#{j.name} {j.status}: {(j.reason or '-')[:160]}" for j in failed)
        line += f", {len(failed)} failed ({reasons})"
    if refused:
        reasons = "; ".join(f"#{j.name}: {REFUSED_HERE[j.name][:160]}" for j in refused)
        line += f", {len(refused)} refused, their earlier results kept ({reasons})"
    if other:
        line += f", {len(other)} did not finish ({', '.join(f'#{j.name} {j.status}' for j in other)})"
    line += f"; details: python -m hydralight.report {sweep_dir}"
    return line, len(done) == len(jobs)


def read_search(sweep_dir: Path) -> dict[str, Any] | None:
    """The search record of a sweep dir (every trial, the best), or None when the sweep was no search."""
    return read_json(SweepDir(sweep_dir).search)


def record_submitted(sweep_dir: Path, jobs: dict[int, tuple[list[str], str]]) -> None:
    """Add submitted jobs (number -> (overrides, scheduler job id)) to the sweep's jobs.json."""
    path = SweepDir(sweep_dir).jobs
    known = read_json(path) or {}
    for number, (overrides, job_id) in jobs.items():
        known[str(number)] = {"overrides": overrides, "job_id": job_id}
    path.write_text(json.dumps(known, indent=2) + "\n")
