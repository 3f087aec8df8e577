"""Sweeps against a real SLURM cluster (scripts/slurm_up.sh): submission, sizing, refusals, requeue."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import HELPERS, IN_CI, ROOT, TINY, csv_rows, popen, run_cli
from filelock import FileLock

# Both pytest workers may use the shared cluster at once: each job asks for what fits beside another
# (1 CPU, 1 GB unless a test wants the profile's own), SLURM queues the rest.
pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster() -> None:
    """Bring the local cluster up (idempotent): this machine's node (partition debug) and two namespaced
    nodes (partition multi, tests/test_multinode.py); in CI a cluster that cannot start fails the tests."""
    reason = None
    if os.geteuid() != 0 or not shutil.which("apt-get") and not shutil.which("slurmctld"):
        reason = "starting the local SLURM cluster needs root on a Debian/Ubuntu machine"
    else:
        # Both pytest workers may get here at once: one brings the cluster up, the other then finds it up.
        with FileLock(Path(tempfile.gettempdir()) / "hydralight-slurm-up.lock"):
            up = subprocess.run(["bash", str(ROOT / "scripts" / "slurm_up.sh")], capture_output=True, text=True,
                                timeout=600, env={**os.environ, "NODES": "2"})  # fmt: skip
        if up.returncode:
            reason = f"NODES=2 scripts/slurm_up.sh failed: {up.stderr.strip()[-500:]}"
    if reason:
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)


def sweep(args: list[str], sweep_dir: Path, data: Path, wait: bool = True, sized: bool = True, **env: str):
    environ = {**os.environ, "DATA_DIR": str(data), "PYTHONPATH": str(HELPERS), **env}
    # A SLURM job names every resource: CPUs and memory that fit the local cluster, unless the profile's are wanted.
    fit = ["hardware.cpus_per_task=1", "hardware.mem_gb=1"] if sized else []
    command = [sys.executable, str(ROOT / "train.py"), "-m", "hydra/launcher=slurm", "cluster=local", *fit, *args,
               f"hydra.sweep.dir={sweep_dir}"]  # fmt: skip
    proc = popen(command, environ)
    if not wait:
        return proc
    try:
        output = proc.communicate(timeout=300)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, output


def sacct(job: str, fields: str = "State") -> list[str]:
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job, "-o", fields], capture_output=True, text=True)
    return out.stdout.split()


def final_state(job: str, timeout: float = 60) -> str:
    """The job's state once SLURM has closed it (results can be on disk a moment before that)."""
    deadline = time.monotonic() + timeout
    while (state := (sacct(job) or ["?"])[0]) in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING", "?"):
        assert time.monotonic() < deadline, f"job {job} still {state}"
        time.sleep(0.5)
    return state


def job_ids(output: str) -> list[str]:
    return [line.split("slurm job ")[1].split()[0] for line in output.splitlines() if "slurm job " in line]


def ranks(run: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((run / "ranks").glob("rank*.json"))]


def test_sweep_of_two_ddp_jobs(cluster, tiny_data, tmp_path):
    code, output = sweep([*TINY, "hardware.devices=2", "optim.lr=0.01,0.02"], tmp_path / "sweep", tiny_data)
    assert code == 0, output[-3000:]
    ids = job_ids(output)
    assert len(ids) == 2
    for job_id, job, lr in zip(ids, ("0", "1"), (0.01, 0.02), strict=True):
        assert final_state(job_id) == "COMPLETED"
        run = tmp_path / "sweep" / job
        assert [(r["global_rank"], r["lr"], r["launcher"]) for r in ranks(run)] == [
            (0, lr, "SLURMEnvironment"),
            (1, lr, "SLURMEnvironment"),
        ]
        assert json.loads((run / "results.json").read_text())["metrics"]["test/samples"] == 200
        assert (run / "checkpoints" / "last.ckpt").is_file()
        log = (run / "train.log").read_text().splitlines()
        assert len(log) == len(set(log)), "rank 1 must not write into the job log"


@pytest.mark.parametrize(
    "hardware,expected",
    [
        ("8gpu", ["--nodes=1", "--ntasks-per-node=8", "--gpus-per-node=8", "--cpus-per-task=12", "--mem=512GB"]),
        ("2x8gpu", ["--nodes=2", "--ntasks-per-node=8", "--gpus-per-node=8", "--cpus-per-task=12"]),
    ],
)
def test_sbatch_script_follows_the_hardware_profile(hardware, expected, tiny_data, tmp_path):
    args = [f"hardware={hardware}", "hydra.launcher.dry_run=true"]
    code, output = sweep(args, tmp_path / "sweep", tiny_data, sized=False)
    assert code == 0, output
    script = (tmp_path / "sweep" / "sbatch" / "job0.sh").read_text()
    for line in expected:
        assert f"#SBATCH {line}\n" in script, script
    assert "#SBATCH --partition=debug" in script and "#SBATCH --signal=USR2@60" in script
    # The interpreter a real submission runs (this one), not whichever `python` the node finds first.
    assert f"{sys.executable} -u -m submitit.core._submit" in script, script


def sbatch_lines(script: Path) -> set[str]:
    return {line for line in script.read_text().splitlines() if line.startswith("#SBATCH --")}


def test_a_hardware_sweep_sizes_each_job_with_no_slurm_on_the_path(tiny_data, tmp_path):
    # Only the interpreter: no sbatch, srun or squeue on the submitting host.
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python").symlink_to(sys.executable)
    args = ["hardware=1gpu,8gpu", "hydra.launcher.dry_run=true"]
    code, output = sweep(args, tmp_path / "sweep", tiny_data, sized=False, PATH=str(bare))
    assert code == 0, output
    one, eight = (sbatch_lines(tmp_path / "sweep" / "sbatch" / f"job{i}.sh") for i in (0, 1))
    assert {"--ntasks-per-node=1", "--gpus-per-node=1", "--cpus-per-task=8", "--mem=64GB"} <= {
        line.removeprefix("#SBATCH ") for line in one
    }
    assert {"--ntasks-per-node=8", "--gpus-per-node=8", "--cpus-per-task=12", "--mem=512GB"} <= {
        line.removeprefix("#SBATCH ") for line in eight
    }


def test_a_cluster_job_left_at_auto_is_refused_naming_the_field(tiny_data, tmp_path):
    args = ["hardware=cpu", "hardware.devices=1,2", "hydra.launcher.dry_run=true"]
    code, output = sweep(args, tmp_path / "sweep", tiny_data, sized=False)
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in output, output
    assert "hardware.cpus_per_task, hardware.mem_gb cannot be auto" in errors[0]
    assert not (tmp_path / "sweep").exists()


def test_a_sweep_over_process_counts_runs_each_job_with_its_own_request(cluster, tiny_data, tmp_path):
    code, output = sweep([*TINY, "hardware.devices=1,2"], tmp_path / "sweep", tiny_data)
    assert code == 0, output
    one, two = job_ids(output)
    assert one != two  # different requests: separate submissions
    assert [len(ranks(tmp_path / "sweep" / str(i))) for i in (0, 1)] == [1, 2]
    final_state(one), final_state(two)  # recorded by the accounting, which may lag the results
    assert "cpu=1," in sacct(one, "AllocTRES")[0] and "cpu=2," in sacct(two, "AllocTRES")[0]


def test_gpu_request_is_accepted_by_slurm(cluster, tiny_data, tmp_path):
    # The fake GPUs have no CUDA behind them: the job itself fails, but SLURM must take the request.
    args = [*TINY, "hardware=1gpu", "hardware.cpus_per_task=1", "hardware.mem_gb=1"]
    code, output = sweep(args, tmp_path / "sweep", tiny_data)
    (job_id,) = job_ids(output)
    final_state(job_id)  # the accounting may record the job a moment after it ended
    assert "gres/gpu=1" in sacct(job_id, "AllocTRES")[0]
    assert code != 0  # no CUDA in the job: refused by the plan inside the job
    assert "no CUDA GPU" in (tmp_path / "sweep" / ".submitit" / job_id / f"{job_id}_0_log.out").read_text()


@pytest.mark.parametrize(
    "args,message",
    [
        (["cluster.partition=nosuchpartition"], "invalid partition"),
        (
            [
                "hardware=1gpu",
                "hardware.devices=9",
                "batch.global_size=36",
                "hardware.cpus_per_task=1",
                "hardware.mem_gb=1",
            ],
            "not available|more processors",
        ),
    ],
)
def test_refused_submission_is_one_line(cluster, tiny_data, tmp_path, args, message):
    code, output = sweep([*TINY, *args], tmp_path / "sweep", tiny_data)
    assert code == 2, output
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and re.search(message, errors[0].lower()) and "Traceback" not in output
    assert errors[0].startswith("error: SLURM refused the job") and "with the hardware group" in errors[0]
    assert "sbatch: error" not in output  # sbatch's own lines are said once, in that line
    assert not (tmp_path / "sweep").exists()  # nothing submitted: no job scripts or pickles left, no sweep dir


def test_a_sweep_refused_part_way_cancels_what_it_submitted_before(cluster, tiny_data, tmp_path):
    """Job 0 fits the cluster, job 1 asks for more CPUs than a node has: sbatch takes the first and refuses the
    second. The sweep is refused as a whole: job 0 does not run on unwatched."""
    sweep_dir = tmp_path / "sweep"
    code, output = sweep([*TINY, "hardware.cpus_per_task=1,64", "hardware.mem_gb=1"], sweep_dir, tiny_data, sized=False)
    assert code == 2, output
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: SLURM refused the job"), output[-2000:]
    assert "the 1 job(s) it had submitted before are cancelled" in errors[0]
    (first,) = job_ids(output)
    assert final_state(first).startswith("CANCELLED")
    assert not (sweep_dir / "0" / "results.json").exists()


def requeue_and_finish(job_id: str, proc: subprocess.Popen, signal_name: str = "USR2") -> str:
    """Send the time-limit warning signal, wait until the job is requeued, let it start again at once (SLURM
    holds a requeued job ~2 minutes), and check the sweep and the job end well after one restart."""
    subprocess.run(["scancel", f"--signal={signal_name}", job_id], check=True)
    deadline = time.monotonic() + 120
    while "PENDING" not in subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                                          text=True).stdout:  # fmt: skip
        assert time.monotonic() < deadline, "job was not requeued"
        time.sleep(0.5)
    # slurmd refuses an attempt whose credential dates from the second it revoked the last one's ("Job credential
    # revoked": the job ends FAILED); SLURM's own hold keeps them apart, a release at once may not.
    time.sleep(2)
    subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], check=True)
    output = proc.communicate(timeout=600)[0]
    assert proc.returncode == 0, output[-3000:]
    assert final_state(job_id) == "COMPLETED"
    assert "Restarts=1 " in subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    return output


def run_steps(run: Path) -> int:
    return json.loads((run / "results.json").read_text())["global_step"]


def test_requeued_job_resumes_in_its_own_dir(cluster, tiny_data, tmp_path):
    """Started from another run's checkpoint (ckpt_path=), requeued: it continues from its own last.ckpt."""
    source = tmp_path / "source"
    first = run_cli([*TINY, "trainer.limit_train_batches=null", "seed=3"], source, tiny_data)
    assert first.returncode == 0, first.stderr[-2000:]
    start = f"ckpt_path={source / 'checkpoints' / 'last.ckpt'}"
    steps = [*TINY, "trainer.limit_train_batches=null", "trainer.max_epochs=3", "seed=3", start]
    slow = ["+callbacks.slow._target_=slow.SlowSteps", "+callbacks.slow.seconds=0.15"]
    # The uninterrupted job to compare with: the same 2-process run, here (SLURM starts it alike).
    plain = tmp_path / "plain"
    straight = run_cli([*steps, "hardware.devices=2"], plain, tiny_data)
    assert straight.returncode == 0, straight.stderr[-2000:]

    proc = sweep([*steps, *slow, "hardware.devices=2"], tmp_path / "requeued", tiny_data, wait=False)
    run = tmp_path / "requeued" / "0"
    deadline = time.monotonic() + 120
    while not (run / "ranks" / "rank1.json").exists():
        assert time.monotonic() < deadline and proc.poll() is None, "job never started"
        time.sleep(0.5)
    time.sleep(2)  # a few steps in
    job_id = next(
        p.name for p in (tmp_path / "requeued" / ".submitit").iterdir() if re.fullmatch(r"\d+(_\d+)?", p.name)
    )
    requeue_and_finish(job_id, proc)
    assert run_steps(run) == run_steps(plain) == 45
    logs = "".join(p.read_text() for p in run.glob("*.log"))
    assert "continuing from this run's own" in logs and "is not read: a run dir that has saved goes on" in logs
    expected = json.loads((plain / "results.json").read_text())["metrics"]
    again = json.loads((run / "results.json").read_text())["metrics"]
    assert again["test/acc"] == expected["test/acc"]
    assert again["val/loss"] == pytest.approx(expected["val/loss"], rel=1e-5)
    # The metric history of both attempts: every step once, the values of the uninterrupted job.
    rows = lambda job: [(r["step"], sorted(r)) for r in csv_rows(job)]  # noqa: E731
    assert rows(run) == rows(plain)
    losses = lambda job: [float(r["train/loss_step"]) for r in csv_rows(job) if "train/loss_step" in r]  # noqa: E731
    assert losses(run) == pytest.approx(losses(plain), rel=1e-5)


# Before training only submitit's handler is installed, for its own signal (USR2). The warning in the test after
# training is not here: its job was once counted failed by the waiting sweep before its requeued attempt ran.
@pytest.mark.parametrize("hold,signal_name", [("SlowStart", "USR2"), ("SlowTest", "USR2"), ("SlowTest", "USR1")])
def test_a_job_warned_before_or_after_it_trains_is_requeued_and_runs_again(
    hold, signal_name, cluster, tiny_data, tmp_path
):
    """The warning signal (submitit's USR2, or Lightning's USR1) while the job still builds, or in its test after
    training: the job is requeued and its second attempt finishes the run (the first failed on a config the first
    attempt had left read-only; a USR1 in the test killed the job unsaved)."""
    marker = tmp_path / "held"
    hold = [f"+callbacks.hold._target_=slow.{hold}", f"+callbacks.hold.marker={marker}"]
    plain = run_cli([*TINY, "seed=4"], tmp_path / "plain", tiny_data)
    assert plain.returncode == 0, plain.stderr[-2000:]
    proc = sweep([*TINY, "seed=4", *hold], tmp_path / "sweep", tiny_data, wait=False)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert time.monotonic() < deadline and proc.poll() is None, "job never started"
        time.sleep(0.5)
    job_id = next(p.name for p in (tmp_path / "sweep" / ".submitit").iterdir() if re.fullmatch(r"\d+(_\d+)?", p.name))
    output = requeue_and_finish(job_id, proc, signal_name)
    assert "1 of 1 jobs done" in output, output[-3000:]
    run = tmp_path / "sweep" / "0"
    assert run_steps(run) == run_steps(tmp_path / "plain") == 4
    results = lambda r: json.loads((r / "results.json").read_text())["metrics"]  # noqa: E731
    assert results(run) == results(tmp_path / "plain")
    assert [sorted(r.items()) for r in csv_rows(run)] == [sorted(r.items()) for r in csv_rows(tmp_path / "plain")]


def test_a_sweep_dir_with_shell_syntax_in_its_name_reaches_sbatch_as_a_name(cluster, tiny_data, tmp_path):
    """`$(...)` and backquotes in the sweep dir are written into the sbatch script and run by SLURM's shell:
    they stay quoted there, so the job runs in the folder of that very name and no command runs."""
    folder = tmp_path / "sweep $(touch PWNED) `touch PWNED2`"
    code, output = sweep(TINY, f"'{folder}'", tiny_data, PWD=str(tmp_path))  # quoted for Hydra's grammar
    assert code == 0, output[-3000:]
    assert (folder / "0" / "results.json").is_file()
    assert not list(tmp_path.rglob("PWNED*")) and not list(ROOT.glob("PWNED*"))
    (log,) = (folder / ".submitit").rglob("*_0_log.out")  # SLURM wrote the job's log where the script said
    assert log.read_text()


def test_a_failing_job_does_not_stop_a_slurm_sweep(cluster, tiny_data, tmp_path):
    args = [*TINY, "trainer.limit_train_batches=null", "optim=sgd", "optim.lr_scaling=none", "optim.lr=1e12,0.05"]
    code, output = sweep(args, tmp_path / "sweep", tiny_data)
    assert code == 1, output[-3000:]
    assert "Traceback" not in output
    assert f"sweep {tmp_path / 'sweep'}: 1 of 2 jobs done, 1 failed (#0 failed: the loss is" in output
    assert (tmp_path / "sweep" / "1" / "results.json").is_file()
    submitted = json.loads((tmp_path / "sweep" / "jobs.json").read_text())
    assert set(submitted) == {"0", "1"}
    # SLURM's accounting (sacct, mail on failure) says so too: the job's process ended with an error.
    assert [final_state(submitted[n]["job_id"]) for n in ("0", "1")] == ["FAILED", "COMPLETED"]


def test_a_job_killed_on_its_node_is_failed_in_its_manifest_and_the_sweep_says_where_jobs_stand(
    cluster, tiny_data, tmp_path
):
    """scancel of a running job: its own process cannot record that it ended, the sweep does; while it waits the
    sweep says each job's state as it changes, with the step it reached."""
    slow = ["+callbacks.slow._target_=slow.SlowSteps", "+callbacks.slow.seconds=0.3"]
    proc = sweep([*TINY, "trainer.limit_train_batches=null", *slow, "seed=1,2"], tmp_path / "sweep", tiny_data,
                 wait=False)  # fmt: skip
    killed = tmp_path / "sweep" / "0"
    deadline = time.monotonic() + 120
    while not (killed / "csv" / "metrics.csv").exists() or not ranks(killed):
        assert time.monotonic() < deadline and proc.poll() is None, "job never started"
        time.sleep(0.5)
    job_id = json.loads((tmp_path / "sweep" / "jobs.json").read_text())["0"]["job_id"]
    # SIGKILL on the node, as the OOM killer ends a job: its process records nothing of it.
    os.kill(ranks(killed)[0]["pid"], 9)
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode == 1, output[-3000:]
    manifest = json.loads((killed / "manifest.json").read_text())
    assert manifest["status"] == "failed" and f"slurm job {job_id} ended" in manifest["error"], manifest
    # Each state as SLURM's accounting reports it (polled with backoff: a short RUNNING may not be seen).
    assert re.search(rf"#0 \({job_id}\): (RUNNING|FAILED)", output) and re.search(r"#1 \(\d+_\d+\): COMPLETED", output)
    assert "UNKNOWN" not in output
    assert f"sweep {tmp_path / 'sweep'}: 1 of 2 jobs done, 1 failed" in output


def test_a_finished_sweep_run_again_submits_only_what_is_left_to_run(cluster, tiny_data, tmp_path):
    args = [*TINY, "trainer.limit_train_batches=null", "trainer.max_steps=3"]
    sweep_dir = tmp_path / "sweep"
    code, output = sweep([*args, "seed=1,2"], sweep_dir, tiny_data)
    assert code == 0, output[-3000:]
    before = {str(p.relative_to(sweep_dir)): p.read_bytes() for p in sorted(sweep_dir.rglob("*")) if p.is_file()}
    # The same command: each job says it finished; nothing is submitted and no file changes.
    code, output = sweep([*args, "seed=1,2"], sweep_dir, tiny_data)
    assert code == 0 and output.count(": already finished: test/acc=") == 2, output[-3000:]
    assert "slurm job " not in output and f"sweep {sweep_dir}: 2 of 2 jobs done" in output
    after = {str(p.relative_to(sweep_dir)): p.read_bytes() for p in sorted(sweep_dir.rglob("*")) if p.is_file()}
    assert after == before
    # One more seed on a partition SLURM does not have: refused, and the sweep's record (multirun.yaml) too
    # stays as it was.
    code, output = sweep([*args, "seed=1,2,3", "cluster.partition=nope"], sweep_dir, tiny_data)
    assert code == 2 and "error: SLURM refused the job" in output, output[-3000:]
    after = {str(p.relative_to(sweep_dir)): p.read_bytes() for p in sorted(sweep_dir.rglob("*")) if p.is_file()}
    assert after == before
    # One more seed: only its job is submitted.
    code, output = sweep([*args, "seed=1,2,3"], sweep_dir, tiny_data)
    assert code == 0 and output.count(": already finished: test/acc=") == 2, output[-3000:]
    assert set(json.loads((sweep_dir / "jobs.json").read_text())) == {"0", "1", "2"}
    assert len(job_ids(output)) == 1 and (sweep_dir / "2" / "results.json").is_file()
    assert f"sweep {sweep_dir}: 3 of 3 jobs done" in output


def test_a_sweep_run_again_while_its_jobs_still_run_is_refused_and_they_run_on(cluster, tiny_data, tmp_path):
    """The submitting process killed, the jobs left running: the same command again would submit each job a second
    time (beside the first, refused by its run dir's lock, which then marked the live run failed). One line
    instead, nothing submitted, and the live job ends as it would have."""
    slow = ["+callbacks.slow._target_=slow.SlowSteps", "+callbacks.slow.seconds=0.3"]
    args = [*TINY, "trainer.limit_train_batches=null", *slow, "seed=1"]
    proc = sweep(args, tmp_path / "sweep", tiny_data, wait=False)
    run = tmp_path / "sweep" / "0"
    deadline = time.monotonic() + 120
    while not (run / "csv" / "metrics.csv").exists() or not (tmp_path / "sweep" / "jobs.json").exists():
        assert time.monotonic() < deadline and proc.poll() is None, "job never started"
        time.sleep(0.5)
    proc.kill()
    proc.communicate()
    job_id = json.loads((tmp_path / "sweep" / "jobs.json").read_text())["0"]["job_id"]
    code, output = sweep(args, tmp_path / "sweep", tiny_data)
    assert code == 2, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and f"still queued or running (#0: slurm job {job_id})" in errors[0], output[-3000:]
    assert not [line for line in output.splitlines() if "slurm job" in line and " -> " in line]  # none submitted
    assert final_state(job_id, timeout=180) == "COMPLETED"
    assert json.loads((run / "manifest.json").read_text())["status"] == "finished"
