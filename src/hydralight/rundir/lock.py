"""One live process per run dir: a second run started on a dir in use is refused, a dead holder is detected.

The lock is a small file (`<run dir>/.lock`: host, pid, start time) created exclusively, whose
modification time a background thread refreshes every few seconds. A holder is dead when its pid is
gone on this host, or when its heartbeat is older than `STALE_AFTER_S` (another host, or a pid reused).
Written by hand because file locks (flock) are not reliable across the network filesystems that
clusters share run dirs on, and say nothing about who holds them.

It runs before Hydra composes anything: no torch imports.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType

from hydralight.errors import UserError
from hydralight.rundir.layout import LOCK, RunDir

log = logging.getLogger(__name__)

HEARTBEAT_S = 5.0
STALE_AFTER_S = 60.0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


class RunDirLock:
    """Context manager holding `<run_dir>/.lock` for as long as a run uses the dir."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.path = RunDir(self.run_dir).lock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._owner = False

    def __enter__(self) -> RunDirLock:
        self.acquire()
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.release()

    def acquire(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(5):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._take_over_if_stale()
                continue
            holder = {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            }
            with os.fdopen(fd, "w") as f:
                json.dump(holder, f)
            self._owner = True
            self._thread = threading.Thread(target=self._beat, name="run-dir-heartbeat", daemon=True)
            self._thread.start()
            return
        raise UserError(f"could not lock run dir {self.run_dir}: its lock file keeps changing; retry in a minute")

    def _take_over_if_stale(self) -> None:
        try:
            text = self.path.read_text()
            age = time.time() - self.path.stat().st_mtime
        except FileNotFoundError:
            return  # released meanwhile: try again
        try:
            holder = json.loads(text)
            host, pid = str(holder["host"]), int(holder["pid"])
        except (ValueError, KeyError, TypeError):
            if age < HEARTBEAT_S:  # being written right now
                time.sleep(0.2)
                return
            holder, host, pid = {}, "?", -1
        if host == socket.gethostname() and pid > 0 and not _pid_alive(pid):
            dead = f"pid {pid} on this host is gone"
        else:
            # A live pid without a heartbeat is another process that was given the holder's pid after it died.
            dead = None if age < STALE_AFTER_S else f"no heartbeat from {host} pid {pid} for {age:.0f}s"
        if dead is None:
            raise UserError(
                f"run dir {self.run_dir} is in use by pid {pid} on {host} (since {holder.get('started_at', '?')}); "
                "wait for that run to end or stop it, or give this run another hydra.run.dir"
            )
        log.warning(f"run dir {self.run_dir}: taking over a stale lock ({dead})")
        stale = self.path.with_name(f"{LOCK}.stale.{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            os.rename(self.path, stale)  # atomic: of two newcomers, one wins the rename
            stale.unlink()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def release(self) -> None:
        if not self._owner:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=HEARTBEAT_S)
        self._owner = False
        with contextlib.suppress(FileNotFoundError, ValueError):
            if json.loads(self.path.read_text() or "{}").get("pid") == os.getpid():
                self.path.unlink()
