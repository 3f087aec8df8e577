"""Offline report of a sweep: a table (markdown, CSV) and plots, from the files the runs wrote; for a
hyperparameter search its trials (hydralight.reports.search), for a sweep over world sizes its scaling
(hydralight.reports.scaling). Every job is judged by its objective (`objective.metric`, in its direction),
the way a sweeper picks; test metrics are shown, never used to choose.

Jobs that differ only in the keys a report groups over (`seed` by default) are one result: the report shows
one row per group (mean, sample standard deviation, min, max and n of its finished jobs) and draws each
group's curves as a mean with a min-max band; one seed alone says little about a setting."""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydralight.errors import UserError
from hydralight.reports import plots
from hydralight.reports.files import staged
from hydralight.reports.scaling import machine_note, scaling_lines, scaling_points, write_scaling_plot
from hydralight.reports.search import load_search, search_lines, surface_note, write_search_plots
from hydralight.rundir.layout import history_column
from hydralight.rundir.outcome import FAILED, JobOutcome, find_jobs, test_counterpart

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DEFAULT_OBJECTIVE = ("val/acc", "max")
# Keys whose values make runs of one setting rather than settings of their own.
DEFAULT_GROUP_OVER = ("seed",)


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
    def global_size(self) -> int | None:
        """The global batch the job trained with, as its plan resolved it."""
        size = (self.plan.get("task") or {}).get("global_size")
        return size if isinstance(size, int) and not isinstance(size, bool) else None

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
    return ["job", "overrides", "status", f"best {metric}", test_counterpart(metric), "epochs", "wall s", "samples/s"]


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
    """The history's training loss per step: `train/loss_step` (the built-in modules'), else a training
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
            header = list(reader.fieldnames or [])
            loss_column, metric_column = _loss_column(header), history_column(header, metric)
            # A row holds a training value or a validation value (or a test one, or the learning rate).
            for row in reader:
                step = _number(row.get("step"))
                if step is None:
                    continue
                if loss_column is not None and (loss := _number(row.get(loss_column))) is not None:
                    job.train_loss.append((int(step), loss))
                if metric_column is not None and (value := _number(row.get(metric_column))) is not None:
                    job.validation.append((int(step), value))
    values = [v for _, v in job.validation]
    if values:
        job.best = max(values) if direction == "max" else min(values)
    results = outcome.results or {}
    if results:
        job.best = (results.get("objective") or {}).get("value", job.best) if job.best is None else job.best
        job.test = (results.get("metrics") or {}).get(test_counterpart(metric))
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


def _bare(key: str) -> str:
    """An override's key without Hydra's prefixes: `+data.split_seed` and `data.split_seed` name one key."""
    return key.lstrip("+~")


@dataclass
class Spread:
    """One quantity over the runs of a group: mean, sample standard deviation (n - 1), min, max."""

    values: list[float]

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.values) if self.values else None

    @property
    def std(self) -> float | None:
        return statistics.stdev(self.values) if len(self.values) > 1 else None

    def cells(self) -> list[str]:
        low, high = (min(self.values), max(self.values)) if self.values else (None, None)
        return [_fmt(self.mean), _fmt(self.std), _fmt(low), _fmt(high)]


@dataclass
class Group:
    """Jobs that differ only in the keys grouped over: one setting, run once per seed (or split, ...)."""

    jobs: list[Job]
    overrides: dict[str, str]  # what its jobs share, the grouped keys left out

    @property
    def counted(self) -> list[Job]:
        """The jobs its figures are made of: finished, with an objective. A failed one is counted, not averaged."""
        return [j for j in self.jobs if j.finished and j.best is not None]

    @property
    def objective(self) -> Spread:
        return Spread([j.best for j in self.counted if j.best is not None])

    @property
    def tests(self) -> Spread:
        return Spread([j.test for j in self.counted if isinstance(j.test, int | float)])

    @property
    def direction(self) -> str:
        return self.jobs[0].direction

    def n(self) -> str:
        """`3`, or `2 of 3, 1 failed`: how many runs the mean is over, and what became of the others."""
        counted = self.counted
        if len(counted) == len(self.jobs):
            return str(len(counted))
        others: dict[str, int] = {}
        for job in self.jobs:
            if job not in counted:
                status = job.status if not job.finished else f"no {job.metric}"
                others[status] = others.get(status, 0) + 1
        return f"{len(counted)} of {len(self.jobs)}, " + ", ".join(f"{n} {s}" for s, n in others.items())

    def row(self, shown_keys: list[str]) -> list[str]:
        shown = " ".join(f"{k}={self.overrides[k]}" for k in shown_keys if k in self.overrides) or "-"
        return [shown, self.n(), *self.objective.cells(), *self.tests.cells(), ", ".join(j.name for j in self.jobs)]


def group_columns(metric: str) -> list[str]:
    test = test_counterpart(metric)
    stats = ("mean", "std", "min", "max")
    return ["overrides", "n", *(f"best {metric} {s}" for s in stats), *(f"{test} {s}" for s in stats), "jobs"]


def group_jobs(jobs: list[Job], group_over: Sequence[str]) -> list[Group]:
    """Jobs whose overrides are the same but for the `group_over` keys, one group each, in the order of
    their first job; sorted by the mean objective in its direction, groups without one last."""
    over = {_bare(k) for k in group_over}
    groups: dict[tuple, Group] = {}
    for job in jobs:
        shared = {k: v for k, v in job.overrides.items() if _bare(k) not in over}
        groups.setdefault(tuple(sorted(shared.items())), Group([], shared)).jobs.append(job)

    def key(group: Group) -> tuple:
        mean = group.objective.mean
        sign = -1.0 if group.direction == "max" else 1.0
        return (mean is None, sign * (mean or 0.0))

    return sorted(groups.values(), key=key)  # stable: ties keep the order of their first job


def check_group_over(jobs: list[Job], group_over: Sequence[str], sweep_dir: Path) -> None:
    """A key named to group over that no job sets is a typo, or the wrong sweep: one line, nothing written."""
    given = {_bare(k) for job in jobs for k in job.overrides}
    if missing := [k for k in group_over if _bare(k) not in given]:
        swept = ", ".join(swept_keys(jobs)) or "none"
        raise UserError(
            f"--group-over {','.join(missing)}: no job of {sweep_dir} sets {' or '.join(missing)} "
            f"(its swept keys: {swept}); name keys the sweep varies, or --group-over none for one row per job"
        )


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def write_report(
    sweep_dir: Path, out_dir: Path | None = None, group_over: Sequence[str] | None = None
) -> dict[str, Any]:
    """Write report.md, report.csv, heatmap.png (two swept parameters) and curves.png; for a search (a
    search.json in the sweep dir) its section and its plots; for jobs that differ in world size scaling.png
    and an efficiency table. Return a summary.

    Jobs that differ only in `group_over` keys (None: `seed`, when the sweep varies it; a key given that no
    job sets is refused) are one row each group in report.md and report.csv, the per-job table below them
    in report.md and in report_jobs.csv; curves.png draws each group's mean with its min-max band."""
    jobs = [load_job(outcome) for outcome in find_jobs(sweep_dir)]
    if group_over is None:
        group_over = DEFAULT_GROUP_OVER
    else:
        check_group_over(jobs, group_over, sweep_dir)
    out_dir = out_dir or sweep_dir
    swept = swept_keys(jobs)
    grouped_keys = [k for k in swept if _bare(k) in {_bare(g) for g in group_over}]
    groups = group_jobs(jobs, grouped_keys) if grouped_keys else []
    shown_keys = [k for k in swept if k not in grouped_keys]
    metric, direction = next(((j.metric, j.direction) for j in jobs if j.finished), (jobs[0].metric, jobs[0].direction))
    final_dir = out_dir
    with staged(final_dir) as out_dir:
        summary = _write(sweep_dir, out_dir, jobs, swept, grouped_keys, groups, shown_keys, metric, direction)
    summary["files"] = [final_dir / path.name for path in summary["files"]]
    return summary


def _write(sweep_dir: Path, out_dir: Path, jobs: list[Job], swept: list[str], grouped_keys: list[str],
           groups: list[Group], shown_keys: list[str], metric: str, direction: str) -> dict[str, Any]:  # fmt: skip
    """write_report's files, into `out_dir`; its summary."""
    done = sorted((j for j in jobs if j.finished), key=_sort_key)
    pending = [j for j in jobs if not j.finished]
    failed = [j for j in pending if j.status in FAILED]
    rows = [j.row(swept) for j in done] + [j.row(swept) for j in pending]
    header = columns(metric)
    group_rows = [g.row(shown_keys) for g in groups]
    tables = [(out_dir / "report.csv", group_columns(metric), group_rows), (out_dir / "report_jobs.csv", header, rows)]
    for path, head, body in tables if groups else [(out_dir / "report.csv", header, rows)]:
        with path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(head)
            writer.writerows(body)
    best_first = "highest" if direction == "max" else "lowest"
    lines = [f"# Sweep report: {sweep_dir.name}", ""]
    if groups:
        lines += [
            f"{len(done)} of {len(jobs)} jobs finished, in {len(groups)} group{'' if len(groups) == 1 else 's'} of jobs that differ only in "
            f"{', '.join(grouped_keys)}; sorted by the mean best {metric} ({best_first} first; "
            f"{test_counterpart(metric)} is reported, not used to choose). Mean, sample standard deviation (n - 1), "
            "min and max over each group's finished jobs; n counts them, and the jobs that failed or have not "
            "finished are named beside it, not averaged.",
            "",
            *_table(group_columns(metric), group_rows),
            "",
            "## Jobs",
            "",
            f"Every job, sorted by best {metric} ({best_first} first):",
            "",
        ]
    else:
        lines += [
            f"{len(done)} of {len(jobs)} jobs finished, sorted by best {metric} ({best_first} first; "
            f"{test_counterpart(metric)} is reported, not used to choose).",
            "",
        ]
    lines += _table(header, rows)
    if failed:
        lines += ["", "Failed: " + "; ".join(f"{j.name} ({j.status}: {j.reason or '-'})" for j in failed)]
    for status in ("running", "never started"):
        if jobs_with := [j for j in pending if j.status == status]:
            lines += ["", f"{status.capitalize()}: " + ", ".join(f"{j.name} ({j.path})" for j in jobs_with)]
    search = load_search(sweep_dir)
    written = []
    # A search's values rarely repeat: its grid would be mostly empty (its own plots follow).
    if search is None and len(shown_keys) >= 2 and done:
        if groups:
            cells = [(g.overrides, g.objective.mean, g.tests.mean) for g in groups if g.counted]
            label = f"mean best {metric} over {', '.join(grouped_keys)}"
        else:
            cells = [(j.overrides, j.best, j.test) for j in done]
            label = f"best {metric}"
        figure = heatmap_figure(cells, shown_keys[0], shown_keys[1], label, direction)
        written.append(plots.save(figure, out_dir / "heatmap.png"))
    if any(j.train_loss or j.validation for j in jobs):
        figure = group_curves_figure(groups, shown_keys, grouped_keys) if groups else curves_figure(jobs, swept)
        written.append(plots.save(figure, out_dir / "curves.png"))
    lines += [""] + [f"![{p.stem}]({p.name})" for p in written]
    if search is not None:
        found = write_search_plots(search, sweep_dir, out_dir)
        lines += ["", *search_lines(search, {j.name: j.test for j in jobs}, test_counterpart(metric)), ""]
        lines += [f"![{p.stem}]({p.name})" for p in found]
        if note := surface_note(search):
            lines += ["", note]
        written += found
    if points := scaling_points(jobs, swept):
        note = machine_note(jobs, points)
        written.append(write_scaling_plot(points, note, out_dir))
        lines += ["", *scaling_lines(points, note), "", "![scaling](scaling.png)"]
    (out_dir / "report.md").write_text("\n".join(lines) + "\n")
    csvs = [path for path, _, _ in tables] if groups else [out_dir / "report.csv"]
    return {"jobs": len(jobs), "finished": len(done), "pending": [j.name for j in pending], "rows": rows,
            "swept": swept, "group_over": grouped_keys, "groups": groups, "group_rows": group_rows,
            "search": search, "scaling": points, "files": [out_dir / "report.md", *csvs, *written]}  # fmt: skip


def _sortable(value: str) -> tuple:
    number = _number(value)
    return (0, number, "") if number is not None else (1, 0.0, value)


def heatmap_figure(
    cells: list[tuple[dict[str, str], float | None, float | None]], x_key: str, y_key: str, label: str, direction: str
) -> Figure:
    """A grid sweep over two parameters, one cell per pair of values: (overrides, objective, test) of each job
    or group; the test value fills a cell only where the objective is missing."""
    xs = sorted({overrides.get(x_key, "-") for overrides, _, _ in cells}, key=_sortable)
    ys = sorted({overrides.get(y_key, "-") for overrides, _, _ in cells}, key=_sortable)
    grid = [[math.nan] * len(xs) for _ in ys]
    for overrides, best, test in cells:
        value = best if best is not None else test
        if value is not None:
            grid[ys.index(overrides.get(y_key, "-"))][xs.index(overrides.get(x_key, "-"))] = value
    fig, (ax,) = plots.figure(1.6 + 1.2 * len(xs), 1.2 + 0.8 * len(ys))
    image = ax.imshow(grid, cmap="viridis" if direction == "max" else "viridis_r", aspect="auto")
    ax.set_xticks(range(len(xs)), [plots.short(x) for x in xs])
    ax.set_yticks(range(len(ys)), [plots.short(y) for y in ys])
    ax.set_xlabel(x_key)
    ax.set_ylabel(y_key)
    for r, row in enumerate(grid):
        for c, value in enumerate(row):
            if not math.isnan(value):
                ax.text(c, r, f"{value:.4f}", ha="center", va="center", color="white", fontsize=9)
    fig.colorbar(image, ax=ax, label=label)
    ax.set_title(label)
    return fig


def x_axis(jobs: list[Job]) -> tuple[str, Callable[[Job, list[tuple[int, float]]], list[tuple[float, float]]]]:
    """What the curves' x-axis counts: optimizer steps, or samples seen when the jobs trained with different
    global batches (a step of 512 samples is not a step of 32), and how a job's points are placed on it."""
    sizes = {job.global_size for job in jobs if job.train_loss or job.validation}
    if len(sizes) > 1 and None not in sizes:
        return "samples seen", lambda job, points: [((step + 1) * (job.global_size or 1), v) for step, v in points]
    return "optimizer step", lambda job, points: [(float(step), v) for step, v in points]


def curves_figure(jobs: list[Job], swept: list[str]) -> Figure:
    """Training loss and the objective against the optimizer step (samples seen when the jobs' batches differ),
    every logged point, one colour per job in both panels; the legend beside them, values in 3 significant
    digits."""
    metric = jobs[0].metric if jobs else DEFAULT_OBJECTIVE[0]
    fig, (loss, valid) = plots.figure(12.5, 4.5, ncols=2)
    valid.sharex(loss)  # the same steps side by side, even for a run validated once
    axis, placed = x_axis(jobs)
    drawn_any = []
    for job in jobs:
        if not (job.train_loss or job.validation):
            continue
        label = " ".join(f"{k}={plots.short(job.overrides.get(k))}" for k in swept) or f"job {job.name}"
        dots = "." if len(job.train_loss) < 30 else None  # few points: each one shown
        train, validation = placed(job, job.train_loss), placed(job, job.validation)
        line = loss.plot([x for x, _ in train], [v for _, v in train], marker=dots, label=label)
        valid.plot([x for x, _ in validation], [v for _, v in validation], marker="o",
                   color=line[0].get_color())  # fmt: skip
        drawn_any.append(line[0])
    _finish_curves(fig, loss, valid, metric, [v for j in jobs for _, v in j.train_loss], drawn_any, "", axis)
    return fig


def mean_band(runs: list[list[tuple[float, float]]]) -> tuple[list[float], list[float], list[float], list[float]]:
    """At each step any run logged: the mean, min and max over the runs that logged it (a run's last value
    at a step it logged twice)."""
    by_step: dict[float, list[float]] = {}
    for points in runs:
        for step, value in dict(points).items():
            by_step.setdefault(step, []).append(value)
    steps = sorted(by_step)
    return (steps, [statistics.fmean(by_step[s]) for s in steps], [min(by_step[s]) for s in steps],
            [max(by_step[s]) for s in steps])  # fmt: skip


def group_curves_figure(groups: list[Group], shown: list[str], over: list[str]) -> Figure:
    """Training loss and the objective against the optimizer step (samples seen when the groups' batches
    differ), one colour per group: the mean over its finished jobs and a band from their min to their max (with
    a few seeds the range shows every run, where a standard deviation would be a guess). A curve of one point
    (runs validated once) is drawn as that point with a bar from min to max: a band of no width shows nothing."""
    metric = groups[0].jobs[0].metric if groups else DEFAULT_OBJECTIVE[0]
    fig, (loss, valid) = plots.figure(12.5, 4.5, ncols=2)
    valid.sharex(loss)
    axis, placed = x_axis([j for g in groups for j in g.counted])
    drawn_any = []
    for number, group in enumerate(groups):
        runs = [j for j in group.counted if j.train_loss or j.validation]
        if not runs:
            continue
        label = " ".join(f"{k}={plots.short(group.overrides.get(k))}" for k in shown) or f"group {number + 1}"
        colour = f"C{number % 10}"
        for ax, series, marker in (
            (loss, [placed(j, j.train_loss) for j in runs], "."),
            (valid, [placed(j, j.validation) for j in runs], "o"),
        ):
            steps, mean, low, high = mean_band(series)
            if len(steps) == 1:
                bar = ax.errorbar(steps, mean, yerr=[[mean[0] - low[0]], [high[0] - mean[0]]], fmt="o",
                                  color=colour, capsize=5, label=f"{label} (n={len(runs)})")  # fmt: skip
                if ax is loss:
                    drawn_any.append(bar.lines[0])
                continue
            shown_marker = marker if ax is valid or len(steps) < 30 else None  # few points: each one shown
            line = ax.plot(steps, mean, marker=shown_marker, color=colour, label=f"{label} (n={len(runs)})")
            ax.fill_between(steps, low, high, color=colour, alpha=0.2, linewidth=0)
            if ax is loss:
                drawn_any.append(line[0])
    note = f": mean over {', '.join(over) or 'runs'}, band min-max"
    _finish_curves(fig, loss, valid, metric, [v for g in groups for j in g.counted for _, v in j.train_loss],
                   drawn_any, note, axis)  # fmt: skip
    return fig


def _finish_curves(fig: Figure, loss: Any, valid: Any, metric: str, losses: list[float], handles: list[Any],
                   note: str, axis: str = "optimizer step") -> None:  # fmt: skip
    if plots.log_scale_fits(losses) and max(losses) >= 10 * min(losses):
        loss.set_yscale("log")  # losses that fall by orders of magnitude; a narrower range reads better linear
    for ax, name in ((loss, "training loss"), (valid, metric)):
        ax.set_xlabel(axis)
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        ax.set_title(f"{name} by {axis}{note}")
    if handles:
        fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
