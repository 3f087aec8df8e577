"""The launchers' own decisions: the GPUs each local job gets (in-process, and as a real local launch's jobs see
them), a job's progress read from its dir."""

import sys
from pathlib import Path

import pytest
from conftest import run_cli


def test_local_jobs_side_by_side_get_gpus_of_their_own():
    from hydralight.launch.launchers import device_assignment

    assert device_assignment([1, 1, 1, 1], [0, 1, 2, 3]) == [[0], [1], [2], [3]]
    assert device_assignment([2, 2, 1], [0, 1, 2, 3]) == [[0, 1], [2, 3], [0]]  # more than there are: shared
    assert device_assignment([1, 0, 1], [4, 6]) == [[4], [], [6]]  # CUDA_VISIBLE_DEVICES=4,6 of the launcher
    assert device_assignment([1, 1], []) == [[], []]


def test_a_job_s_progress_is_the_step_of_its_last_history_row(tmp_path):
    from hydralight.launch.launchers import _reached

    assert _reached(tmp_path) == ""  # no history yet
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "metrics.csv").write_text("epoch,step,train/loss\n0,1,2.3\n0,2,2.1\n")
    assert _reached(tmp_path) == ", at step 2"


def test_a_requeued_slurm_job_is_waited_for_though_the_accounting_says_its_attempt_ended(tmp_path, monkeypatch):
    """submitit reads SLURM's accounting, which can hold a requeued job's ended attempt (FAILED) before the job
    shows as queued again; the sweep asks the controller, waits, and takes the next attempt's result."""
    import types

    from hydra.core.utils import JobReturn, JobStatus

    from hydra_plugins.hydralight_launchers import PlannedSlurmLauncher
    from hydralight.launch import launchers

    folder = tmp_path / ".submitit" / "7"
    folder.mkdir(parents=True)
    result = folder / "7_0_result.pkl"
    said = iter(["PENDING", "PENDING", "RUNNING"])  # what squeue answers, poll after poll

    def squeue(args, **kwargs):
        assert args[:3] == ["squeue", "-h", "-j"] and args[3] == "7"
        state = next(said, "")
        if state == "RUNNING":
            result.write_bytes(b"")  # the second attempt ends with its result
        return types.SimpleNamespace(returncode=0, stdout=f"{state}\n")

    done = JobReturn(overrides=["seed=1"], _return_value=0, status=JobStatus.COMPLETED)
    job = types.SimpleNamespace(
        job_id="7", state="FAILED", done=lambda: True, results=lambda: [done],
        paths=types.SimpleNamespace(folder=folder, result_pickle=result),
    )  # fmt: skip
    monkeypatch.setattr(launchers.subprocess, "run", squeue)
    monkeypatch.setattr(launchers, "POLL_S", 0.01)
    launcher = object.__new__(PlannedSlurmLauncher)
    launcher.config = None
    assert launcher._wait([job], tmp_path, 0) == [done]
    assert next(said, None) is None  # asked until the job was running again and its result came
    # A job the controller no longer holds ended as its accounting says: without a result.
    failed = types.SimpleNamespace(**{**vars(job), "results": lambda: (_ for _ in ()).throw(RuntimeError("FAILED"))})
    assert not result.exists()  # an ended job's pickles are forgotten
    assert launcher._wait([failed], tmp_path, 0) == []


@pytest.mark.slow
def test_a_real_local_launch_gives_each_parallel_gpu_job_its_own_gpu(tiny_data, tmp_path):
    """hydra/launcher=local on a machine with 4 GPUs (faked: CUDA_VISIBLE_DEVICES=0,1,2,3 in the launching shell):
    four 1-GPU jobs run side by side, and each job's process sees a GPU of its own, not all of them GPU 0. (The
    GPUs are not there: each job then stops at its plan's check, after its process recorded what it was given.)"""
    import json
    import os
    import sys

    from conftest import ROOT, run_python

    seen = tmp_path / "seen"
    seen.mkdir()
    hook = tmp_path / "hook"
    hook.mkdir()
    # Every Python process started with this on its path records the devices it was given, as it starts.
    (hook / "sitecustomize.py").write_text(
        "import json, os, sys\n"
        "if 'submitit.core._submit' in sys.orig_argv:  # a job's own process (not submitit's controller)\n"
        f"    path = os.path.join({str(seen)!r}, str(os.getpid()) + '.json')\n"
        "    json.dump({'argv': sys.orig_argv, 'gpus': os.environ.get('CUDA_VISIBLE_DEVICES')}, open(path, 'w'))\n"
    )
    sweep = tmp_path / "sweep"
    command = [sys.executable, str(ROOT / "train.py"), "-m", "hydra/launcher=local", "cluster=local", "hardware=1gpu",
               "hardware.cpus_per_task=1", "hardware.mem_gb=1", "seed=1,2,3,4",
               f"hydra.sweep.dir={sweep}"]  # fmt: skip
    env = {**os.environ, "DATA_DIR": str(tiny_data), "CUDA_VISIBLE_DEVICES": "0,1,2,3", "PYTHONPATH": str(hook),
           "HYDRALIGHT_TESTS_FRESH": "1"}  # new interpreters, which import the hook (no warm forks)  # fmt: skip
    launched = run_python(command, env, timeout=300)
    jobs = [json.loads(p.read_text()) for p in seen.glob("*.json")]
    given = sorted(j["gpus"] for j in jobs)
    assert given == ["0", "1", "2", "3"], (jobs, launched.stdout[-2000:], launched.stderr[-2000:])


def run_on_a_terminal(command: list[str], env: dict[str, str], timeout: float = 300) -> tuple[int, str]:
    """Run `command` with its stdout and stderr on a pseudo-terminal (as in a shell): its exit code and what it
    drew there."""
    import os
    import pty
    import select
    import subprocess
    import time

    from conftest import ROOT

    leader, follower = pty.openpty()
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdin=follower, stdout=follower, stderr=follower,
                            start_new_session=True)  # fmt: skip
    os.close(follower)
    drawn, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed: the process has ended
                break
            if not chunk:
                break
            drawn += chunk
        elif proc.poll() is not None:
            break
    os.close(leader)
    return proc.wait(timeout=30), drawn.decode(errors="replace")


@pytest.mark.slow
def test_a_sweep_waiting_on_a_terminal_draws_a_live_table_of_its_jobs_and_off_one_a_line_per_change(
    tiny_data, tmp_path
):
    import os
    import re
    import sys

    from conftest import HELPERS, ROOT, TINY, run_python

    slow = ["+callbacks.slow._target_=slow.SlowSteps", "+callbacks.slow.seconds=0.2"]
    args = ["-m", "hydra/launcher=local", "cluster=local", "hardware.cpus_per_task=1", "hardware.mem_gb=1", *TINY,
            "trainer.limit_train_batches=null", "trainer.val_check_interval=5", *slow, "seed=1,2"]  # fmt: skip
    env = {**os.environ, "DATA_DIR": str(tiny_data), "PYTHONPATH": str(HELPERS), "COLUMNS": "120"}
    code, drawn = run_on_a_terminal([sys.executable, str(ROOT / "train.py"), *args,
                                     f"hydra.sweep.dir={tmp_path / 'tty'}"], env)  # fmt: skip
    assert code == 0, drawn[-3000:]
    drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", drawn)  # rich's colours and cursor moves
    assert "sweep jobs" in drawn and re.search(r"job\s*┃\s*id\s*┃\s*state\s*┃\s*step\s*┃\s*val/acc", drawn), drawn[
        -3000:
    ]
    assert re.search(r"#1\s*│\s*\d+\s*│\s*COMPLETED\s*│\s*\d+\s*│\s*[\d.]+", drawn), drawn[-3000:]
    # Off a terminal: a line for each change of a job's state or of its last validation value.
    off = run_python([sys.executable, str(ROOT / "train.py"), *args, f"hydra.sweep.dir={tmp_path / 'log'}"], env)
    assert off.returncode == 0, off.stderr[-3000:]
    said = off.stdout + off.stderr
    assert "sweep jobs" not in said
    assert re.search(r"#0 \(\d+\): RUNNING, at step \d+, val/acc=[\d.]+", said), said[-3000:]
    assert re.search(r"#1 \(\d+\): COMPLETED, at step \d+, val/acc=[\d.]+", said), said[-3000:]


@pytest.mark.parametrize("stock, ours", [("submitit_slurm", "slurm"), ("submitit_local", "local")])
@pytest.mark.parametrize("search", [[], ["hparams_search=optuna"]], ids=["grid", "search"])
def test_a_sweep_under_a_stock_submitit_launcher_is_refused_before_it_submits_anything(stock, ours, search, tmp_path):
    """hydra-submitit-launcher's own launchers, by the names its docs give: they ask SLURM for none of a job's
    devices, CPUs or memory, and submitted plan=true's jobs to the cluster. Nothing is submitted or written."""
    sweep_dir = tmp_path / "sweep"
    for extra in (["plan=true"], []):
        result = run_cli(["-m", f"hydra/launcher={stock}", *search, "seed=1,2", *extra, f"hydra.sweep.dir={sweep_dir}",
                          f"hydra.launcher.submitit_folder={tmp_path / 'submitit'}"], tmp_path)  # fmt: skip
        assert result.returncode == 2, (result.stdout[-2000:], result.stderr[-2000:])
        line = result.stderr.strip().splitlines()[-1]
        assert line.startswith(f"error: hydra/launcher={stock} is hydra-submitit-launcher's launcher as it ships"), line
        assert f"use hydra/launcher={ours}," in line
        assert not sweep_dir.exists() and not (tmp_path / "submitit").exists()


# A laptop's PATH: no SLURM commands on it (the Python of this environment is named by its path).
NO_SLURM = {"PATH": str(Path(sys.executable).parent)}


@pytest.mark.parametrize("host", ["login node", "laptop"])
def test_plan_true_on_the_slurm_launcher_prints_each_jobs_request_and_plan_and_submits_nothing(host, tmp_path):
    # Nothing reaches sbatch: planned from a laptop, or a login node, without a job.
    sweep_dir = tmp_path / "sweep"
    result = run_cli(["-m", "hydra/launcher=slurm", "hardware=1gpu,8gpu", "plan=true", f"hydra.sweep.dir={sweep_dir}",
                      f"hydra.launcher.submitit_folder={tmp_path / 'submitit'}"], tmp_path,
                     **(NO_SLURM if host == "laptop" else {}))  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("Run plan") == 2
    said = result.stdout + result.stderr
    assert "#0 would ask slurm for cpus_per_task=8, gpus_per_node=1, mem_gb=64, nodes=1, tasks_per_node=1" in said
    assert "gpus_per_node=8" in said and "nothing is submitted" in said
    assert not (tmp_path / "submitit").exists() and not sweep_dir.exists()


def test_a_slurm_sweep_from_a_host_without_slurm_is_one_line_and_leaves_nothing(tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = run_cli(["-m", "hydra/launcher=slurm", "hardware=1gpu,8gpu", f"hydra.sweep.dir={sweep_dir}",
                      f"hydra.launcher.submitit_folder={tmp_path / 'submitit'}"], tmp_path, **NO_SLURM)  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "srun, sbatch" in lines[0] and "plan=true" in lines[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not sweep_dir.exists() and not (tmp_path / "submitit").exists()


@pytest.mark.parametrize(
    ("minutes", "warning_s", "said"),
    [
        (-5, 60, "cluster.timeout_min=-5 is no time limit"),  # SLURM reads a negative one as years
        (0, 60, "cluster.timeout_min=0 is no time limit"),  # and 0 as none
        (1, 60, "cluster.timeout_min=1 ends before its warning"),  # stopped as it starts, requeued forever
        (5, -1, "cluster.signal_delay_s=-1 must be whole seconds >= 0"),
    ],
)
def test_a_time_limit_slurm_cannot_keep_is_one_line_before_anything_is_written(minutes, warning_s, said, tmp_path):
    from conftest import one_line

    sweep_dir = tmp_path / "sweep"
    line = one_line(run_cli(["-m", "hydra/launcher=slurm", "hardware=1gpu", "seed=1,2", "hydra.launcher.dry_run=true",
                             f"cluster.timeout_min={minutes}", f"cluster.signal_delay_s={warning_s}",
                             f"hydra.sweep.dir={sweep_dir}", f"hydra.launcher.submitit_folder={tmp_path / 's'}"],
                            tmp_path))  # fmt: skip
    assert said in line and not sweep_dir.exists() and not (tmp_path / "s").exists()


def test_local_jobs_side_by_side_asking_for_more_cpus_than_the_machine_has_are_said_so(monkeypatch, caplog):
    """4 jobs of 2 DDP processes on a 2-core machine: each plan said `1 cpu each`, nothing said they share."""
    import logging
    import types

    from hydralight.launch import launchers
    from hydralight.training import machine

    monkeypatch.setattr(machine, "detect", lambda: types.SimpleNamespace(cpu_cores=2))
    with caplog.at_level(logging.WARNING, logger=launchers.__name__):
        launchers._say_if_crowded({(("cpus_per_task", 2), ("nodes", 1)): [0, 1, 2, 3]})
        (said,) = [r.getMessage() for r in caplog.records]
        assert "the 4 local jobs run side by side and ask for 8 CPUs together; this machine has 2" in said
        caplog.clear()
        launchers._say_if_crowded({(("cpus_per_task", 1), ("nodes", 1)): [0, 1]})  # they fit
        launchers._say_if_crowded({(("cpus_per_task", 4), ("nodes", 1)): [0]})  # one job: its own plan says it
        assert not caplog.records
