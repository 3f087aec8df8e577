"""The ranks a launching process starts early: started for a multi-process job of this node only, stopped
when the job ends without needing them, and quiet when told nothing."""

import os
import subprocess
import sys

import pytest

from hydralight.rundir.launch import EARLY_RANKS, LAUNCHER_PID, early_ranks


@pytest.fixture
def clean_env(monkeypatch):
    for name in (LAUNCHER_PID, "RANK", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("strategy", "devices", "nodes", "env", "started"),
    [
        ("ddp", 3, 1, {}, 2),
        ("fsdp", 2, 1, {}, 1),
        ("ddp_spawn", 2, 1, {}, 0),  # its workers are spawned by torch
        ("auto", 1, 1, {}, 0),
        ("ddp", 2, 2, {}, 0),  # several nodes: their launcher starts the ranks
        ("ddp", 2, 1, {"TORCHELASTIC_RUN_ID": "x"}, 0),  # torchrun started them
        ("ddp", 2, 1, {LAUNCHER_PID: "1"}, 0),  # a rank itself
    ],
)
def test_ranks_start_early_only_for_a_job_that_starts_them_itself(
    clean_env, monkeypatch, strategy, devices, nodes, env, started
):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with early_ranks(strategy, devices, nodes):
        children = list(EARLY_RANKS)
        assert len(children) == started
        assert all(c.args[-2:] == ["hydralight.worker", "-"] for c in children)
    # Never told what to run: stopped with the job, none left behind.
    assert EARLY_RANKS == [] and all(c.poll() is not None for c in children)


def test_an_early_rank_told_nothing_ends_quietly(clean_env):
    child = subprocess.Popen(
        [sys.executable, "-m", "hydralight.worker", "-"],
        env={**os.environ, LAUNCHER_PID: str(os.getpid()), "LOCAL_RANK": "1"},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    out, err = child.communicate("", timeout=120)
    assert child.returncode == 0 and out == "" and err == ""


@pytest.mark.parametrize(
    ("env", "resume", "mode", "named"),
    [
        ({}, "auto", "train", None),  # a new dated folder
        ({}, "outputs/a", "train", "outputs/a"),  # continued in its own dir
        ({}, "outputs/a", "predict", None),  # reads its checkpoint, writes a dir of its own
        ({"TORCHELASTIC_RUN_ID": "r1", "MASTER_PORT": "29500"}, "auto", "train", "outputs/torchrun-r1"),  # --rdzv-id
        ({"TORCHELASTIC_RUN_ID": "none", "MASTER_PORT": "29500"}, "auto", "train", "outputs/torchrun-none-29500"),
        ({"SLURM_NTASKS": "2", "SLURM_JOB_ID": "77"}, "never", "train", "outputs/slurm-77"),
        ({"SLURM_NTASKS": "2", "SLURM_JOB_ID": "77"}, "outputs/a", "train", "outputs/a"),
    ],
)
def test_the_run_dir_a_launch_names_every_rank_resolves_alike(clean_env, monkeypatch, env, resume, mode, named):
    """conf/hydra/default.yaml's run dir, as Hydra resolves it in every process of a launch."""
    from omegaconf import OmegaConf

    from hydralight.config.schema import Mode
    from hydralight.rundir.launch import launch_run_dir, register_resolvers

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert launch_run_dir(resume, Mode[mode]) == named
    register_resolvers()
    cfg = OmegaConf.create({"resume": resume, "mode": mode, "dir": "${hydralight.run_dir:${resume},${mode},'dated'}"})
    assert cfg.dir == (named or "dated")


def test_hydras_record_and_log_come_from_rank_zero_and_never_over_a_continued_runs(clean_env, monkeypatch, tmp_path):
    import logging

    from hydralight.rundir.launch import log_handler, record_subdir

    earlier = tmp_path / "run"
    assert record_subdir("auto", "train", str(earlier)) == ".hydra"
    assert record_subdir(str(earlier), "train", str(earlier)) is None  # its first record stays
    assert record_subdir(str(earlier), "train", str(tmp_path / "elsewhere")) == ".hydra"  # hydra.run.dir given
    assert type(log_handler("file", filename=str(tmp_path / "train.log"))) is logging.FileHandler
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "r1")
    monkeypatch.setenv("RANK", "1")
    assert record_subdir("auto", "train", str(earlier)) is None
    assert type(log_handler("file", filename=str(tmp_path / "rank1.log"))) is logging.NullHandler
    console = log_handler("console")
    assert console.level == logging.WARNING and console.stream is sys.stderr
    assert not (tmp_path / "rank1.log").exists()
