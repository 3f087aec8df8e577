"""Interruptions lose nothing; every bad input ends in one clear line, a non-zero exit, nothing overwritten."""

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import HELPERS, ROOT, TINY, one_line, popen, run_cli, write_idx

LONG = [*TINY, "model=cnn", "trainer.limit_train_batches=null", "trainer.max_epochs=3", "seed=9",
        "callbacks.last_checkpoint.every_n_steps=4"]  # fmt: skip


def start(args: list[str], run: Path, data: Path) -> subprocess.Popen:
    env = {**os.environ, "DATA_DIR": str(data), "PYTHONPATH": str(HELPERS)}
    command = [sys.executable, str(ROOT / "train.py"), *args, f"hydra.run.dir={run}"]
    return popen(command, env)  # its own process group: a kill -9 takes every rank at once, as a lost node would


def weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[0][-2000:]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("devices", [1, 2])
def test_sigkill_then_resume_ends_exactly_like_an_uninterrupted_run(devices, tiny_data, tmp_path):
    # The default model's dropout and a shifting augmentation: both keyed by sample, so redone steps draw alike.
    args = [*LONG, f"hardware.devices={devices}", "data.max_shift=2"]
    plain, killed = tmp_path / "plain", tmp_path / "killed"
    assert run_cli(args, plain, tiny_data).returncode == 0
    slow = ["+callbacks.slow._target_=slow.SlowSteps", "+callbacks.slow.seconds=0.1"]
    proc = start([*args, *slow], killed, tiny_data)
    wait_for(killed / "checkpoints" / "last.ckpt", proc)
    time.sleep(1.0)  # a few steps past the checkpoint: those are lost and must be redone identically
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    step_at_kill = torch.load(killed / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    assert 0 < step_at_kill < 45
    resumed = run_cli(args, killed, tiny_data)  # same command, same dir: resume=auto
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "continuing from this run's own" in resumed.stdout + resumed.stderr
    a, b = weights(plain), weights(killed)
    assert all(torch.equal(a[k], b[k]) for k in a), "weights differ after resume"
    ra, rb = (json.loads((r / "results.json").read_text()) for r in (plain, killed))
    assert (ra["global_step"], ra["test/acc"]) == (rb["global_step"], rb["test/acc"]) == (45, ra["test/acc"])


@pytest.mark.slow
def test_sigterm_saves_and_exits_promptly(tiny_data, tmp_path):
    run = tmp_path / "run"
    slow = [
        "+callbacks.slow._target_=slow.SlowSteps",
        "+callbacks.slow.seconds=0.1",
        "callbacks.last_checkpoint.every_n_steps=null",
    ]
    proc = start([*LONG, *slow], run, tiny_data)
    wait_for(run / "ranks" / "rank0.json", proc)
    time.sleep(1.0)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=60)[0]
    assert time.monotonic() - sent < 15
    assert proc.returncode == 128 + signal.SIGTERM, output[-2000:]
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] > 0
    assert json.loads((run / "manifest.json").read_text())["status"] == "interrupted"


def test_nan_loss_stops_with_the_step_named(tiny_data, tmp_path):
    result = run_cli([*TINY, "optim=sgd", "optim.lr=1e12", "optim.lr_scaling=none", "trainer.max_epochs=3",
                      "trainer.limit_train_batches=null"], tmp_path / "run", tiny_data)  # fmt: skip
    line = one_line(result)
    assert "the loss is nan" in line or "the loss is inf" in line
    assert "at step" in line and "optim.lr" in line


def test_nan_loss_beside_an_unreadable_older_checkpoint_says_why_the_run_stopped(tiny_data, tmp_path):
    from hydralight.rundir.ownership import Claim

    run = Claim.take(tmp_path / "run").path  # a run dir of this project, whose last.ckpt got damaged
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(b"PK\x03\x04 not really a checkpoint")
    result = run_cli([*TINY, "optim=sgd", "optim.lr=1e12", "optim.lr_scaling=none", "resume=never",
                      "trainer.limit_train_batches=null"], run, tiny_data)  # fmt: skip
    line = one_line(result)
    assert line.startswith("error: the loss is") and "cannot be read" in line, line
    assert (run / "checkpoints" / "last.ckpt").read_bytes().startswith(b"PK\x03\x04 not really")  # left as it was


def test_labels_outside_0_to_9(fresh_data, tmp_path):
    write_idx(fresh_data / "MNIST" / "raw" / "train-labels-idx1-ubyte", np.full(600, 12))
    assert "label 12 outside 0-9" in one_line(run_cli(TINY, tmp_path / "run", fresh_data))


def test_wrong_magic_number(fresh_data, tmp_path):
    path = fresh_data / "MNIST" / "raw" / "t10k-images-idx3-ubyte"
    path.write_bytes(b"\x00\x00\x09\x99" + path.read_bytes()[4:])
    assert "t10k-images-idx3-ubyte is not an MNIST IDX file" in one_line(run_cli(TINY, tmp_path / "run", fresh_data))


@pytest.mark.parametrize("override", ["model=nope", "hardware=nope", "strategy=nope", "precision=nope"])
def test_unknown_option_lists_the_choices(tiny_data, tmp_path, override):
    line = one_line(run_cli([*TINY, override], tmp_path / "run", tiny_data))
    group = override.split("=")[0]
    assert f"{override} is not an option of {group}; use one of " in line and "schema" not in line


def test_learning_rate_must_be_positive(tiny_data, tmp_path):
    assert "optim.lr=-0.1 must be a positive number" in one_line(
        run_cli([*TINY, "optim.lr=-0.1"], tmp_path / "run", tiny_data)
    )


def test_checkpoint_that_does_not_exist(tiny_data, tmp_path):
    line = one_line(run_cli([*TINY, "mode=eval", f"ckpt_path={tmp_path / 'nope.ckpt'}"], tmp_path / "run", tiny_data))
    assert "nope.ckpt does not exist" in line


def test_file_that_is_not_a_checkpoint(tiny_data, tmp_path):
    junk = tmp_path / "junk.ckpt"
    junk.write_bytes(os.urandom(2048))
    assert "is not a checkpoint of this project" in one_line(
        run_cli([*TINY, "mode=eval", f"ckpt_path={junk}"], tmp_path / "run", tiny_data)
    )


class Payload:
    """Unpickling this would run a command that leaves a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_checkpoint_runs_no_code(tiny_data, tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.ckpt"
    with evil.open("wb") as f:
        pickle.dump({"state_dict": Payload(marker), "hyper_parameters": {}}, f)
    for mode in ("eval", "train"):
        result = run_cli([*TINY, f"mode={mode}", f"ckpt_path={evil}"], tmp_path / f"run-{mode}", tiny_data)
        assert "is not a checkpoint of this project" in one_line(result)
    # Written by torch.save: torch's own refusal advised loading it with weights_only=False; not repeated.
    zipped = tmp_path / "zipped.ckpt"
    torch.save({"state_dict": Payload(marker), "hyper_parameters": {}}, zipped)
    line = one_line(run_cli([*TINY, "mode=eval", f"ckpt_path={zipped}"], tmp_path / "run-zipped", tiny_data))
    assert "holds pickled objects other than tensors" in line and "weights_only" not in line, line
    assert not marker.exists()


def test_checkpoint_of_another_architecture(tiny_data, tmp_path):
    mlp = tmp_path / "mlp"
    assert run_cli(TINY, mlp, tiny_data).returncode == 0
    line = one_line(
        run_cli([*TINY, "model=cnn", f"ckpt_path={mlp / 'checkpoints' / 'last.ckpt'}"], tmp_path / "cnn", tiny_data)
    )
    assert "holds another model (MLP(" in line and "SeedCNN(" in line


@pytest.mark.slow
def test_resume_a_run_by_its_dir_and_refuse_another_experiment(tiny_data, tmp_path):
    first = tmp_path / "first"
    assert run_cli([*TINY, "optim.lr=0.003"], first, tiny_data).returncode == 0
    before = (first / "results.json").read_text()
    # Continue it for one more epoch, without retyping its overrides.
    env_run = run_cli(["resume=" + str(first), "trainer.max_epochs=2"], tmp_path / "unused", tiny_data)
    assert env_run.returncode == 0, env_run.stderr[-2000:]
    after = json.loads((first / "results.json").read_text())
    assert after["epochs"] == 2 and after["global_step"] == 8 and before != json.dumps(after)
    assert json.loads((first / "manifest.json").read_text())["plan"]["task"]["lr"] == 0.003
    line = one_line(run_cli(["resume=" + str(first), "optim.lr=0.1", "model=cnn"], tmp_path / "unused2", tiny_data))
    assert (
        "is a different experiment" in line
        and "optim.lr (run: 0.003, now: 0.1)" in line
        and "model (run: mlp, now: cnn)" in line
    ), line
    # A preset that sets other keys (experiment=...) is compared as the run chose it: it would be ignored.
    line = one_line(run_cli(["resume=" + str(first), "experiment=fast"], tmp_path / "unused3", tiny_data))
    assert "is a different experiment: experiment (run: None, now: fast)" in line, line
    # The run's own option, set otherwise: the keys that differ are named.
    line = one_line(
        run_cli(["resume=" + str(first), "model=mlp", "model.net.hidden=[8]"], tmp_path / "unused4", tiny_data)
    )
    assert "is a different experiment: model.net.hidden (run: " in line and "now: [8])" in line, line
    # What it runs on is no other experiment: it continues on 2 processes accumulating, the same global batches
    # (the run's own dir continued so already), and the record says what it ran on last.
    layout = ["hardware=cpu", "hardware.devices=2", "strategy=ddp", "batch.max_per_device=4"]
    moved = run_cli([f"resume={first}", "trainer.max_epochs=3", *layout], tmp_path / "unused5", tiny_data)
    assert moved.returncode == 0, moved.stderr[-2000:]
    plan = json.loads((first / "manifest.json").read_text())["plan"]
    assert plan["hardware"]["world_size"] == 2 and plan["task"]["accumulation"] == 4 and plan["task"]["lr"] == 0.003
    assert json.loads((first / "results.json").read_text())["global_step"] == 12


def test_resume_given_a_checkpoint_file_names_ckpt_path(tiny_data, tmp_path):
    checkpoint = tmp_path / "last.ckpt"
    checkpoint.write_bytes(b"not read")
    line = one_line(run_cli([*TINY, f"resume={checkpoint}"], tmp_path / "run", tiny_data))
    assert f"resume={checkpoint} is a file" in line and f"give ckpt_path={checkpoint}" in line, line
    assert checkpoint.read_bytes() == b"not read" and not (tmp_path / "run").exists()


def test_output_dir_that_cannot_be_written(tiny_data, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    line = one_line(run_cli(TINY, blocker / "run", tiny_data))
    assert "cannot write run outputs to" in line and str(blocker) in line and "set hydra.run.dir=" in line
    # A sweep's: the key that names it.
    line = one_line(run_cli(["-m", *TINY, "seed=1,2", f"hydra.sweep.dir={blocker}"], tmp_path, tiny_data))
    assert f"cannot write run outputs to {blocker}" in line and line.endswith("set hydra.sweep.dir=..."), line
    assert blocker.read_text() == "not a folder"


def test_a_finished_run_is_never_overwritten(tiny_data, tmp_path):
    run = tmp_path / "run"
    assert run_cli(TINY, run, tiny_data).returncode == 0
    first = weights(run)
    again = run_cli(TINY, run, tiny_data)  # same dir: continues (nothing left to train), never restarts
    assert again.returncode == 0
    second = weights(run)
    assert all(torch.equal(first[k], second[k]) for k in first)


@pytest.mark.slow
def test_four_jobs_preparing_one_data_dir_at_once(tiny_data, tmp_path):
    """Only one downloads; the others wait on the lock and never read a half-written file."""
    shared, count = tmp_path / "shared", tmp_path / "downloads.txt"
    env = {**os.environ, "PYTHONPATH": str(HELPERS)}
    command = [sys.executable, str(HELPERS / "slow_download.py"), str(shared), str(tiny_data), str(count)]
    procs = [popen(command, env, merged=False) for _ in range(4)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err[-1500:] for _, err in outputs]
    assert [out.strip() for out, _ in outputs] == ["500"] * 4
    assert count.read_text().count("download") == 1
    for src in (tiny_data / "MNIST" / "raw").iterdir():
        assert (shared / "MNIST" / "raw" / src.name).read_bytes() == src.read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("step", [7, 15])  # mid-epoch, and the last batch of the first epoch
def test_interrupt_at_any_step_then_resume_takes_every_step_once(tiny_data, tmp_path, step):
    plain, cut = tmp_path / "plain", tmp_path / "cut"
    base = [*TINY, "trainer.limit_train_batches=null", "trainer.max_epochs=3", "seed=2"]
    assert run_cli(base, plain, tiny_data).returncode == 0
    signal_at = ["+callbacks.zz_signal._target_=signal_at.SignalAt", f"+callbacks.zz_signal.step={step}"]
    first = run_cli([*base, *signal_at], cut, tiny_data, PYTHONPATH=str(HELPERS))
    assert first.returncode == 128 + signal.SIGTERM, first.stderr[-2000:]
    second = run_cli(base, cut, tiny_data)
    assert second.returncode == 0, second.stderr[-2000:]
    assert json.loads((cut / "results.json").read_text())["global_step"] == 45
    a, b = weights(plain), weights(cut)
    assert all(torch.equal(a[k], b[k]) for k in a)
    # The history of both attempts is the uninterrupted run's, row for row.
    assert (cut / "csv" / "metrics.csv").read_bytes() == (plain / "csv" / "metrics.csv").read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("during", ["train", "validation"])  # after the last step, in the final validation
def test_a_run_stopped_as_its_training_ends_then_continued_reports_the_training_s_final_values(
    tiny_data, tmp_path, during
):
    """The continuing attempt trains no step and only tests: its results.json held the test's values alone (the
    final train and validation values, the objective's among them, were gone)."""
    plain, cut = tmp_path / "plain", tmp_path / "cut"
    base = [*TINY, "trainer.limit_train_batches=null", "trainer.max_epochs=3", "seed=2"]
    assert run_cli(base, plain, tiny_data).returncode == 0
    signal_at = ["+callbacks.zz_signal._target_=signal_at.SignalAt", "+callbacks.zz_signal.step=45",
                 f"+callbacks.zz_signal.during={during}"]  # fmt: skip
    first = run_cli([*base, *signal_at], cut, tiny_data, PYTHONPATH=str(HELPERS))
    assert first.returncode == 128 + signal.SIGTERM, first.stderr[-2000:]
    second = run_cli(base, cut, tiny_data)
    assert second.returncode == 0, second.stderr[-2000:]
    ended, expected = (json.loads((run / "results.json").read_text()) for run in (cut, plain))
    assert ended["metrics"] == expected["metrics"] and {"val/acc", "train/loss_epoch"} <= set(ended["metrics"])
    assert ended["objective"] == expected["objective"] and ended["epochs"] == expected["epochs"]
    assert (cut / "csv" / "metrics.csv").read_bytes() == (plain / "csv" / "metrics.csv").read_bytes()


def test_an_evaluation_of_a_run_whose_checkpoints_lead_elsewhere_is_refused(tiny_data, tmp_path):
    """A run dir whose checkpoints/ was swapped for a link to another run's: `mode=eval resume=RUN` tested the
    other run's weights and named them as this run's."""
    mine, other = tmp_path / "mine", tmp_path / "other"
    for run in (mine, other):
        assert run_cli(TINY, run, tiny_data).returncode == 0
    import shutil

    shutil.rmtree(mine / "checkpoints")
    (mine / "checkpoints").symlink_to(other / "checkpoints")
    for mode in ("eval", "predict"):
        line = one_line(run_cli([f"mode={mode}", f"resume={mine}"], tmp_path / f"{mode}-out", tiny_data))
        assert "leads out of the run dir" in line and "ckpt_path=FILE" in line, line
        assert not (tmp_path / f"{mode}-out").exists()
