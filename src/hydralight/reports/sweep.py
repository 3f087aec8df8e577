"""Offline report of a sweep: a table (markdown, CSV) and plots, from the files the runs wrote; for a
hyperparameter search its trials (hydralight.reports.search), for a sweep over world sizes its scaling
(hydralight.reports.scaling). Every job is judged by its objective (`objective.metric`, in its direction),
the way a sweeper picks; test metrics are shown, never used to choose."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydralight.reports import plots
from hydralight.reports.scaling import machine_note, scaling_lines, scaling_points, write_scaling_plot
from hydralight.reports.search import load_search, search_lines, write_search_plots
from hydralight.rundir.outcome import FAILED, JobOutcome, find_jobs

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DEFAULT_OBJECTIVE = ("val/acc", "max")


@dataclass
class Job:
    """One job of the sweep as the report shows it: its outcome and what its history says."""

    outcome: JobOutcome
    metric: str  # the objective, a validation metric
    direction: str  # max | min
    best: float | None = None  # its best value over the job's validations
    test: float | None = None  # the test counterpart of the objective (test/acc for val/acc)
    epochs: int | None = None
    wall_s: float | None = None
    samples_per_s: float | None = None
    # Every logged point by optimizer step: the training loss and the objective.
    train_loss: list[tuple[int, float]] = field(default_factory=list)
    validation: list[tuple[int, float]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.outcome.name

    @property
    def path(self) -> Path:
        return self.outcome.run_dir.path

    @property
    def overrides(self) -> dict[str, str]:
        return self.outcome.overrides

    @property
    def status(self) -> str:
        return self.outcome.status

    @property
    def reason(self) -> str | None:
        return self.outcome.reason

    @property
    def finished(self) -> bool:
        return self.outcome.finished

    @property
    def plan(self) -> dict[str, Any]:
        return self.outcome.plan

    @property
    def machine(self) -> dict[str, Any]:
        return self.outcome.manifest.get("machine") or {}

    @property
    def world_size(self) -> int | None:
        """Processes the job ran on, as its plan resolved them (an override may say `auto`, or nothing)."""
        size = (self.plan.get("hardware") or {}).get("world_size")
        return size if isinstance(size, int) and not isinstance(size, bool) else None

    def row(self, swept: list[str]) -> list[str]:
        shown = " ".join(f"{k}={self.overrides[k]}" for k in swept if k in self.overrides) or "-"
        return [self.name, shown, self.status, _fmt(self.best), _fmt(self.test), _fmt(self.epochs),
                _fmt(self.wall_s, 1), _fmt(self.samples_per_s, 0)]  # fmt: skip


def columns(metric: str) -> list[str]:
    return ["job", "overrides", "status", f"best {metric}", test_metric(metric), "epochs", "wall s", "samples/s"]


def test_metric(metric: str) -> str:
    """The test counterpart of a validation metric: test/acc for val/acc."""
    return "test/" + metric.split("/", 1)[1] if "/" in metric else f"test_{metric}"


def _fmt(value: float | int | None, digits: int = 4) -> str:
    if value is None:
        return "-"
    return str(value) if isinstance(value, int) else f"{value:.{digits}f}"


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text not in (None, "") else None
    except ValueError:
        return None
    return value if value is None or math.isfinite(value) else None


def objective_of(outcome: JobOutcome) -> tuple[str, str]:
    """The objective a job was judged by: from its results, else its plan (a job still running)."""
    found = (outcome.results or {}).get("objective") or outcome.plan.get("objective") or {}
    return str(found.get("metric") or DEFAULT_OBJECTIVE[0]), str(found.get("direction") or DEFAULT_OBJECTIVE[1])


def _loss_column(header: list[str]) -> str | None:
    """The history's training loss per step: `train/loss_step` (the built-in classifier), else a training
    loss column of the module's own."""
    for name in ("train/loss_step", "train/loss", "train_loss"):
        if name in header:
            return name
    return next((h for h in header if h.startswith("train") and "loss" in h and "epoch" not in h), None)


def load_job(outcome: JobOutcome) -> Job:
    metric, direction = objective_of(outcome)
    job = Job(outcome, metric, direction)
    history = outcome.run_dir.history
    if history.is_file():
        with history.open(newline="") as f:
            reader = csv.DictReader(f)
            loss_column = _loss_column(list(reader.fieldnames or []))
            # A row holds a training value or a validation value (or a test one, or the learning rate).
            for row in reader:
                step = _number(row.get("step"))
                if step is None:
                    continue
                if loss_column is not None and (loss := _number(row.get(loss_column))) is not None:
                    job.train_loss.append((int(step), loss))
                if (value := _number(row.get(metric))) is not None:
                    job.validation.append((int(step), value))
    values = [v for _, v in job.validation]
    if values:
        job.best = max(values) if direction == "max" else min(values)
    results = outcome.results or {}
    if results:
        job.best = (results.get("objective") or {}).get("value", job.best) if job.best is None else job.best
        job.test = (results.get("metrics") or {}).get(test_metric(metric))
        job.epochs = results.get("epochs")
        # Training steps when the run timed them (start-up and the final validation left out), else the whole fit.
        job.samples_per_s = results.get("train_samples_per_second") or results.get("samples_per_second")
    manifest = outcome.manifest
    if manifest.get("started_at") and manifest.get("finished_at"):
        start, end = (datetime.fromisoformat(manifest[k]) for k in ("started_at", "finished_at"))
        job.wall_s = (end - start).total_seconds()
    return job


def swept_keys(jobs: list[Job]) -> list[str]:
    """Override keys whose values differ between jobs, in command-line order."""
    keys: list[str] = []
    for job in jobs:
        keys += [k for k in job.overrides if k not in keys]
    return [k for k in keys if len({job.overrides.get(k) for job in jobs}) > 1]


def _sort_key(job: Job) -> tuple:
    # Ranked on validation, as a sweeper would pick; the test metric is shown, never used to choose.
    sign = -1.0 if job.direction == "max" else 1.0
    return (job.best is None, sign * (job.best or 0.0), job.name)


def write_report(sweep_dir: Path, out_dir: Path | None = None) -> dict[str, Any]:
    """Write report.md, report.csv, heatmap.png (two swept parameters) and curves.png; for a search (a
    search.json in the sweep dir) its section and its plots; for jobs that differ in world size scaling.png
    and an efficiency table. Return a summary."""
    jobs = [load_job(outcome) for outcome in find_jobs(sweep_dir)]
    out_dir = out_dir or sweep_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    swept = swept_keys(jobs)
    metric, direction = next(((j.metric, j.direction) for j in jobs if j.finished), (jobs[0].metric, jobs[0].direction))
    done = sorted((j for j in jobs if j.finished), key=_sort_key)
    pending = [j for j in jobs if not j.finished]
    failed = [j for j in pending if j.status in FAILED]
    rows = [j.row(swept) for j in done] + [j.row(swept) for j in pending]
    header = columns(metric)

    with (out_dir / "report.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    best_first = "highest" if direction == "max" else "lowest"
    lines = [
        f"# Sweep report: {sweep_dir.name}",
        "",
        f"{len(done)} of {len(jobs)} jobs finished, sorted by best {metric} ({best_first} first; "
        f"{test_metric(metric)} is reported, not used to choose).",
        "",
    ]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    if failed:
        lines += ["", "Failed: " + "; ".join(f"{j.name} ({j.status}: {j.reason or '-'})" for j in failed)]
    for status in ("running", "never started"):
        if jobs_with := [j for j in pending if j.status == status]:
            lines += ["", f"{status.capitalize()}: " + ", ".join(f"{j.name} ({j.path})" for j in jobs_with)]
    search = load_search(sweep_dir)
    written = []
    # A search's values rarely repeat: its grid would be mostly empty (its own plots follow).
    if search is None and len(swept) >= 2 and done:
        written.append(plots.save(heatmap_figure(done, swept[0], swept[1]), out_dir / "heatmap.png"))
    if any(j.train_loss or j.validation for j in jobs):
        written.append(plots.save(curves_figure(jobs, swept), out_dir / "curves.png"))
    lines += [""] + [f"![{p.stem}]({p.name})" for p in written]
    if search is not None:
        found = write_search_plots(search, sweep_dir, out_dir)
        lines += ["", *search_lines(search, {j.name: j.test for j in jobs}, test_metric(metric)), ""]
        lines += [f"![{p.stem}]({p.name})" for p in found]
        written += found
    if points := scaling_points(jobs, swept):
        note = machine_note(jobs, points)
        written.append(write_scaling_plot(points, note, out_dir))
        lines += ["", *scaling_lines(points, note), "", "![scaling](scaling.png)"]
    (out_dir / "report.md").write_text("\n".join(lines) + "\n")
    return {"jobs": len(jobs), "finished": len(done), "pending": [j.name for j in pending], "rows": rows,
            "swept": swept, "search": search, "scaling": points,
            "files": [out_dir / "report.md", out_dir / "report.csv", *written]}  # fmt: skip


def _sortable(value: str) -> tuple:
    number = _number(value)
    return (0, number, "") if number is not None else (1, 0.0, value)


def heatmap_figure(jobs: list[Job], x_key: str, y_key: str) -> Figure:
    """The best objective of a grid sweep over two parameters, one cell per pair of values."""
    xs = sorted({j.overrides.get(x_key, "-") for j in jobs}, key=_sortable)
    ys = sorted({j.overrides.get(y_key, "-") for j in jobs}, key=_sortable)
    grid = [[math.nan] * len(xs) for _ in ys]
    for job in jobs:
        value = job.best if job.best is not None else job.test
        if value is not None:
            grid[ys.index(job.overrides.get(y_key, "-"))][xs.index(job.overrides.get(x_key, "-"))] = value
    metric = jobs[0].metric if jobs else DEFAULT_OBJECTIVE[0]
    fig, (ax,) = plots.figure(1.6 + 1.2 * len(xs), 1.2 + 0.8 * len(ys))
    image = ax.imshow(grid, cmap="viridis" if jobs and jobs[0].direction == "max" else "viridis_r", aspect="auto")
    ax.set_xticks(range(len(xs)), [plots.short(x) for x in xs])
    ax.set_yticks(range(len(ys)), [plots.short(y) for y in ys])
    ax.set_xlabel(x_key)
    ax.set_ylabel(y_key)
    for r, row in enumerate(grid):
        for c, value in enumerate(row):
            if not math.isnan(value):
                ax.text(c, r, f"{value:.4f}", ha="center", va="center", color="white", fontsize=9)
    fig.colorbar(image, ax=ax, label=f"best {metric}")
    ax.set_title(f"best {metric}")
    return fig


def curves_figure(jobs: list[Job], swept: list[str]) -> Figure:
    """Training loss and the objective against the optimizer step, every logged point, one colour per job in
    both panels; the legend beside them, values in 3 significant digits."""
    metric = jobs[0].metric if jobs else DEFAULT_OBJECTIVE[0]
    fig, (loss, valid) = plots.figure(12.5, 4.5, ncols=2)
    valid.sharex(loss)  # the same steps side by side, even for a run validated once
    drawn_any = []
    for job in jobs:
        if not (job.train_loss or job.validation):
            continue
        label = " ".join(f"{k}={plots.short(job.overrides.get(k))}" for k in swept) or f"job {job.name}"
        dots = "." if len(job.train_loss) < 30 else None  # few points: each one shown
        line = loss.plot([s for s, _ in job.train_loss], [v for _, v in job.train_loss], marker=dots, label=label)
        valid.plot([s for s, _ in job.validation], [v for _, v in job.validation], marker="o",
                   color=line[0].get_color())  # fmt: skip
        drawn_any.append(line[0])
    losses = [v for j in jobs for _, v in j.train_loss]
    if plots.log_scale_fits(losses) and max(losses) >= 10 * min(losses):
        loss.set_yscale("log")  # losses that fall by orders of magnitude; a narrower range reads better linear
    for ax, name in ((loss, "training loss"), (valid, metric)):
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        ax.set_title(f"{name} per optimizer step")
    if drawn_any:
        fig.legend(handles=drawn_any, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    return fig
