"""The project as a package: `python -m hydralight` is the entrypoint, the wheel carries the configs, and a
non-editable install runs from any folder, with no source checkout in sight."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT


def run_module(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m ...` in a fresh interpreter: what `-m` runs as `__main__` is the point of these tests."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_python_m_hydralight_prints_the_composed_config(tmp_path):
    printed = run_module("hydralight", "--cfg", "job", "hardware=cpu", "optim.lr=0.0123", cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr[-2000:]
    assert "accelerator: cpu" in printed.stdout and "lr: 0.0123" in printed.stdout, printed.stdout
    # The same config as the entrypoint's other form, and nothing written for a printout.
    other = run_module("hydralight.train", "--cfg", "job", "hardware=cpu", "optim.lr=0.0123", cwd=tmp_path)
    assert other.returncode == 0 and printed.stdout == other.stdout, other.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # resolving the plan imports torch: over 4 s on a busy 2-core machine
def test_python_m_hydralight_prints_the_plan(tmp_path):
    planned = run_module("hydralight", "plan=true", "hardware=cpu", "batch.global_size=64", cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr[-2000:]
    assert "Run plan" in planned.stdout, planned.stdout
    rows = {tuple(line.split()[-2:]) for line in planned.stdout.replace("│", " ").splitlines() if line.strip()}
    assert ("accelerator", "cpu") in rows and ("global_size", "64") in rows, planned.stdout
    # A plan starts no run: no run dir is left behind.
    assert not list(tmp_path.glob("outputs/*/*")), sorted(tmp_path.rglob("*"))


@pytest.mark.slow
def test_an_installed_wheel_runs_from_any_folder(tiny_data, tmp_path):
    # Built from a copy: setuptools leaves build/ and egg-info folders next to the sources it builds.
    source = tmp_path / "source"
    top = {".venv", ".git", "outputs", "multirun", "data", "build", "dist", "wandb", "lightning_logs"}
    shutil.copytree(ROOT, source, ignore=lambda folder, names: [n for n in names if n in top and folder == str(ROOT)])
    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels)]
    subprocess.run([*build, str(source)], check=True, capture_output=True, timeout=300)
    (wheel,) = wheels.glob("hydralight-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for shipped in (
        "hydralight/conf/train.yaml",
        "hydralight/conf/hardware/4gpu.yaml",
        "hydralight/conf/hydra/launcher/slurm.yaml",
    ):
        assert shipped in names, sorted(n for n in names if "conf" in n)
    assert "hydra_plugins/hydralight_launchers/__init__.py" in names

    # A fresh environment: the project from the wheel only; its dependencies are this environment's.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    install = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", site]
    subprocess.run([*install, str(wheel)], check=True, capture_output=True, timeout=300)
    with open(os.path.join(site, "dependencies.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "WANDB_API_KEY")} | {
        "DATA_DIR": str(tiny_data)
    }

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([python, *args], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)

    where = run("-c", "import hydralight; print(hydralight.__file__)")
    assert where.stdout.startswith(site), (where.stdout, where.stderr)
    printed = run("-m", "hydralight.train", "--cfg", "job", "hardware=cpu")
    assert printed.returncode == 0 and "accelerator: cpu" in printed.stdout, printed.stderr[-2000:]
    steps = ["hardware=cpu", "model=mlp", "trainer.max_steps=5", "batch.global_size=32", "data.val_size=100",
             "batch.eval_size=50", "hydra.run.dir=outputs/five"]  # fmt: skip
    trained = run("-m", "hydralight.train", *steps)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert json.loads((elsewhere / "outputs" / "five" / "results.json").read_text())["global_step"] == 5
    # The report of an installed copy: a command of the package, run from any folder, named by the sweep.
    swept = run("-m", "hydralight.train", "-m", *steps[:-1], "trainer.max_steps=2", "optim.lr=0.01,0.02",
                "hydra.sweep.dir=multirun/s")  # fmt: skip
    assert swept.returncode == 0 and "python -m hydralight.report" in swept.stdout + swept.stderr, swept.stderr[-2000:]
    reported = run("-m", "hydralight.report", "multirun/s")
    assert reported.returncode == 0 and (elsewhere / "multirun" / "s" / "report.md").is_file(), reported.stderr
    with zipfile.ZipFile(wheel) as archive:
        entry_points = next(n for n in archive.namelist() if n.endswith("entry_points.txt"))
        assert "hydralight-report = hydralight.report:cli" in archive.read(entry_points).decode()
