"""A real 2 x 2 sweep, then its report."""

import csv
import json
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, TINY, run_cli


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
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "sweep_report.py"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


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
    assert "sweep_report.py" in summary[0]
    assert all((sweep_dir / str(i) / "results.json").is_file() for i in (0, 2))
    manifest = json.loads((sweep_dir / "1" / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "the loss is" in manifest["error"]
    # The NaN message tells the truth about what was kept.
    assert "no checkpoint was saved before it" in manifest["error"] or "holds the last state" in manifest["error"]
    shown = report(sweep_dir)
    assert "Failed: 1 (failed: the loss is" in shown.stdout
