"""Offline report of a sweep: a table (markdown, CSV) and plots, from the files the runs wrote; for a
hyperparameter search its trials (hydralight.search_report), for a sweep over world sizes its scaling
(hydralight.scaling_report)."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from hydralight import plots
from hydralight.errors import UserError
from hydralight.scaling_report import machine_note, scaling_lines, scaling_points, write_scaling_plot
from hydralight.search_report import load_search, search_lines, search_outcome, write_search_plots

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLUMNS = ["job", "overrides", "status", "best val/acc", "test/acc", "epochs", "wall s", "samples/s"]
# Written into the sweep dir by the submitit launchers: every job submitted, whether it started or not.
JOBS_FILE = "jobs.json"


@dataclass
class Job:
    name: str
    path: Path
    overrides: dict[str, str]
    finished: bool
    best_val_acc: float | None = None
    test_acc: float | None = None
    epochs: int | None = None
    wall_s: float | None = None
    samples_per_s: float | None = None
    curve: list[tuple[int, float]] = field(default_factory=list)  # (epoch, val/acc)
    # Every logged point by optimizer step: (step, train/loss_step) and (step, val/acc).
    train_loss: list[tuple[int, float]] = field(default_factory=list)
    val_acc: list[tuple[int, float]] = field(default_factory=list)
    plan: dict[str, Any] = field(default_factory=dict)  # plan.yaml: the resolved resources
    machine: dict[str, Any] = field(default_factory=dict)  # the manifest's record of the machine
    # finished | failed | interrupted | running | never started
    status: str = "running"
    reason: str | None = None

    def row(self, swept: list[str]) -> list[str]:
        shown = " ".join(f"{k}={self.overrides[k]}" for k in swept if k in self.overrides) or "-"
        return [self.name, shown, self.status, _fmt(self.best_val_acc), _fmt(self.test_acc), _fmt(self.epochs),
                _fmt(self.wall_s, 1), _fmt(self.samples_per_s, 0)]  # fmt: skip

    @property
    def world_size(self) -> int | None:
        """Processes the job ran on, as its plan resolved them (an override may say `auto`, or nothing)."""
        size = (self.plan.get("hardware") or {}).get("world_size")
        return size if isinstance(size, int) and not isinstance(size, bool) else None


def _fmt(value: float | int | None, digits: int = 4) -> str:
    if value is None:
        return "-"
    return str(value) if isinstance(value, int) else f"{value:.{digits}f}"


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return None


def load_job(path: Path) -> Job:
    overrides_file = path / ".hydra" / "overrides.yaml"
    items = yaml.safe_load(overrides_file.read_text()) if overrides_file.is_file() else []
    overrides = dict(item.split("=", 1) for item in items or [] if "=" in item)
    results_file = path / "results.json"
    job = Job(path.name, path, overrides, finished=results_file.is_file())
    curve: dict[int, float] = {}
    metrics_file = path / "csv" / "metrics.csv"
    if metrics_file.is_file():
        with metrics_file.open(newline="") as f:
            # A row holds a train value or a validation value (or a test one, or the learning rate).
            for row in csv.DictReader(f):
                acc, epoch, step = (_number(row.get(k)) for k in ("val/acc", "epoch", "step"))
                if acc is not None and epoch is not None:
                    curve[int(epoch)] = acc
                loss = _number(row.get("train/loss_step"))
                if step is not None and loss is not None:
                    job.train_loss.append((int(step), loss))
                if step is not None and acc is not None:
                    job.val_acc.append((int(step), acc))
    job.curve = sorted(curve.items())
    job.best_val_acc = max(curve.values()) if curve else None
    if job.finished:
        results = json.loads(results_file.read_text())
        job.test_acc = results.get("test/acc")
        job.epochs = results.get("epochs")
        # Training steps when the run timed them (start-up and the final validation left out), else the whole fit.
        job.samples_per_s = results.get("train_samples_per_second") or results.get("samples_per_second")
        if job.best_val_acc is None:
            job.best_val_acc = results.get("metrics", {}).get("val/acc")
    plan_file = path / "plan.yaml"
    job.plan = (yaml.safe_load(plan_file.read_text()) if plan_file.is_file() else None) or {}
    manifest_file = path / "manifest.json"
    job.status = "finished" if job.finished else "running"
    if manifest_file.is_file():
        manifest = json.loads(manifest_file.read_text())
        job.plan = job.plan or manifest.get("plan") or {}
        job.machine = manifest.get("machine") or {}
        job.status = manifest.get("status") or job.status
        job.reason = manifest.get("error")
        job.finished = job.status == "finished"
        if manifest.get("started_at") and manifest.get("finished_at"):
            start, end = (datetime.fromisoformat(manifest[k]) for k in ("started_at", "finished_at"))
            job.wall_s = (end - start).total_seconds()
    return job


def find_jobs(sweep_dir: Path) -> list[Job]:
    if not sweep_dir.is_dir():
        raise UserError(f"{sweep_dir} is not a folder; pass the multirun dir of a sweep (multirun/<date>/<time>)")
    dirs = [
        p for p in sweep_dir.iterdir() if p.is_dir() and ((p / ".hydra").is_dir() or (p / "manifest.json").is_file())
    ]
    jobs = [load_job(p) for p in dirs]
    submitted = json.loads((sweep_dir / JOBS_FILE).read_text()) if (sweep_dir / JOBS_FILE).is_file() else {}
    for name, entry in submitted.items():
        if not (sweep_dir / name).is_dir():
            overrides = dict(item.split("=", 1) for item in entry.get("overrides", []) if "=" in item)
            jobs.append(Job(name, sweep_dir / name, overrides, finished=False, status="never started"))
    if not jobs:
        raise UserError(f"no jobs in {sweep_dir}: expected the numbered job folders of `python train.py -m ...`")
    number = lambda job: (not job.name.isdigit(), int(job.name) if job.name.isdigit() else 0, job.name)  # noqa: E731
    return sorted(jobs, key=number)


def sweep_outcome(sweep_dir: Path) -> tuple[str, bool]:
    """One line on how a sweep ended (jobs done, failed with their reasons, not finished), and whether all finished."""
    jobs = find_jobs(sweep_dir)
    done = [j for j in jobs if j.finished]
    failed = [j for j in jobs if j.status in ("failed", "interrupted")]
    other = [j for j in jobs if not j.finished and j not in failed]
    line = f"sweep {sweep_dir}: {len(done)} of {len(jobs)} jobs done"
    if failed:
        reasons = "; ".join(f"#{j.name} {j.status}: {(j.reason or '-')[:160]}" for j in failed)
        line += f", {len(failed)} failed ({reasons})"
    if other:
        line += f", {len(other)} did not finish ({', '.join(f'#{j.name} {j.status}' for j in other)})"
    line += f"; details: python scripts/sweep_report.py {sweep_dir}"
    return line, len(done) == len(jobs)


class SweepSummary(Callback):
    """Hydra callback: the one line a sweep ends with; exit code 1 when any job did not finish (a search:
    when no trial did)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        try:
            # A search expects some trials to fail; it failed only when none succeeded.
            line, all_done = search_outcome(sweep_dir) or sweep_outcome(sweep_dir)
        except UserError:
            return  # no job ran (a dry run, a plan-only sweep)
        print(line, flush=True)
        if not all_done:
            raise SystemExit(1)


def swept_keys(jobs: list[Job]) -> list[str]:
    """Override keys whose values differ between jobs, in command-line order."""
    keys: list[str] = []
    for job in jobs:
        keys += [k for k in job.overrides if k not in keys]
    return [k for k in keys if len({job.overrides.get(k) for job in jobs}) > 1]


def _sort_key(job: Job) -> tuple:
    # Ranked on validation, as a sweeper would pick; the test accuracy is shown, never used to choose.
    metric = job.best_val_acc if job.best_val_acc is not None else job.test_acc
    return (metric is None, -(metric or 0.0), job.name)


def write_report(sweep_dir: Path, out_dir: Path | None = None) -> dict[str, Any]:
    """Write report.md, report.csv, heatmap.png (two swept parameters) and curves.png; for a search (a
    search.json in the sweep dir) its section, history.png and params.png, heatmap.png then a scatter of
    the two searched parameters; for jobs that differ in world size scaling.png and an efficiency table.
    Return a summary."""
    jobs = find_jobs(sweep_dir)
    out_dir = out_dir or sweep_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    swept = swept_keys(jobs)
    done = sorted((j for j in jobs if j.finished), key=_sort_key)
    pending = [j for j in jobs if not j.finished]
    failed = [j for j in pending if j.status in ("failed", "interrupted")]
    rows = [j.row(swept) for j in done] + [j.row(swept) for j in pending]

    with (out_dir / "report.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    lines = [
        f"# Sweep report: {sweep_dir.name}",
        "",
        f"{len(done)} of {len(jobs)} jobs finished, sorted by best val/acc (test/acc is reported, not used to choose).",
        "",
    ]
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
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
    if any(j.train_loss or j.val_acc for j in jobs):
        written.append(plots.save(curves_figure(jobs, swept), out_dir / "curves.png"))
    lines += [""] + [f"![{p.stem}]({p.name})" for p in written]
    if search is not None:
        found = write_search_plots(search, out_dir)
        lines += ["", *search_lines(search, {j.name: j.test_acc for j in jobs}), ""]
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
    return (0, number, "") if number is not None and math.isfinite(number) else (1, 0.0, value)


def heatmap_figure(jobs: list[Job], x_key: str, y_key: str) -> Figure:
    """Best val/acc of a grid sweep over two parameters, one cell per pair of values."""
    xs = sorted({j.overrides.get(x_key, "-") for j in jobs}, key=_sortable)
    ys = sorted({j.overrides.get(y_key, "-") for j in jobs}, key=_sortable)
    grid = [[math.nan] * len(xs) for _ in ys]
    for job in jobs:
        value = job.best_val_acc if job.best_val_acc is not None else job.test_acc
        if value is not None:
            grid[ys.index(job.overrides.get(y_key, "-"))][xs.index(job.overrides.get(x_key, "-"))] = value
    fig, (ax,) = plots.figure(1.6 + 1.2 * len(xs), 1.2 + 0.8 * len(ys))
    image = ax.imshow(grid, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(xs)), xs)
    ax.set_yticks(range(len(ys)), ys)
    ax.set_xlabel(x_key)
    ax.set_ylabel(y_key)
    for r, row in enumerate(grid):
        for c, value in enumerate(row):
            if not math.isnan(value):
                ax.text(c, r, f"{value:.4f}", ha="center", va="center", color="white", fontsize=9)
    fig.colorbar(image, ax=ax, label="best val/acc")
    ax.set_title("best val/acc")
    return fig


def curves_figure(jobs: list[Job], swept: list[str]) -> Figure:
    """Training loss and validation accuracy against the optimizer step, every logged point, one line per
    job (a run of one epoch still shows how it learned)."""
    fig, (loss, acc) = plots.figure(12, 4.5, ncols=2)
    acc.sharex(loss)  # the same steps side by side, even for a run validated once
    for job in jobs:
        if not (job.train_loss or job.val_acc):
            continue
        label = " ".join(f"{k}={job.overrides.get(k)}" for k in swept) or job.name
        # One colour per job in both panels; a lone validation is a dot.
        drawn = loss.plot([s for s, _ in job.train_loss], [v for _, v in job.train_loss], label=label)
        acc.plot([s for s, _ in job.val_acc], [v for _, v in job.val_acc], marker="o", color=drawn[0].get_color(),
                 label=label)  # fmt: skip
    if plots.log_scale_fits([v for j in jobs for _, v in j.train_loss]):
        loss.set_yscale("log")  # losses fall by orders of magnitude
    for ax, metric in ((loss, "train/loss_step"), (acc, "val/acc")):
        ax.set_xlabel("step")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        ax.set_title(f"{metric} per optimizer step")
    acc.legend(fontsize=8)
    return fig
