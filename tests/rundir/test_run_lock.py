"""One live run per run dir: a second process is refused at once, a dead holder does not block forever."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import HELPERS, ROOT, TINY, one_line, popen, run_cli

from hydralight.errors import UserError
from hydralight.rundir import lock as run_lock
from hydralight.rundir.lock import RunDirLock

SLOW = [*TINY, "trainer.limit_train_batches=null", "trainer.max_epochs=3", "+callbacks.slow._target_=slow.SlowSteps",
        "+callbacks.slow.seconds=0.2"]  # fmt: skip


def start(args: list[str], run: Path, data: Path) -> subprocess.Popen:
    env = {**os.environ, "DATA_DIR": str(data), "PYTHONPATH": str(HELPERS)}
    command = [sys.executable, str(ROOT / "train.py"), *args, f"hydra.run.dir={run}"]
    return popen(command, env)


def snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}


@pytest.mark.slow
def test_a_second_run_on_a_live_dir_is_refused_and_the_live_run_untouched(tiny_data, tmp_path):
    run = tmp_path / "run"
    live = start(SLOW, run, tiny_data)
    try:
        deadline = time.monotonic() + 120
        while not (run / "ranks" / "rank0.json").exists():
            assert live.poll() is None and time.monotonic() < deadline, "the first run never started"
            time.sleep(0.1)
        before = snapshot(run)
        began = time.monotonic()
        second = run_cli([*TINY, "optim.lr=0.5"], run, tiny_data)
        assert time.monotonic() - began < 30
        line = one_line(second)
        assert f"pid {live.pid} on" in line and "is in use" in line
        after = snapshot(run)
        # Only what the live run itself went on writing changed; the second run wrote nothing.
        assert after[".hydra/overrides.yaml"] == before[".hydra/overrides.yaml"]
        assert after["config.yaml"] == before["config.yaml"] and b"0.5" not in after["config.yaml"]
    finally:
        live.send_signal(signal.SIGKILL)
        live.wait(timeout=30)


@pytest.mark.slow
def test_a_lock_left_by_a_killed_run_is_taken_over(tiny_data, tmp_path):
    run = tmp_path / "run"
    live = start(SLOW, run, tiny_data)
    deadline = time.monotonic() + 120
    while not (run / "ranks" / "rank0.json").exists():
        assert live.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    live.send_signal(signal.SIGKILL)
    live.wait(timeout=30)
    assert json.loads((run / ".lock").read_text())["pid"] == live.pid
    again = run_cli([*SLOW[:-2], "trainer.max_epochs=1"], run, tiny_data)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"taking over a stale lock (pid {live.pid} on this host is gone)" in again.stderr
    assert not (run / ".lock").exists()


def test_lock_from_another_host_is_stale_only_without_heartbeat(tmp_path, monkeypatch):
    lock = tmp_path / ".lock"
    lock.write_text(json.dumps({"host": "node-elsewhere", "pid": 12345, "started_at": "earlier"}))
    with pytest.raises(UserError, match="in use by pid 12345 on node-elsewhere"), RunDirLock(tmp_path):
        pass
    old = time.time() - run_lock.STALE_AFTER_S - 5
    os.utime(lock, (old, old))
    with RunDirLock(tmp_path):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert not lock.exists()


def test_a_pid_given_to_another_process_does_not_hold_the_lock_once_its_heartbeat_is_old(tmp_path):
    # The holder died and its pid now belongs to a live process (here: this one, which never beats for it).
    import socket

    lock = tmp_path / ".lock"
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getppid(), "started_at": "earlier"}))
    with pytest.raises(UserError, match=f"in use by pid {os.getppid()}"), RunDirLock(tmp_path):
        pass  # a fresh heartbeat: a live holder
    old = time.time() - run_lock.STALE_AFTER_S - 5
    os.utime(lock, (old, old))
    with RunDirLock(tmp_path):
        assert json.loads(lock.read_text())["pid"] == os.getpid()


def test_heartbeat_keeps_the_lock_fresh(tmp_path, monkeypatch):
    monkeypatch.setattr(run_lock, "HEARTBEAT_S", 0.05)
    with RunDirLock(tmp_path):
        old = time.time() - 1000
        os.utime(tmp_path / ".lock", (old, old))
        time.sleep(0.3)
        assert time.time() - (tmp_path / ".lock").stat().st_mtime < 5


def test_a_run_dir_is_locked_once_a_second_lock_even_from_this_process_is_refused(tmp_path):
    # The entrypoint takes the lock in one place; a second taker in the same process would be a bug.
    with (
        RunDirLock(tmp_path),
        pytest.raises(UserError, match=f"in use by pid {os.getpid()}"),
        RunDirLock(tmp_path / "." / ""),
    ):
        pass
    assert not (tmp_path / ".lock").exists()
