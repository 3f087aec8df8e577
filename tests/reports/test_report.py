"""A real 2 x 2 sweep, then its report; synthetic grid, search and scaling sweep dirs; a real scaling sweep."""

import csv
import itertools
import json
import re
import shutil
import statistics
import sys

import pytest
import yaml
from conftest import TINY, compose_config, csv_rows, run_cli, run_python
from conftest import plan_of as run_plan_of
from omegaconf import OmegaConf

from hydralight.errors import UserError
from hydralight.reports.scaling import machine_note, scaling_figure
from hydralight.reports.search import load_search, load_study, write_search_plots
from hydralight.reports.sweep import curves_figure, group_curves_figure, group_jobs, load_job, write_report
from hydralight.rundir.outcome import find_jobs


def jobs_of(sweep_dir):
    return [load_job(outcome) for outcome in find_jobs(sweep_dir)]


@pytest.fixture(scope="module")
def sweep(tiny_data, tmp_path_factory):
    sweep_dir = tmp_path_factory.mktemp("sweep") / "multirun"
    args = [
        "-m",
        *TINY,
        "trainer.max_epochs=2",
        "batch.global_size=16,32",
        "optim.lr=0.001,0.01",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    result = run_cli(args, sweep_dir, tiny_data)
    assert result.returncode == 0, result.stderr
    return sweep_dir


def report(*args):
    return run_python([sys.executable, "-m", "hydralight.report", *map(str, args)], timeout=120)


@pytest.mark.slow
def test_report_table_and_plots(sweep, tmp_path):
    result = report(sweep, "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    with (tmp_path / "report.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    for row in rows:
        results = json.loads((sweep / row["job"] / "results.json").read_text())
        assert float(row["test/acc"]) == pytest.approx(results["test/acc"], abs=1e-4)
        assert int(row["epochs"]) == 2
        assert "batch.global_size=" in row["overrides"] and "optim.lr=" in row["overrides"]
    accs = [float(r["best val/acc"]) for r in rows]
    assert accs == sorted(accs, reverse=True)  # chosen on validation, never on test
    for name in ("heatmap.png", "curves.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        import matplotlib.image

        assert matplotlib.image.imread(tmp_path / name).shape[0] > 100
    assert "| job | overrides |" in (tmp_path / "report.md").read_text()


def test_failed_running_and_never_started_jobs_are_told_apart(sweep, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(sweep, copy)
    (copy / "2" / "results.json").unlink()
    manifest = json.loads((copy / "2" / "manifest.json").read_text())
    (copy / "2" / "manifest.json").write_text(json.dumps({**manifest, "status": "running"}))
    (copy / "1" / "manifest.json").write_text(json.dumps({**manifest, "status": "failed", "error": "the loss is nan"}))
    (copy / "1" / "results.json").unlink()
    # A job its plan refused keeps no Hydra record: what it was run with is in its manifest.
    from hydralight.rundir.outcome import read_job

    typed = read_job(copy / "1").overrides
    shutil.rmtree(copy / "1" / ".hydra")
    failed = json.loads((copy / "1" / "manifest.json").read_text())
    (copy / "1" / "manifest.json").write_text(
        json.dumps({**failed, "overrides": [f"{k}={v}" for k, v in typed.items()]})
    )
    assert typed and read_job(copy / "1").overrides == typed
    # A fifth job was submitted but never started: only the launcher's record knows of it.
    (copy / "jobs.json").write_text(json.dumps({"4": {"overrides": ["optim.lr=0.1"], "job_id": "77"}}))
    result = report(copy)
    assert result.returncode == 0, result.stderr
    assert "2 of 5 jobs finished" in result.stdout
    assert "Failed: 1 (failed: the loss is nan)" in result.stdout
    assert "Running: 2 (" in result.stdout and "Never started: 4 (" in result.stdout
    assert "not finished: 1, 2, 4" in result.stderr


def test_empty_sweep_dir_is_one_clear_line(tmp_path):
    result = report(tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("error: no jobs in") and len(result.stderr.splitlines()) == 1


NAN_SWEEP = [*TINY, "trainer.limit_train_batches=null", "optim=sgd", "optim.lr_scaling=none", "optim.lr=0.01,1e12,0.05"]


@pytest.mark.parametrize("launcher", ["basic", pytest.param("local", marks=pytest.mark.slow)])
def test_a_failing_job_does_not_stop_the_sweep(tiny_data, tmp_path, launcher):
    sweep_dir = tmp_path / "sweep"
    chosen = [] if launcher == "basic" else ["hydra/launcher=local"]
    result = run_cli(["-m", *NAN_SWEEP, *chosen, f"hydra.sweep.dir={sweep_dir}"], sweep_dir, tiny_data)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert "Traceback" not in output
    summary = [line for line in result.stdout.splitlines() if line.startswith(f"sweep {sweep_dir}:")]
    assert len(summary) == 1, output[-3000:]
    assert "2 of 3 jobs done, 1 failed (#1 failed: the loss is" in summary[0]
    assert "python -m hydralight.report" in summary[0]
    assert all((sweep_dir / str(i) / "results.json").is_file() for i in (0, 2))
    manifest = json.loads((sweep_dir / "1" / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "the loss is" in manifest["error"]
    # The NaN message tells the truth about what was kept.
    assert "no checkpoint was saved before it" in manifest["error"] or "holds the last state" in manifest["error"]
    shown = report(sweep_dir)
    assert "Failed: 1 (failed: the loss is" in shown.stdout


# Synthetic sweep dirs, written as a real run writes its files: the report is checked on known numbers.

MACHINE = {"hostname": "box7", "cpu_model": "Test CPU", "cpu_cores": 2, "memory_gb": 8.0, "gpus": [],
           "cuda": None, "cudnn": None, "nccl": None}  # fmt: skip
HEADER = ["epoch", "lr-Adam", "step", "test/acc", "test/loss", "test/samples", "train/loss_epoch",
          "train/loss_step", "val/acc", "val/loss", "val/samples"]  # fmt: skip


def plan_of(*overrides: str) -> dict:
    return run_plan_of(*overrides).to_dict()


def write_job(sweep_dir, name, overrides, *, plan=None, steps=10, vals=(), samples_per_s=1000.0, test_acc=0.9,
              status="finished"):  # fmt: skip
    """A job folder: Hydra's overrides, Lightning's metrics.csv (a row per logged value: the learning rate,
    a train loss, a validation), plan.yaml, manifest.json and, when finished, results.json."""
    job = sweep_dir / name
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(list(overrides)))
    (job / "csv").mkdir()
    with (job / "csv" / "metrics.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=HEADER)
        writer.writeheader()
        for step in range(steps):
            writer.writerow({"lr-Adam": 0.001, "step": step})
            writer.writerow({"epoch": 0, "step": step, "train/loss_step": 2.0 / (step + 1)})
        for step, acc in vals:
            writer.writerow({"epoch": 0, "step": step, "val/acc": acc, "val/loss": 1 - acc, "val/samples": 100})
        writer.writerow({"epoch": 1, "step": steps, "test/acc": test_acc, "test/loss": 0.3, "test/samples": 200})
    plan = plan or plan_of("hardware=cpu")
    (job / "plan.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(plan)))
    manifest = {"status": status, "overrides": list(overrides), "machine": MACHINE, "plan": plan,
                "started_at": "2026-01-31T12:00:00.000+00:00", "finished_at": "2026-01-31T12:00:30.000+00:00",
                "error": "the loss is nan" if status == "failed" else None}  # fmt: skip
    (job / "manifest.json").write_text(json.dumps(manifest))
    if status == "finished":
        results = {"epochs": 1, "global_step": steps, "metrics": {"test/acc": test_acc}, "test/acc": test_acc,
                   "objective": {"metric": "val/acc", "value": max((a for _, a in vals), default=None)},
                   "fit_seconds": 30.0, "samples_per_second": samples_per_s}  # fmt: skip
        (job / "results.json").write_text(json.dumps(results))
    return job


def assert_png(path):
    assert path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_a_run_shorter_than_its_logging_interval_has_a_loss_point_at_each_validation_and_the_end(tiny_data, tmp_path):
    # experiment=fast logs every 100 steps: a few dozen steps would leave the loss panel empty.
    run = tmp_path / "run"
    args = [*TINY, "trainer.limit_train_batches=null", "trainer.max_steps=8", "trainer.val_check_interval=3",
            "trainer.log_every_n_steps=5"]  # fmt: skip
    result = run_cli(args, run, tiny_data)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = csv_rows(run)
    losses = [int(r["step"]) for r in rows if r.get("train/loss_step")]
    validations = [int(r["step"]) for r in rows if r.get("val/acc")]
    # Lightning's own rows (step 4, the 5th step) and ours (each validation, the end), each step once.
    assert validations == [2, 5, 7] and losses == [2, 4, 5, 7], rows
    (job,) = jobs_of(tmp_path)  # what the sweep report plots
    assert [s for s, _ in job.train_loss] == losses and [s for s, _ in job.validation] == validations


def test_curves_show_every_logged_point_by_step(tmp_path):
    # One-epoch runs: a val/acc per epoch would be one dot a job; by step every logged point shows.
    write_job(tmp_path, "0", ["optim.lr=0.001"], steps=12, vals=[(5, 0.8), (11, 0.9)])
    write_job(tmp_path, "1", ["optim.lr=0.01"], steps=7, vals=[(6, 0.95)])
    jobs = jobs_of(tmp_path)
    assert jobs[0].train_loss[:2] == [(0, 2.0), (1, 1.0)] and len(jobs[0].train_loss) == 12
    assert jobs[0].validation == [(5, 0.8), (11, 0.9)]
    assert jobs[0].best == 0.9
    fig = curves_figure(jobs, ["optim.lr"])
    loss, acc = fig.axes[:2]
    assert [len(line.get_xdata()) for line in loss.lines] == [12, 7]
    assert [list(line.get_xdata()) for line in acc.lines] == [[5, 11], [6]]
    # One legend beside the panels, values in 3 significant digits.
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["optim.lr=0.001", "optim.lr=0.01"]
    assert (loss.get_xlabel(), loss.get_ylabel(), acc.get_ylabel()) == ("optimizer step", "training loss", "val/acc")
    summary = write_report(tmp_path)
    assert_png(tmp_path / "curves.png")
    assert summary["search"] is None and summary["scaling"] == [] and not (tmp_path / "scaling.png").exists()


SPACE = {
    "optim.lr": {"kind": "float", "low": 0.0001, "high": 0.03, "step": None, "log": True},
    "batch.global_size": {"kind": "categorical", "choices": [32, 64, 128]},
}


def write_study(sweep_dir, direction, space, params, values):
    """The Optuna study of the search: its complete trials in the sweep dir's SQLite storage."""
    import optuna

    kinds = {"float": lambda d: optuna.distributions.FloatDistribution(d["low"], d["high"], log=d["log"]),
             "categorical": lambda d: optuna.distributions.CategoricalDistribution(d["choices"])}  # fmt: skip
    distributions = {k: kinds[d["kind"]](d) for k, d in space.items()}
    study = optuna.create_study(study_name="search", storage=f"sqlite:///{sweep_dir / 'optuna.db'}",
                                direction="maximize" if direction == "max" else "minimize")  # fmt: skip
    for trial_params, value in zip(params, values, strict=False):
        full = {k: trial_params.get(k, 0.7) for k in space}
        study.add_trial(optuna.trial.create_trial(params=full, distributions=distributions, value=value))


def write_search(sweep_dir, direction="max", space=SPACE):
    """A search of five trials: three complete (jobs 0-2), one refused before it ran, one still running."""
    params = [{"optim.lr": 0.001, "batch.global_size": 64}, {"optim.lr": 0.02, "batch.global_size": 32},
              {"optim.lr": 0.0003, "batch.global_size": 128}, {"optim.lr": 0.005, "batch.global_size": 128},
              {"optim.lr": 0.002, "batch.global_size": 32}]  # fmt: skip
    values = [0.95, 0.97, 0.91]
    for n in range(3):
        shown = [f"{k}={v}" for k, v in params[n].items()]
        write_job(sweep_dir, str(n), ["trainer.max_epochs=1", *shown], vals=[(9, values[n])], test_acc=0.5 + n / 10)
    trials = [{"number": n, "state": "COMPLETE", "value": values[n], "params": params[n], "job": str(n), "reason": None}
              for n in range(3)]  # fmt: skip
    refused = "batch.global_size=128 refused: not divisible | by 3"
    trials.append({"number": 3, "state": "FAIL", "value": None, "params": params[3], "job": None, "reason": refused})
    trials.append({"number": 4, "state": "RUNNING", "value": None, "params": params[4], "job": "3", "reason": None})
    best = 1 if direction == "max" else 2
    search = {
        "objective": {"metric": "val/acc", "direction": direction},
        "study_name": "search",
        "storage": "sqlite:///optuna.db",
        "fixed": ["trainer.max_epochs=1"],
        "space": space,
        "trials": trials,
        "best": {
            "number": best,
            "value": values[best],
            "params": params[best],
            "job": str(best),
            "command": f"python train.py trainer.max_epochs=1 optim.lr={params[best]['optim.lr']}",
        },  # fmt: skip
    }
    (sweep_dir / "search.json").write_text(json.dumps(search))
    write_study(sweep_dir, direction, space, params[:3], values)


def table_rows(markdown: str, header: str) -> list[list[str]]:
    lines = markdown[markdown.index(header) :].splitlines()
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("direction,order", [("max", ["1", "0", "2"]), ("min", ["2", "0", "1"])])
def test_search_section_ranks_trials_in_the_studys_direction(tmp_path, direction, order):
    write_search(tmp_path, direction)
    summary = write_report(tmp_path)
    text = (tmp_path / "report.md").read_text()
    rows = table_rows(text, "| trial | state | val/acc | optim.lr | batch.global_size | job | test/acc |")
    # Complete trials best first, then the failed one with its reason, then the running one.
    assert [r[0] for r in rows] == [*order, "3", "4"]
    assert [r[1] for r in rows[:3]] == ["COMPLETE"] * 3
    assert rows[3][1] == "FAIL: batch.global_size=128 refused: not divisible \\| by 3"
    assert rows[3][5:] == ["-", "-"] and rows[4][1] == "RUNNING"
    # The test accuracy comes from each job's results.json: shown, never used to rank.
    assert [r[6] for r in rows[:3]] == [f"{0.5 + int(n) / 10:.6g}" for n in order]
    best = order[0]
    assert f"Best: trial {best}, val/acc={[0.95, 0.97, 0.91][int(best)]:.6g}: optim.lr=" in text
    assert "Command: `python train.py trainer.max_epochs=1 optim.lr=" in text
    assert f"Objective: val/acc, {direction}" in text and "Every trial: `trainer.max_epochs=1`" in text
    assert "5 trials: 3 complete, 1 failed, 1 running." in text
    # Optuna's own plots of the study: history and slices; contour and importances only from 10 complete trials
    # (3 here: the report says why they are left out).
    for name in ("history.png", "slice.png", "curves.png"):
        assert_png(tmp_path / name)
        assert tmp_path / name in summary["files"] and f"]({name})" in text
    assert not (tmp_path / "contour.png").exists() and not (tmp_path / "importances.png").exists()
    assert "this search has 3, so they are left out (raise hydra.sweeper.n_trials)" in text


def test_contour_and_importances_need_enough_complete_trials():
    from hydralight.reports.search import MIN_TRIALS_FOR_SURFACE, Search, surface_note

    def search(complete, params=("optim.lr", "batch.global_size")):
        trials = [{"number": n, "state": "COMPLETE", "value": 0.5, "params": {p: n for p in params}}
                  for n in range(complete)]  # fmt: skip
        return Search("val/acc", "max", "s", None, [], {p: {} for p in params}, trials, None)

    assert "this search has 3" in surface_note(search(3))
    assert surface_note(search(MIN_TRIALS_FOR_SURFACE)) is None
    assert surface_note(search(3, params=("optim.lr",))) is None  # one parameter: no contour to speak of


def test_search_plots_are_optunas_drawn_from_the_study(tmp_path):
    from optuna.visualization import matplotlib as optuna_plots

    write_search(tmp_path, "min")
    search = load_search(tmp_path)
    study = load_study(search, tmp_path)
    assert len(study.trials) == 3 and study.best_value == 0.91  # the lowest: direction min
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lr = next(ax for ax in optuna_plots.plot_slice(study).ravel() if ax.get_xlabel() == "optim.lr")
    assert lr.get_xscale() == "log"  # the space's log-uniform learning rate
    (tmp_path / "optuna.db").unlink()
    search.storage = None
    assert write_search_plots(search, tmp_path, tmp_path / "out") == []  # no study: the table still stands


@pytest.mark.slow
def test_a_search_of_three_parameters_has_no_heatmap(tmp_path):
    space = {**SPACE, "optim.momentum": {"kind": "float", "low": 0.5, "high": 0.99, "step": None, "log": False}}
    write_search(tmp_path, space=space)
    write_report(tmp_path)
    assert not (tmp_path / "heatmap.png").exists() and (tmp_path / "slice.png").is_file()


@pytest.mark.slow
def test_scaling_efficiency_from_known_samples_per_second(tmp_path):
    # Ideal: linear from world size 1. Efficiency: samples/s at N / (N x samples/s at 1).
    for name, devices, speed in (("0", 1, 1000.0), ("1", 2, 1800.0), ("2", 4, 3000.0)):
        overrides = ["experiment=scaling", "hardware=cpu", f"hardware.devices={devices}"]
        write_job(tmp_path, name, overrides, plan=plan_of("hardware=cpu", f"hardware.devices={devices}"),
                  samples_per_s=speed)  # fmt: skip
    # The world size is the plan's, not the override's: `auto` resolved to one process here.
    write_job(tmp_path, "3", ["experiment=scaling", "hardware=cpu", "hardware.devices=auto"], samples_per_s=1000.0)
    jobs = jobs_of(tmp_path)
    assert [j.world_size for j in jobs] == [1, 2, 4, 1]
    summary = write_report(tmp_path)
    points = {p.world_size: p for p in summary["scaling"]}
    assert points[1].samples_per_s == 1000.0 and points[1].jobs == ("0", "3")
    assert [round(points[n].efficiency, 4) for n in (1, 2, 4)] == [1.0, 0.9, 0.75]
    assert [points[n].ideal for n in (1, 2, 4)] == [1000.0, 2000.0, 4000.0]
    text = (tmp_path / "report.md").read_text()
    rows = table_rows(text, "| world size | jobs | samples/s | ideal samples/s | speed-up | efficiency |")
    assert rows == [["1", "0, 3", "1000.0", "1000.0", "1.00x", "100%"], ["2", "1", "1800.0", "2000.0", "1.80x", "90%"],
                    ["4", "2", "3000.0", "4000.0", "3.00x", "75%"]]  # fmt: skip
    assert "Measured on box7: no GPU, 2 CPU cores (Test CPU), 8 GB memory." in text
    assert "on a small CPU the figures are what this machine gives" in text
    assert_png(tmp_path / "scaling.png")
    fig = scaling_figure(summary["scaling"], machine_note(jobs, summary["scaling"]))
    assert "box7" in fig._suptitle.get_text()
    speed, efficiency = fig.axes
    assert list(speed.lines[1].get_ydata()) == [1000.0, 2000.0, 4000.0]  # the ideal line
    assert [round(y, 4) for y in efficiency.lines[0].get_ydata()] == [100.0, 90.0, 75.0]


@pytest.mark.slow
def test_other_swept_keys_make_scaling_series_of_their_own(tmp_path):
    for name, devices, size, speed in (("0", 1, 64, 500.0), ("1", 2, 64, 800.0), ("2", 1, 128, 900.0),
                                       ("3", 2, 128, 1700.0)):  # fmt: skip
        overrides = [f"hardware.devices={devices}", f"batch.global_size={size}"]
        plan = plan_of("hardware=cpu", *overrides)
        write_job(tmp_path, name, ["hardware=cpu", *overrides], plan=plan, samples_per_s=speed)
    points = write_report(tmp_path)["scaling"]
    assert [(p.series, p.world_size, round(p.efficiency, 4)) for p in points] == [
        ("batch.global_size=64", 1, 1.0), ("batch.global_size=64", 2, 0.8),
        ("batch.global_size=128", 1, 1.0), ("batch.global_size=128", 2, round(1700 / 1800, 4)),
    ]  # fmt: skip
    assert "| series | world size |" in (tmp_path / "report.md").read_text()


def test_no_scaling_section_when_every_job_ran_on_one_world_size(tmp_path):
    write_job(tmp_path, "0", ["optim.lr=0.001"], vals=[(9, 0.9)])
    write_job(tmp_path, "1", ["optim.lr=0.01"], plan=plan_of("hardware=cpu", "hardware.devices=2"), status="failed")
    summary = write_report(tmp_path)
    assert summary["scaling"] == [] and "## Scaling" not in (tmp_path / "report.md").read_text()


def test_the_scaling_preset_composes_a_fixed_step_job():
    cfg = compose_config("experiment=scaling", "hardware=cpu", "hardware.devices=2")
    trainer = cfg.trainer
    assert trainer.max_epochs is None and trainer.max_steps > 0 and trainer.check_val_every_n_epoch is None
    # One validation, at the last step: the best-checkpoint callback still sees its metric.
    assert trainer.val_check_interval == trainer.max_steps
    assert cfg.callbacks.model_checkpoint.monitor == "val/acc" and cfg.callbacks.last_checkpoint is None
    plan = run_plan_of("experiment=scaling", "hardware=cpu", "hardware.devices=2")
    assert plan.loggers == {} and plan.hardware.world_size == 2  # the history (csv/metrics.csv) alone


@pytest.mark.slow
def test_a_real_scaling_sweep_reports_its_efficiency(tiny_data, tmp_path):
    sweep_dir = tmp_path / "scaling"
    args = ["-m", "experiment=scaling", "hardware=cpu", "hardware.devices=1,2", "data.val_size=100",
            "batch.eval_size=50", "trainer.max_steps=12", f"hydra.sweep.dir={sweep_dir}"]  # fmt: skip
    result = run_cli(args, sweep_dir, tiny_data)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    for job in ("0", "1"):
        results = json.loads((sweep_dir / job / "results.json").read_text())
        # Training alone is timed, from the 5th step to the 12th: faster than the whole fit.
        assert results["global_step"] == 12 and results["train_samples_per_second"] > results["samples_per_second"]
        # Validated once, at the last step, and the best checkpoint was chosen on it.
        vals = [r for r in csv_rows(sweep_dir / job) if "val/acc" in r]
        assert [int(r["step"]) for r in vals] == [11]
        assert results["objective"]["value"] is not None and results["best_checkpoint"].endswith(".ckpt")
    shown = report(sweep_dir)
    assert shown.returncode == 0, shown.stderr
    assert_png(sweep_dir / "scaling.png")
    rows = table_rows(shown.stdout, "| world size | jobs | samples/s | ideal samples/s | speed-up | efficiency |")
    assert [r[:2] for r in rows] == [["1", "0"], ["2", "1"]] and rows[0][-1] == "100%"
    speeds = [json.loads((sweep_dir / j / "results.json").read_text())["train_samples_per_second"] for j in "01"]
    assert rows[1][-1] == f"{100 * speeds[1] / (2 * speeds[0]):.0f}%"


# Seeds: jobs that differ only in the grouped keys are one row, their mean, spread and n.

SEED_VALS = {"0.001": [0.80, 0.84, 0.83], "0.01": [0.90, 0.86, 0.95]}
SEED_TESTS = {"0.001": [0.79, 0.85, 0.81], "0.01": [0.91, 0.85, 0.93]}


def write_seed_sweep(sweep_dir, failed=()):
    """2 learning rates x seeds 0-2 (jobs 0-5, seed fastest); `failed`: job names that failed."""
    for n, (lr, seed) in enumerate((lr, seed) for lr in SEED_VALS for seed in range(3)):
        write_job(sweep_dir, str(n), [f"optim.lr={lr}", f"seed={seed}"], vals=[(4, SEED_VALS[lr][seed] - 0.1),
                  (9, SEED_VALS[lr][seed])], test_acc=SEED_TESTS[lr][seed],
                  status="failed" if str(n) in failed else "finished")  # fmt: skip


def spread_of(values):
    return [statistics.fmean(values), statistics.stdev(values), min(values), max(values)]


def csv_table(path):
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_jobs_that_differ_only_in_seed_are_one_row_with_mean_std_and_n(tmp_path):
    write_seed_sweep(tmp_path, failed={"5"})
    summary = write_report(tmp_path)
    assert summary["group_over"] == ["seed"]
    rows = csv_table(tmp_path / "report.csv")
    stats = ["mean", "std", "min", "max"]
    # The failed job (lr 0.01, seed 2, whose 0.95 would have put its group further ahead) is counted, not averaged.
    counted = {"0.001": [0, 1, 2], "0.01": [0, 1]}
    expected = {lr: spread_of([SEED_VALS[lr][s] for s in seeds]) for lr, seeds in counted.items()}
    order = sorted(expected, key=lambda lr: -expected[lr][0])
    assert [r["overrides"] for r in rows] == [f"optim.lr={lr}" for lr in order]
    for row in rows:
        lr = row["overrides"].removeprefix("optim.lr=")
        assert [float(row[f"best val/acc {s}"]) for s in stats] == pytest.approx(expected[lr], abs=5e-5)
        tests = spread_of([SEED_TESTS[lr][s] for s in counted[lr]])
        assert [float(row[f"test/acc {s}"]) for s in stats] == pytest.approx(tests, abs=5e-5)
    by_lr = {r["overrides"]: r for r in rows}
    assert by_lr["optim.lr=0.001"]["n"] == "3" and by_lr["optim.lr=0.001"]["jobs"] == "0, 1, 2"
    assert by_lr["optim.lr=0.01"]["n"] == "2 of 3, 1 failed"
    # Every job is still listed: below the groups in report.md, and in report_jobs.csv.
    best = {str(n): SEED_VALS[lr][seed] for n, (lr, seed) in enumerate(itertools.product(SEED_VALS, range(3)))}
    finished = sorted((n for n in best if n != "5"), key=lambda n: -best[n])
    assert [r["job"] for r in csv_table(tmp_path / "report_jobs.csv")] == [*finished, "5"]
    text = (tmp_path / "report.md").read_text()
    groups = table_rows(text, "| overrides | n | best val/acc mean |")
    assert [r[:2] for r in groups] == [[r["overrides"], r["n"]] for r in rows]
    assert len(table_rows(text, "| job | overrides | status |")) == 6
    assert "in 2 groups of jobs that differ only in seed" in text
    assert_png(tmp_path / "curves.png")
    assert not (tmp_path / "heatmap.png").exists()  # one setting swept besides the seed: no grid


def test_group_curves_are_the_mean_of_the_seeds_with_a_min_max_band(tmp_path):
    write_seed_sweep(tmp_path)
    groups = group_jobs(jobs_of(tmp_path), ["seed"])
    fig = group_curves_figure(groups, ["optim.lr"], ["seed"])
    loss, acc = fig.axes[:2]
    assert len(acc.lines) == len(acc.collections) == 2  # one mean line and one band per group, not per seed
    for group, line, band in zip(groups, acc.lines, acc.collections, strict=True):
        runs = [dict(j.validation) for j in group.jobs]
        steps = sorted(runs[0])
        assert list(line.get_xdata()) == steps
        assert list(line.get_ydata()) == pytest.approx([statistics.fmean(r[s] for r in runs) for s in steps])
        # The band's outline holds each step's lowest and highest run.
        outline = band.get_paths()[0].vertices
        for step in steps:
            at = sorted(y for x, y in outline if x == step)
            assert at[0] == pytest.approx(min(r[step] for r in runs)) and at[-1] == pytest.approx(
                max(r[step] for r in runs)
            )
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["optim.lr=0.01 (n=3)", "optim.lr=0.001 (n=3)"]
    assert "mean over seed, band min-max" in acc.get_title()


def test_groups_of_an_objective_to_minimise_come_lowest_mean_first(tmp_path):
    write_seed_sweep(tmp_path)
    jobs = jobs_of(tmp_path)
    for job in jobs:
        job.direction = "min"
    groups = group_jobs(jobs, ["seed"])
    means = [g.objective.mean for g in groups]
    assert means == sorted(means) and means[0] == pytest.approx(min(statistics.fmean(v) for v in SEED_VALS.values()))


def test_group_over_other_keys_and_a_key_no_job_sets(tmp_path):
    # 2 learning rates x 2 seeds x 2 data splits: grouped over both, 4 runs a setting; over the split alone, 2.
    values = {}
    for n, (lr, seed, split) in enumerate(itertools.product(["0.001", "0.01"], [0, 1], [5, 6])):
        values[(lr, seed, split)] = 0.5 + n / 20 + (0.3 if lr == "0.01" else 0.0)
        overrides = [f"optim.lr={lr}", f"seed={seed}", f"+data.split_seed={split}"]
        write_job(tmp_path, str(n), overrides, vals=[(9, values[(lr, seed, split)])])
    both = write_report(tmp_path, tmp_path / "both", ["seed", "data.split_seed"])
    assert [(r[0], r[1]) for r in both["group_rows"]] == [("optim.lr=0.01", "4"), ("optim.lr=0.001", "4")]
    for row in both["group_rows"]:
        lr = row[0].removeprefix("optim.lr=")
        assert float(row[2]) == pytest.approx(statistics.fmean(v for k, v in values.items() if k[0] == lr), abs=5e-5)
    split = write_report(tmp_path, tmp_path / "split", ["data.split_seed"])
    assert len(split["group_rows"]) == 4 and {r[1] for r in split["group_rows"]} == {"2"}
    assert split["group_rows"][0][0] == "optim.lr=0.01 seed=1"  # the best mean first
    # Grouping over nothing: one row per job, as without seeds.
    plain = write_report(tmp_path, tmp_path / "plain", [])
    assert plain["groups"] == [] and len(csv_table(tmp_path / "plain" / "report.csv")) == 8
    assert not (tmp_path / "plain" / "report_jobs.csv").exists()
    # A key no job sets: one line, nothing written.
    with pytest.raises(UserError, match=r"--group-over data.splitseed: no job of .* sets data.splitseed") as err:
        write_report(tmp_path, tmp_path / "typo", ["seed", "data.splitseed"])
    assert "\n" not in str(err.value) and not (tmp_path / "typo").exists()


def test_a_sweep_without_seed_variation_reports_one_row_per_job(tmp_path):
    write_job(tmp_path, "0", ["optim.lr=0.001", "seed=3"], vals=[(9, 0.8)])
    write_job(tmp_path, "1", ["optim.lr=0.01", "seed=3"], vals=[(9, 0.9)])
    summary = write_report(tmp_path)
    assert summary["groups"] == [] and summary["group_over"] == []
    assert [r["job"] for r in csv_table(tmp_path / "report.csv")] == ["1", "0"]
    assert "groups" not in (tmp_path / "report.md").read_text() and not (tmp_path / "report_jobs.csv").exists()


@pytest.mark.slow
def test_a_real_sweep_over_seeds_reports_one_row_per_learning_rate(tiny_data, tmp_path):
    sweep_dir = tmp_path / "seeds"
    # Plain SGD at two rates far apart: 3 steps leave one of them clearly behind, each seed a little apart.
    args = ["-m", *TINY, "trainer.limit_train_batches=3", "optim=sgd", "optim.lr_scaling=none", "optim.lr=0.01,0.1",
            "seed=0,1,2", f"hydra.sweep.dir={sweep_dir}"]  # fmt: skip
    result = run_cli(args, sweep_dir, tiny_data)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    shown = report(sweep_dir)
    assert shown.returncode == 0, shown.stderr
    rows = csv_table(sweep_dir / "report.csv")
    assert len(rows) == 2 and [r["n"] for r in rows] == ["3", "3"]
    means = []
    for row in rows:
        jobs = row["jobs"].split(", ")
        assert len(jobs) == 3
        found = [json.loads((sweep_dir / j / "results.json").read_text()) for j in jobs]
        objective = [r["objective"]["value"] for r in found]
        assert {r["objective"]["metric"] for r in found} == {"val/acc"}
        overrides = [yaml.safe_load((sweep_dir / j / ".hydra" / "overrides.yaml").read_text()) for j in jobs]
        assert {o for o in overrides[0] if o.startswith("optim.lr=")} == {row["overrides"]}
        assert sorted(o for job in overrides for o in job if o.startswith("seed=")) == ["seed=0", "seed=1", "seed=2"]
        assert float(row["best val/acc mean"]) == pytest.approx(statistics.fmean(objective), abs=5e-5)
        assert float(row["best val/acc std"]) == pytest.approx(statistics.stdev(objective), abs=5e-5)
        assert float(row["test/acc mean"]) == pytest.approx(statistics.fmean(r["test/acc"] for r in found), abs=5e-5)
        means.append(float(row["best val/acc mean"]))
    assert means == sorted(means, reverse=True)
    assert (
        "| overrides | n | best val/acc mean |" in shown.stdout and len(csv_table(sweep_dir / "report_jobs.csv")) == 6
    )
    assert_png(sweep_dir / "curves.png")
    # A key no job sets is refused in one line, and the report stays as it was.
    before = (sweep_dir / "report.md").read_text()
    typo = report(sweep_dir, "--group-over", "sed")
    assert typo.returncode == 2 and typo.stderr.startswith("error: --group-over sed: no job of")
    assert len(typo.stderr.splitlines()) == 1 and (sweep_dir / "report.md").read_text() == before


def test_runs_of_different_batch_sizes_line_up_on_samples_seen(tmp_path):
    """A step of 128 samples is not a step of 32: with different global batches the curves are drawn against
    the samples each run had seen, so equal amounts of data sit at one x."""
    write_job(tmp_path, "0", ["batch.global_size=32"], plan=plan_of("hardware=cpu", "batch.global_size=32"),
              steps=8, vals=[(3, 0.8), (7, 0.9)])  # fmt: skip
    write_job(tmp_path, "1", ["batch.global_size=128"], plan=plan_of("hardware=cpu", "batch.global_size=128"),
              steps=2, vals=[(1, 0.85)])  # fmt: skip
    fig = curves_figure(jobs_of(tmp_path), ["batch.global_size"])
    loss, acc = fig.axes[:2]
    assert loss.get_xlabel() == acc.get_xlabel() == "samples seen"
    assert [list(line.get_xdata()) for line in acc.lines] == [[128, 256], [256]]  # 8 steps of 32 = 2 of 128
    assert list(loss.lines[1].get_xdata()) == [128, 256]
    # One batch size: the optimizer step, as before.
    same = tmp_path / "same"
    write_job(same, "0", ["optim.lr=0.001"], steps=3, vals=[(2, 0.8)])
    write_job(same, "1", ["optim.lr=0.01"], steps=3, vals=[(2, 0.9)])
    assert curves_figure(jobs_of(same), ["optim.lr"]).axes[0].get_xlabel() == "optimizer step"


def test_a_group_of_runs_validated_once_shows_its_spread_as_a_bar(tmp_path):
    """Short runs validate once: the mean is one point, and its min-max band would have no width; a bar from
    the lowest to the highest run shows the seeds' spread."""
    for n, (lr, seed, acc) in enumerate([(0.001, 0, 0.80), (0.001, 1, 0.90), (0.01, 0, 0.70), (0.01, 1, 0.72)]):
        write_job(tmp_path, str(n), [f"optim.lr={lr}", f"seed={seed}"], steps=5, vals=[(4, acc)])
    groups = group_jobs(jobs_of(tmp_path), ["seed"])
    fig = group_curves_figure(groups, ["optim.lr"], ["seed"])
    acc = fig.axes[1]
    bars = [c for c in acc.collections if c.get_segments()]
    spans = sorted(sorted(y for _, y in bar.get_segments()[0]) for bar in bars)
    assert spans == [pytest.approx([0.70, 0.72]), pytest.approx([0.80, 0.90])]


def test_a_report_never_replaces_a_file_it_did_not_write_nor_writes_through_a_link(tmp_path):
    sweep = tmp_path / "sweep"
    write_job(sweep, "0", ["optim.lr=0.001"], vals=[(9, 0.8)])
    write_job(sweep, "1", ["optim.lr=0.01"], vals=[(9, 0.9)])
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    snapshot = lambda: {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file() and not p.is_symlink()}  # noqa: E731

    def refused(said: str) -> None:
        before = snapshot()
        with pytest.raises(UserError, match=said):
            write_report(sweep)
        assert snapshot() == before and outside.read_text() == "keep me"
        assert not list(sweep.glob(".report-*"))  # its staging folder goes too

    (sweep / "curves.png").symlink_to(outside)
    refused("curves.png is a link; a report writes only files of its own")
    (sweep / "curves.png").unlink()
    (sweep / "report.md").write_text("# my own notes\n")
    refused("report.md is not known as this report's own")
    (sweep / "report.md").unlink()
    # Its own files it replaces, run after run; one the user edited since, it does not.
    write_report(sweep)
    again = write_report(sweep)
    assert {p.name for p in again["files"]} <= {p.name for p in sweep.iterdir()}
    with (sweep / "report.csv").open("a") as f:
        f.write("my,row\n")
    refused("report.csv is not known as this report's own")
    # A report without the record of its files (a version that kept none), then edited: nothing proves it the
    # report's own, so it stays as it is.
    (sweep / "report.csv").unlink()
    (sweep / ".hydralight-report.json").unlink()
    (sweep / "report.md").write_text((sweep / "report.md").read_text() + "my notes\n")
    refused(r"(curves|heatmap).png is not known as this report's own \(no record of it")


def test_an_objective_logged_per_step_and_per_epoch_is_drawn_from_its_epoch_values(tmp_path):
    """`self.log("val/mse", ..., on_step=True, on_epoch=True)`: the history holds val/mse_step and val/mse_epoch,
    never val/mse; the report's curve and best value, and a sweep's progress line, read the epoch's column."""
    from hydralight.launch.launchers import job_progress

    job = write_job(tmp_path, "0", ["optim.lr=0.01"], steps=4)
    with (job / "csv" / "metrics.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["epoch", "step", "train/loss_step", "val/mse_step", "val/mse_epoch"])
        writer.writeheader()
        for step in range(4):
            writer.writerow({"epoch": step // 2, "step": step, "train/loss_step": 1.0 / (step + 1)})
            writer.writerow({"epoch": step // 2, "step": step, "val/mse_step": 9.0})  # a validation batch's own
        writer.writerows(
            [{"epoch": 0, "step": 1, "val/mse_epoch": 0.5}, {"epoch": 1, "step": 3, "val/mse_epoch": 0.25}]
        )
    results = json.loads((job / "results.json").read_text())
    results["objective"] = {"metric": "val/mse", "direction": "min", "value": 0.25}
    (job / "results.json").write_text(json.dumps(results))
    (loaded,) = jobs_of(tmp_path)
    assert loaded.validation == [(1, 0.5), (3, 0.25)] and loaded.best == 0.25
    assert job_progress(job, "val/mse") == (3, 0.25)
