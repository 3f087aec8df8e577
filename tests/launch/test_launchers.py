"""The launchers' own decisions: the GPUs each local job gets (in-process, and as a real local launch's jobs see
them), a job's progress read from its dir."""

import pytest


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


@pytest.mark.slow
def test_a_real_local_launch_gives_each_parallel_gpu_job_its_own_gpu(tiny_data, tmp_path):
    """hydra/launcher=local on a machine with 4 GPUs (faked: CUDA_VISIBLE_DEVICES=0,1,2,3 in the launching shell):
    four 1-GPU jobs run side by side, and each job's process sees a GPU of its own, not all of them GPU 0."""
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
               "hardware.cpus_per_task=1", "hardware.mem_gb=1", "plan=true", "seed=1,2,3,4",
               f"hydra.sweep.dir={sweep}"]  # fmt: skip
    env = {**os.environ, "DATA_DIR": str(tiny_data), "CUDA_VISIBLE_DEVICES": "0,1,2,3", "PYTHONPATH": str(hook),
           "HYDRALIGHT_TESTS_FRESH": "1"}  # new interpreters, which import the hook (no warm forks)  # fmt: skip
    launched = run_python(command, env, timeout=300)
    jobs = [json.loads(p.read_text()) for p in seen.glob("*.json")]
    given = sorted(j["gpus"] for j in jobs)
    assert given == ["0", "1", "2", "3"], (jobs, launched.stdout[-2000:], launched.stderr[-2000:])
