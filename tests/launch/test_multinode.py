"""Two-node SLURM jobs for real: the local cluster's namespaced nodes (`make slurm-up NODES=2`), each its
own network host, one job of 2 nodes x 1 task through the project's launcher."""

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from conftest import TINY, csv_rows, run_cli
from test_slurm import (
    cluster,  # noqa: F401  (brings up the local cluster with its namespaced nodes)
    final_state,
    requeue_and_finish,
    sweep,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("cluster")]
PARTITION = "multi"  # the namespaced nodes of scripts/slurm_up.sh with NODES=2
TWO_NODES = ["hardware=cpu", "hardware.devices=1", "hardware.num_nodes=2", f"cluster.partition={PARTITION}"]
# 20 steps over two epochs of the tiny data, in float64 so that only a difference in samples, masks or
# shifts could move the weights apart (the cnn has dropout, the shift is augmentation).
STEPS = [*[a for a in TINY if not a.startswith("model=")], "model=cnn", "data.max_shift=2", "trainer.precision=64-true",
         "trainer.limit_train_batches=null", "trainer.max_steps=20", "trainer.max_epochs=3", "seed=5"]  # fmt: skip
SLOW = ["+callbacks.slow._target_=slow.SlowSteps", "+callbacks.slow.seconds=0.2"]


def ranks(run: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((run / "ranks").glob("rank*.json"))]


def weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]


def job_id_of(sweep_dir: Path) -> str:
    return next(p.name for p in (sweep_dir / ".submitit").iterdir() if re.fullmatch(r"\d+(_\d+)?", p.name))


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline and proc.poll() is None, f"{path} never appeared"
        time.sleep(0.5)


def test_a_two_node_job_trains_as_one_process_does(tiny_data, tmp_path):
    code, output = sweep([*STEPS, *TWO_NODES], tmp_path / "sweep", tiny_data)
    assert code == 0, output[-3000:]
    run = tmp_path / "sweep" / "0"
    found = ranks(run)
    # Two hosts, one rank each, rendezvous over the namespaces' network.
    assert [(r["global_rank"], r["node_rank"], r["world_size"]) for r in found] == [(0, 0, 2), (1, 1, 2)]
    assert len({r["host"] for r in found}) == 2, found
    assert {r["launcher"] for r in found} == {"SLURMEnvironment"}
    # One writer of the run dir: rank 0's log only, each line once.
    log = (run / "train.log").read_text().splitlines()
    assert len(log) == len(set(log))
    one = tmp_path / "one"
    single = run_cli([*STEPS, "hardware=cpu", "hardware.devices=1"], one, tiny_data)
    assert single.returncode == 0, single.stderr[-3000:]
    a, b = weights(one), weights(run)
    worst = max(((a[k] - b[k]).abs().max() / a[k].abs().max().clamp_min(1e-12)).item() for k in a)
    print(f"2 nodes vs 1 process, max relative weight difference after 20 steps: {worst:.3g}")
    assert worst < 1e-4, worst


def test_a_requeued_two_node_job_resumes_with_the_exact_step_count(tiny_data, tmp_path):
    args = [*STEPS, "trainer.max_steps=-1", "trainer.max_epochs=3", *SLOW, *TWO_NODES]
    proc = sweep(args, tmp_path / "sweep", tiny_data, wait=False)
    run = tmp_path / "sweep" / "0"
    wait_for(run / "ranks" / "rank1.json", proc)
    time.sleep(3)  # a few steps in
    job_id = job_id_of(tmp_path / "sweep")
    # The warning signal, as SLURM sends it before a time limit: to every task on both nodes.
    requeue_and_finish(job_id, proc)
    # Both attempts in the same run dir: 3 epochs of 15 steps, every step's loss logged once.
    assert json.loads((run / "results.json").read_text())["global_step"] == 45
    steps = [int(r["step"]) for r in csv_rows(run) if "train/loss_step" in r]
    assert steps == sorted(set(steps)) and len(steps) == 45
    assert "continuing from this run's own" in (run / "train.log").read_text()


def test_a_rank_killed_on_one_node_fails_the_whole_job(tiny_data, tmp_path):
    args = [*STEPS, "trainer.max_steps=-1", "trainer.max_epochs=20", *SLOW, *TWO_NODES]
    proc = sweep(args, tmp_path / "sweep", tiny_data, wait=False)
    run = tmp_path / "sweep" / "0"
    wait_for(run / "ranks" / "rank1.json", proc)
    time.sleep(2)
    job_id = job_id_of(tmp_path / "sweep")
    survivor, victim = (r["pid"] for r in ranks(run))
    killed = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    state = final_state(job_id, timeout=120)
    ended = time.monotonic() - killed
    assert state in ("FAILED", "CANCELLED", "NODE_FAIL"), state
    # srun --kill-on-bad-exit ends the other rank at once; without it a collective would wait for its timeout.
    assert ended < 60, ended
    exit_code = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "ExitCode"], capture_output=True,
                               text=True).stdout.split()[0]  # fmt: skip
    assert exit_code != "0:0"
    with pytest.raises(ProcessLookupError):  # no rank left behind on the other node
        os.kill(survivor, 0)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 1 and "1 failed" in output, output[-3000:]
    print(f"rank 1 killed -> job {state} after {ended:.1f} s")
