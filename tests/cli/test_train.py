"""The entrypoint end to end, through the real command line, on tiny generated data."""

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import HELPERS, TINY, csv_rows, one_line, run_cli, run_python


def test_train_writes_checkpoint_metrics_and_record(tiny_data, tmp_path):
    run = tmp_path / "run"
    result = run_cli(TINY, run, tiny_data)
    assert result.returncode == 0, result.stderr
    match = re.search(r"^test/acc=(\d\.\d+)", result.stdout, re.M)
    assert match, result.stdout
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert (run / "config.yaml").is_file() and (run / "plan.yaml").is_file()
    results = json.loads((run / "results.json").read_text())
    assert abs(results["test/acc"] - float(match.group(1))) < 1e-4
    assert results["best_checkpoint"].startswith(str(run / "checkpoints"))
    metrics = (run / "csv" / "metrics.csv").read_text()
    for column in ("train/loss_step", "val/acc", "val/loss", "test/acc", "lr-Adam"):
        assert column in metrics


# Lightning's banners and tips: what a plain run's console must not show.
NOISE = ("GPU available", "TPU available", "Tip:", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES", "srun", "FLOPs",
         "Trainable params", "`Trainer.fit` stopped", "weights_only", "LeafSpec", "stepping batches")  # fmt: skip


def test_console_of_a_plain_run_is_plan_run_dir_progress_result(tiny_data, tmp_path):
    # An `srun` on the PATH outside SLURM, as on a cluster's login node: Lightning would suggest using it.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "srun").chmod(0o755)
    run = tmp_path / "run"
    # The one-cycle schedule of experiment=fast: Lightning counts the run's steps for it, and says so.
    onecycle = ["optim=adam_onecycle", "trainer.limit_train_batches=6"]
    result = run_cli([*TINY, *onecycle], run, tiny_data, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert result.returncode == 0, result.stderr[-2000:]
    console = result.stdout + result.stderr
    assert [line for line in console.splitlines() if any(n in line for n in NOISE)] == []
    lines = result.stdout.splitlines()
    assert lines[0].startswith("plan: 1 cpu process") and "global batch 32" in lines[0] and "MLP" in lines[0]
    assert lines[1] == f"run dir: {run}"
    assert lines[-1].startswith("test/acc=") and sum(line.startswith("test") for line in lines) == 1
    assert "Traceback" not in console and "Warning" not in console


@pytest.mark.slow
def test_torch_trains_on_the_cores_the_plan_gives_it(tiny_data, tmp_path):
    """hardware.cpus_per_task holds torch's threads to it, and an OMP_NUM_THREADS of the user's wins; the plan
    line says what is in force, measured by a callback as the run trains (real interpreters, not forks)."""
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("needs 2 cores to give torch fewer")
    seen = ["+callbacks.threads._target_=threads_seen.ThreadsSeen", "+callbacks.threads.run_dir=${hydra:run.dir}"]
    fresh = {"HYDRALIGHT_TESTS_FRESH": "1", "PYTHONPATH": str(HELPERS)}
    # The suite's own OMP_NUM_THREADS (its workers share the cores) is not a user's: none here.
    held = run_cli(
        [*TINY, *seen, "hardware.cpus_per_task=1"], tmp_path / "held", tiny_data, OMP_NUM_THREADS="", **fresh
    )
    assert held.returncode == 0, held.stderr[-2000:]
    assert held.stdout.splitlines()[0].startswith("plan: 1 cpu process (1 cpu each)")
    assert json.loads((tmp_path / "held" / "threads-0.json").read_text())["threads"] == 1
    told = run_cli([*TINY, *seen], tmp_path / "told", tiny_data, OMP_NUM_THREADS="1", **fresh)
    assert told.returncode == 0, told.stderr[-2000:]
    assert told.stdout.splitlines()[0].startswith(f"plan: 1 cpu process ({cores} cpus each, torch on 1 thread)")
    assert json.loads((tmp_path / "told" / "threads-0.json").read_text())["threads"] == 1


# What Lightning says when it resumes or sets up DDP: the project's own line says it once, in its own words.
RESUME_NOISE = ("Restor", "resuming from a checkpoint", "exists and is not empty", "logging interval", "distributed",
                "MEMBER:", "[INFO]")  # fmt: skip


@pytest.mark.slow
def test_console_of_a_resumed_ddp_run_says_where_it_continues_once(tiny_data, tmp_path):
    run = tmp_path / "run"
    args = [*TINY, "hardware.devices=2", "trainer.limit_train_batches=2", "trainer.log_every_n_steps=50"]
    first = run_cli([*args, "trainer.max_epochs=1"], run, tiny_data)
    again = run_cli([*args, "trainer.max_epochs=2"], run, tiny_data)
    for result in (first, again):
        assert result.returncode == 0, result.stderr[-2000:]
        console = result.stdout + result.stderr
        assert [line for line in console.splitlines() if any(n in line for n in (*NOISE, *RESUME_NOISE))] == []
    lines = again.stdout.splitlines()
    assert lines[0] == f"continuing from this run's own {run}/checkpoints/last.ckpt (step 2)", lines
    assert lines[1].startswith("plan: 2 cpu processes") and lines[-1].startswith("test/acc=")


@pytest.mark.slow
def test_a_shell_inside_a_slurm_allocation_runs_here_or_says_why_not(tiny_data, tmp_path):
    # An salloc shell: one task, SLURM's variables set. The ranks this run starts are its own, not srun's.
    allocation = {"SLURM_JOB_ID": "77", "SLURM_NTASKS": "1", "SLURM_JOB_NAME": "train", "SLURM_PROCID": "0"}
    run = tmp_path / "run"
    result = run_cli([*TINY, "hardware.devices=2"], run, tiny_data, **allocation)
    assert result.returncode == 0, result.stderr[-3000:]
    assert {json.loads(p.read_text())["launcher"] for p in (run / "ranks").glob("*.json")} == {"LightningEnvironment"}
    # Another job's task count left in the shell: one line, nothing written.
    line = one_line(run_cli(TINY, tmp_path / "other", tiny_data, **{**allocation, "SLURM_NTASKS": "4"}))
    assert "SLURM_NTASKS=4 is set without SLURM_NTASKS_PER_NODE" in line and not (tmp_path / "other").exists()
    both = {**allocation, "SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "4"}
    line = one_line(run_cli(TINY, tmp_path / "other", tiny_data, **both))
    assert "SLURM started 4 tasks (SLURM_NTASKS) but the plan runs 1 process(es)" in line


def test_eval_of_a_checkpoint_reproduces_the_reported_accuracy(tiny_data, tmp_path):
    train = run_cli([*TINY, "trainer.limit_train_batches=8"], tmp_path / "train", tiny_data)
    assert train.returncode == 0, train.stderr
    reported = json.loads((tmp_path / "train" / "results.json").read_text())
    evaluated = run_cli([*TINY, "mode=eval", f"ckpt_path={reported['best_checkpoint']}"], tmp_path / "eval", tiny_data)
    assert evaluated.returncode == 0, evaluated.stderr
    again = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert again["test/acc"] == pytest.approx(reported["test/acc"], abs=1e-6)
    # It trained nothing: no training speed of its own (not the checkpoint's run's either).
    assert reported["train_samples_per_second"] and "train_samples_per_second" not in again
    assert again["samples_per_second"] is None


@pytest.mark.slow
def test_same_seed_same_numbers(tiny_data, tmp_path):
    accs = []
    for name in ("a", "b"):
        result = run_cli([*TINY, "model=cnn", "seed=7"], tmp_path / name, tiny_data)
        assert result.returncode == 0, result.stderr
        accs.append(json.loads((tmp_path / name / "results.json").read_text())["metrics"])
    assert accs[0] == accs[1]


def one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_missing_data_offline_is_one_clear_line(tmp_path):
    empty = tmp_path / "empty"
    # A proxy nobody listens on makes the download fail at once, internet or not.
    offline = {
        "http_proxy": "http://127.0.0.1:9",
        "https_proxy": "http://127.0.0.1:9",
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "HTTP_PROXY": "http://127.0.0.1:9",
    }
    line = one_error_line(run_cli(TINY, tmp_path / "run", empty, **offline))
    assert str(empty / "MNIST" / "raw") in line
    assert "DATA_DIR" in line and "internet" in line
    assert not (tmp_path / "run").exists()  # a refused run leaves no run dir behind


def test_corrupt_file_is_one_clear_line(fresh_data, tmp_path):
    path = fresh_data / "MNIST" / "raw" / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:1000])
    line = one_error_line(run_cli(TINY, tmp_path / "run", fresh_data))
    assert "train-images-idx3-ubyte" in line and "truncated" in line


def test_gpu_profile_refused_here_and_no_run_dir_left(tiny_data, tmp_path):
    run = tmp_path / "run"
    line = one_error_line(run_cli([*TINY, "hardware=4gpu", "precision=bf16-mixed"], run, tiny_data))
    assert "4 GPU(s)" in line and "hardware=auto" in line
    assert not run.exists()


def test_plan_flag_plans_for_a_cluster_from_here(tmp_path):
    run = tmp_path / "run"
    result = run_cli(["hardware=8gpu", "batch.global_size=512", "batch.max_per_device=32", "plan=true"], run)
    assert result.returncode == 0, result.stderr
    assert "per_device_size" in result.stdout and "nccl" in result.stdout
    assert re.search(r"accumulation\s+│\s+2", result.stdout), result.stdout
    assert not run.exists()


def test_bad_batch_is_refused(tiny_data, tmp_path):
    line = one_error_line(run_cli([*TINY, "batch.global_size=0"], tmp_path / "run", tiny_data))
    assert "batch.global_size=0" in line


@pytest.mark.slow
@pytest.mark.parametrize("objective", [[], ["objective.metric=val/loss", "objective.direction=min"]])
def test_a_run_returns_its_best_validation_value_never_a_test_metric(objective, tiny_data, tmp_path):
    """What a Hydra sweeper receives from `main`: the run's best `objective.metric` over its validations."""
    run = tmp_path / "run"
    overrides = [*TINY, "trainer.max_epochs=3", *objective, f"paths.output_dir={run}", "paths.root_dir=."]
    code = (
        "import sys\n"
        "from hydralight.config.compose import Invocation, compose_jobs\n"
        "from hydralight.config.resolve import JobInfo, resolve\n"
        "from hydralight.train import CONFIG_DIR, run\n"
        "from hydralight.training.machine import detect\n"
        "(cfg,) = compose_jobs(CONFIG_DIR, 'train', Invocation(tuple(sys.argv[1:])))\n"
        "machine = detect()\n"
        "print('returned', run(resolve(cfg, machine, JobInfo(run_dir=cfg.paths.output_dir)), machine))"
    )
    script = tmp_path / "returned.py"
    script.write_text(code)
    result = run_python([sys.executable, str(script), *overrides], {**os.environ, "DATA_DIR": str(tiny_data)})
    assert result.returncode == 0, result.stderr[-3000:]
    returned = float(result.stdout.split("returned ")[-1])
    metric, pick = ("val/loss", min) if objective else ("val/acc", max)
    validated = [float(row[metric]) for row in csv_rows(run) if metric in row]
    assert len(validated) == 3 and returned == pytest.approx(pick(validated))
    results = json.loads((run / "results.json").read_text())
    direction = "min" if objective else "max"
    assert results["objective"] == {"metric": metric, "direction": direction, "value": pytest.approx(returned)}


@pytest.mark.parametrize("debug", ["fast_dev_run", "overfit", "profiler"])
def test_debug_presets_run(tiny_data, tmp_path, debug):
    run = tmp_path / "run"
    extra = ["trainer.max_epochs=2"] if debug == "overfit" else []
    result = run_cli([*TINY, f"debug={debug}", *extra], run, tiny_data)
    assert result.returncode == 0, result.stderr
    if debug == "profiler":
        assert any((run / "profiler").iterdir())
    if debug == "fast_dev_run":
        # A smoke test saves nothing a later run would continue from: the real run in the same dir trains whole.
        assert not list(run.rglob("*.ckpt"))
        real = run_cli(TINY, run, tiny_data)
        assert real.returncode == 0, real.stderr[-2000:]
        assert json.loads((run / "results.json").read_text())["global_step"] == 4


@pytest.mark.parametrize("logger", ["tensorboard", "none"])
def test_loggers_run(tiny_data, tmp_path, logger):
    run = tmp_path / "run"
    result = run_cli([*TINY, f"logger={logger}"], run, tiny_data)
    assert result.returncode == 0, result.stderr
    if logger == "tensorboard":
        (training,) = (run / "tensorboard").iterdir()  # a folder per training of the run dir
        assert list(training.glob("events.out.tfevents.*"))
        # The same run continued (a larger budget) logs into the same folder.
        assert run_cli([*TINY, "logger=tensorboard", "trainer.max_epochs=2"], run, tiny_data).returncode == 0
        assert list((run / "tensorboard").iterdir()) == [training]


@pytest.mark.slow
def test_wandb_logger_runs_offline_without_a_key(tiny_data, tmp_path):
    run = tmp_path / "run"
    result = run_cli([*TINY, "logger=wandb"], run, tiny_data, WANDB_SILENT="true", HOME=str(tmp_path))
    assert result.returncode == 0, result.stderr
    runs = list((run / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    assert list(runs[0].glob("*.wandb"))


def test_classic_loader_trains(tiny_data, tmp_path):
    result = run_cli([*TINY, "data.loader=torchvision"], tmp_path / "run", tiny_data)
    assert result.returncode == 0, result.stderr


def test_the_run_dir_log_holds_what_the_console_showed(tiny_data, tmp_path):
    run = tmp_path / "run"
    result = run_cli([*TINY, "trainer.max_steps=3"], run, tiny_data)
    assert result.returncode == 0, result.stderr[-2000:]
    shown = [line for line in result.stdout.splitlines() if line.startswith(("plan:", "run dir:", "epoch ", "test/"))]
    logged = (run / "train.log").read_text()
    assert len(shown) >= 4 and all(f"[INFO] - {line}" in logged for line in shown), (shown, logged)
