"""The line a sweep ends with counts what this sweep did, and a sweep that only prints its plans leaves its sweep
dir as it was."""

import hashlib
from pathlib import Path

import pytest
from conftest import TINY, run_cli


def snapshot(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(folder.rglob("*"))
    }


# Submitit's local launcher runs each job in a process of its own, as on a SLURM node: a refusal there reaches
# the sweep's line with the job's result. Its own files (.submitit/) grow with each launch; the jobs' do not.
LOCAL = ["hydra/launcher=local", "cluster=local", "hardware.cpus_per_task=1", "hardware.mem_gb=1"]


@pytest.mark.slow
@pytest.mark.parametrize("launcher", [[], LOCAL], ids=["basic", "local"])
def test_a_sweep_run_again_with_jobs_refused_says_so_and_leaves_their_results(launcher, tiny_data, tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", *launcher, *TINY, "trainer.limit_train_batches=null", "trainer.max_steps=3", "seed=1,2",
            f"hydra.sweep.dir={sweep}"]  # fmt: skip
    kept = (lambda: snapshot(sweep)) if not launcher else (lambda: [snapshot(sweep / job) for job in ("0", "1")])
    first = run_cli(args, tmp_path, tiny_data)
    assert first.returncode == 0 and "2 of 2 jobs done" in first.stdout, first.stderr[-2000:]
    before = kept()
    # The same command: both jobs finished already, nothing changes.
    again = run_cli(args, tmp_path, tiny_data)
    assert again.returncode == 0 and "2 of 2 jobs done" in again.stdout, again.stderr[-2000:]
    assert kept() == before
    # Another learning rate over the same budget: each job refused, their earlier results kept, and said.
    other = run_cli([*args, "optim.lr=0.5"], tmp_path, tiny_data)
    assert other.returncode == 1, other.stderr[-2000:]
    line = other.stdout.strip().splitlines()[-1]
    assert line.startswith(f"sweep {sweep}: 0 of 2 jobs done, 2 refused, their earlier results kept (#0: "), line
    assert kept() == before  # every byte, the jobs' logs too


@pytest.mark.slow
def test_a_plan_only_sweep_leaves_every_sweep_dir_as_it_was(tiny_data, tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", *TINY, "trainer.limit_train_batches=null", "trainer.max_steps=2", "seed=1,2"]
    assert run_cli([*args, f"hydra.sweep.dir={sweep}"], tmp_path, tiny_data).returncode == 0
    before = snapshot(sweep)
    empty = tmp_path / "empty"
    empty.mkdir()
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    for where in ([f"hydra.sweep.dir={sweep}"], [f"hydra.sweep.dir={empty}"], []):
        planned = run_cli([*args, "seed=1,2,3", "plan=true", *where], tmp_path, tiny_data, cwd=fresh)
        assert planned.returncode == 0, planned.stderr[-2000:]
        assert planned.stdout.count("Run plan") == 3 and "jobs done" not in planned.stdout
    assert snapshot(sweep) == before  # its record (multirun.yaml) too
    assert empty.is_dir() and not list(empty.iterdir())  # the user's folder stays, empty
    assert not list(fresh.iterdir())  # no multirun/<date>/<time>/ left
