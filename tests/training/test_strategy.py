"""The ranks of a `strategy=ddp` job stop together while they start: a signal to the launching rank (rank 0)
stops the ranks it started, and a rank whose launcher is gone stops by itself."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, TINY, popen

# Every rank of the run, whatever it is doing, ends within this long after the signal.
BOUND_S = 30


def session_processes(session: int) -> dict[int, str]:
    """pid -> command line of the live processes of a session (a run started with its own session)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
            state, sid = fields[0], int(fields[3])
            if sid == session and state != "Z":
                found[int(entry)] = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return found


def until(condition, timeout: float, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(every)
    return None


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="reads the processes of a session from /proc")
@pytest.mark.parametrize(
    "signum,after_s",
    [
        (signal.SIGTERM, 0.0),  # as soon as rank 1 exists: it is importing torch
        (signal.SIGTERM, 3.0),  # later: rank 1 importing or building, rank 0 waiting at the rendezvous
        (signal.SIGINT, 1.5),  # Ctrl-C, to rank 0 alone
        (signal.SIGKILL, 1.5),  # rank 0 gone without a word: rank 1 notices by itself
    ],
)
def test_ranks_stop_with_their_launcher_at_any_moment_of_start_up(tiny_data, tmp_path, signum, after_s):
    # Real interpreters, not forks of the suite's warm one: the ranks must import torch as a user's do.
    env = {**os.environ, "DATA_DIR": str(tiny_data), "HYDRALIGHT_TESTS_FRESH": "1"}
    args = [*TINY, "hardware.devices=2", "strategy=ddp", f"hydra.run.dir={tmp_path / 'run'}"]
    run = popen([sys.executable, str(ROOT / "train.py"), *args], env)
    try:
        rank1 = until(lambda: [p for p, cmd in session_processes(run.pid).items() if "hydralight.worker" in cmd], 300)
        assert rank1, "rank 1 never started"
        time.sleep(after_s)
        assert run.poll() is None, "the run ended before the signal; its start-up is too quick for this test"
        os.kill(run.pid, signum)
        sent = time.monotonic()
        left = until(lambda: not session_processes(run.pid) and [True], BOUND_S, every=0.2)
        output, _ = run.communicate(timeout=10)
        assert left, f"still running {BOUND_S}s after {signum.name}: {session_processes(run.pid)}\n{output[-3000:]}"
        assert run.returncode != 0, output[-3000:]
        assert time.monotonic() - sent < BOUND_S
        assert "test/acc" not in output  # stopped, not finished
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            run.communicate(timeout=10)


def test_a_job_gives_the_next_job_of_a_sweep_the_threads_it_found():
    """Lightning holds each rank of a DDP job to its share of the cores (torch.set_num_threads); the next job of
    the sweep, in the same process, gets them all back."""
    import torch

    from hydralight.training.strategy import job_scope

    found = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        with job_scope():
            torch.set_num_threads(1)  # as Lightning's launcher does for 2 ranks on 2 cores
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(found)
