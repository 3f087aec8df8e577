"""One live run per run dir: a second process is refused at once, a dead holder does not block forever."""

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from conftest import HELPERS, ROOT, TINY, one_line, popen, run_cli

from hydralight.errors import UserError
from hydralight.rundir import lock as run_lock
from hydralight.rundir.layout import LOCK
from hydralight.rundir.lock import RunDirLock

SLOW = [*TINY, "trainer.limit_train_batches=null", "trainer.max_epochs=3", "+callbacks.slow._target_=slow.SlowSteps",
        "+callbacks.slow.seconds=0.2"]  # fmt: skip
# A process that takes the run dir's lock and keeps it until it is killed.
HOLD = """
import sys, time
from hydralight.rundir.lock import RunDirLock
RunDirLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(600)
"""
# A process that takes the lock the moment a file appears, and keeps it a while if it gets it.
CONTEND = """
import os, sys, time
from pathlib import Path
from hydralight.errors import UserError
from hydralight.rundir.lock import RunDirLock
go = Path(sys.argv[2])
print("ready", flush=True)
while not go.exists():
    time.sleep(0.0005)
try:
    with RunDirLock(sys.argv[1]):
        print(f"held {os.getpid()}", flush=True)
        time.sleep(0.5)
except UserError as err:
    print(f"refused: {err}", flush=True)
"""


def start(args: list[str], run: Path, data: Path) -> subprocess.Popen:
    env = {**os.environ, "DATA_DIR": str(data), "PYTHONPATH": str(HELPERS)}
    command = [sys.executable, str(ROOT / "train.py"), *args, f"hydra.run.dir={run}"]
    return popen(command, env)


def snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != LOCK}


def marker(path: Path) -> dict[str, str]:
    """The fields of a lock file (`key=value` lines)."""
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def write_lease(path: Path, pid: int, host: str, started: str, duration: float | None = None) -> None:
    """A lock file as a run on another host writes it (filelock's lease record, and when the run took it)."""
    duration = run_lock.STALE_AFTER_S if duration is None else duration
    fields = {"pid": pid, "host": host, "mode": "lease", "token": "0" * 32, "duration": repr(duration),
              run_lock.STARTED: started}  # fmt: skip
    path.write_text("filelock/2\n" + "".join(f"{key}={value}\n" for key, value in fields.items()))


def age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def killed_holder(run: Path) -> int:
    """A lock left by a process killed while it held the dir: its pid."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert marker(run / LOCK)["pid"] == str(holder.pid)
    return holder.pid


@pytest.fixture()
def quick(monkeypatch):
    """A lease that lapses in a second, renewed several times within it."""
    monkeypatch.setattr(run_lock, "STALE_AFTER_S", 1.0)
    monkeypatch.setattr(run_lock, "HEARTBEAT_S", 0.3)


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
    assert marker(run / LOCK)["pid"] == str(live.pid)
    again = run_cli([*SLOW[:-2], "trainer.max_epochs=1"], run, tiny_data)
    assert again.returncode == 0, again.stderr[-2000:]
    assert (
        f"taking over a stale lock (the process that took it, pid {live.pid} on this host, has ended)" in again.stderr
    )
    assert not (run / LOCK).exists()


def test_the_refusal_names_the_holders_host_pid_and_start(tmp_path):
    began = datetime.now(UTC).replace(microsecond=0)
    with RunDirLock(tmp_path) as held:
        host = marker(held.path)["host"]
        with pytest.raises(UserError) as refused, RunDirLock(tmp_path):
            pass
    message = str(refused.value)
    assert f"run dir {tmp_path.resolve()} is in use by pid {os.getpid()} on {host} (since " in message
    since = datetime.fromisoformat(message.split("(since ")[1].split(")")[0])
    assert began <= since <= datetime.now(UTC)


def test_lock_from_another_host_is_taken_over_only_once_its_lease_lapsed(tmp_path, quick, caplog):
    lock = tmp_path / LOCK
    write_lease(lock, 12345, "node-elsewhere", "2024-05-01T10:00:00+00:00")
    began = time.monotonic()
    with pytest.raises(UserError, match=r"in use by pid 12345 on node-elsewhere \(since 2024-05-01T10:00:00"):
        RunDirLock(tmp_path).acquire()
    assert time.monotonic() - began < 0.5, "a fresh lease is refused at once"
    assert marker(lock)["pid"] == "12345"
    age(lock, run_lock.STALE_AFTER_S + 5)
    began = time.monotonic()
    with RunDirLock(tmp_path):
        assert marker(lock)["pid"] == str(os.getpid())
    # Taken over once this host watched the lease go unrenewed for a whole lease, not on the file's date alone.
    assert run_lock.STALE_AFTER_S <= time.monotonic() - began < run_lock.STALE_AFTER_S + 2 * run_lock.HEARTBEAT_S
    assert "taking over a stale lock (no lease renewal from pid 12345 on node-elsewhere for 1s)" in caplog.text
    assert not lock.exists()


def test_a_live_holder_on_another_host_is_not_taken_over_whatever_its_clock_says(tmp_path, quick):
    # The other host's clock is far behind: its lock file looks old, but changes at every renewal.
    lock = tmp_path / LOCK
    write_lease(lock, 12345, "node-elsewhere", "2024-05-01T10:00:00+00:00")
    stop = threading.Event()

    def renew() -> None:
        for beat in range(1, 1000):
            if stop.wait(run_lock.HEARTBEAT_S / 3):
                return
            age(lock, 1000 - beat)

    age(lock, 1000)
    renewing = threading.Thread(target=renew)
    renewing.start()
    began = time.monotonic()
    try:
        with pytest.raises(UserError, match="in use by pid 12345 on node-elsewhere"):
            RunDirLock(tmp_path).acquire()
    finally:
        stop.set()
        renewing.join()
    assert time.monotonic() - began >= run_lock.STALE_AFTER_S, "refused after watching it renew, not at once"
    assert marker(lock)["pid"] == "12345"


def test_an_unreadable_lock_file_is_refused_while_touched_and_taken_over_once_left(tmp_path, monkeypatch):
    # Long enough a lease for filelock's own wait on an unreadable lock file (2 s) to fit in the watch.
    monkeypatch.setattr(run_lock, "STALE_AFTER_S", 2.5)
    monkeypatch.setattr(run_lock, "HEARTBEAT_S", 0.3)
    lock = tmp_path / LOCK
    lock.write_text('{"host": "node-elsewhere", "pid": 12345}')  # what another lock implementation may leave
    with pytest.raises(UserError, match=f"locked by {lock}, which names no holder .*delete that file"):
        RunDirLock(tmp_path).acquire()
    age(lock, 600)
    with RunDirLock(tmp_path):
        assert marker(lock)["pid"] == str(os.getpid())
    assert not lock.exists()


def test_a_lease_of_another_length_is_refused_in_one_line(tmp_path):
    # Written by a version that renews on another schedule: neither side can judge the other's lease.
    lock = tmp_path / LOCK
    write_lease(lock, 12345, "node-elsewhere", "2024-05-01T10:00:00+00:00", duration=run_lock.STALE_AFTER_S / 2)
    with pytest.raises(UserError, match=f"locked by pid 12345 on node-elsewhere with a lease of .*delete {lock}"):
        RunDirLock(tmp_path).acquire()
    assert marker(lock)["pid"] == "12345"


@pytest.mark.slow
def test_a_pid_given_to_another_process_does_not_hold_the_lock(tmp_path, caplog):
    # The holder died and its pid now belongs to a live process: the start time recorded with it tells them apart.
    lock = tmp_path / LOCK
    killed_holder(tmp_path)
    lock.write_text(lock.read_text().replace(f"pid={marker(lock)['pid']}\n", f"pid={os.getppid()}\n"))
    began = time.monotonic()
    with RunDirLock(tmp_path):
        assert marker(lock)["pid"] == str(os.getpid())
    assert time.monotonic() - began < 1, "taken over at once, without waiting for the lease to lapse"
    assert f"(the process that took it, pid {os.getppid()} on this host, has ended)" in caplog.text


@pytest.mark.slow
def test_two_takeovers_of_a_stale_lock_at_once_leave_one_holder(tmp_path):
    # Several rounds: two newcomers that both read the dead lock before either replaced it are a matter of timing.
    for attempt in range(8):
        run = tmp_path / f"run{attempt}"
        dead = killed_holder(run)
        go = tmp_path / f"go{attempt}"
        contenders = [
            subprocess.Popen([sys.executable, "-c", CONTEND, str(run), str(go)], stdout=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        for contender in contenders:
            assert contender.stdout.readline().strip() == "ready"
        go.touch()
        said = sorted(contender.communicate(timeout=60)[0].strip() for contender in contenders)
        assert [line.split()[0] for line in said] == ["held", "refused:"], said
        winner = int(said[0].split()[1])
        assert winner != dead and f"in use by pid {winner} on " in said[1], said
        assert not (run / LOCK).exists()


def test_heartbeat_keeps_the_lock_fresh(tmp_path, monkeypatch):
    monkeypatch.setattr(run_lock, "HEARTBEAT_S", 0.05)
    with RunDirLock(tmp_path):
        age(tmp_path / LOCK, 1000)
        time.sleep(0.3)
        assert time.time() - (tmp_path / LOCK).stat().st_mtime < 5


def test_a_run_dir_is_locked_once_a_second_lock_even_from_this_process_is_refused(tmp_path):
    # The entrypoint takes the lock in one place; a second taker in the same process would be a bug.
    with (
        RunDirLock(tmp_path),
        pytest.raises(UserError, match=f"in use by pid {os.getpid()}"),
        RunDirLock(tmp_path / "." / ""),
    ):
        pass
    assert not (tmp_path / LOCK).exists()
