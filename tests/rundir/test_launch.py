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
