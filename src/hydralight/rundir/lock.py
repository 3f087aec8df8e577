"""One live process per run dir: a second run started on a dir in use is refused, a dead holder is taken over.

The lock is filelock's `SoftFileLease` on `<run dir>/.lock`: a marker file naming the holder (host, pid and
the process's start time, so that a pid given to another process is not taken for the holder), renewed by a
heartbeat thread. A marker lease rather than flock, because flock is not reliable across the network
filesystems that clusters share run dirs on, and says nothing about who holds it. A holder on this host is
taken over as soon as its process is gone; one on another host once its lease has gone unrenewed for
`STALE_AFTER_S`, watched on this host's clock. A live holder is never waited for: the run is refused at once.

It runs before Hydra composes anything: no torch imports.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import time
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType

from filelock import LeaseCompromise, LeaseSettingsMismatch, OwnerRecord, SoftFileLease, Timeout

from hydralight.errors import UserError
from hydralight.rundir.layout import RunDir

log = logging.getLogger(__name__)

HEARTBEAT_S = 5.0
# Every process that locks run dirs must use the same value: filelock refuses a lease of another duration.
STALE_AFTER_S = 60.0
# The marker line that says when the holder took the dir (filelock's record keeps no wall-clock time).
STARTED = "started"


class _Lease(SoftFileLease):
    """A `SoftFileLease` whose marker also says when its holder took it, for the refusal to name."""

    # filelock writes its record through this method, both when it creates the marker and when it takes one
    # over; tests/rundir/test_run_lock.py fails if the line stops reaching the marker.
    # (mypy: filelock's own marker lock already turns the base's static method into this instance method.)
    def _write_lock_info(self, fd: int) -> None:  # type: ignore[override]
        super()._write_lock_info(fd)
        started = datetime.now(UTC).isoformat(timespec="seconds")
        os.write(fd, f"{STARTED}={started}\n".encode())


class RunDirLock:
    """Context manager holding `<run_dir>/.lock` for as long as a run uses the dir."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.path = RunDir(self.run_dir).lock
        self._lease = _Lease(
            self.path,
            lease_duration=STALE_AFTER_S,
            heartbeat_interval=HEARTBEAT_S,
            on_compromise=self._lost,
            thread_local=False,  # taken and given back by whichever thread runs the entrypoint
        )

    def __enter__(self) -> RunDirLock:
        self.acquire()
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the dir, or raise `UserError` naming the live process that holds it."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        found = self._lease.owner
        try:
            if self._try(blocking=False):
                if found is not None and self._is_this_host(found):
                    self._taking_over(f"the process that took it, pid {found.pid} on this host, has ended")
                return
            # Held by a live process on this host, by one on another host, or by one whose lease has lapsed:
            # only the last is worth watching, and only for as long as the lease would need to lapse.
            with contextlib.suppress(FileNotFoundError):
                if abs(time.time() - self.path.stat().st_mtime) < STALE_AFTER_S:
                    raise self._in_use()
            silent, existed = self._lease.owner, self.path.exists()
            if existed:
                log.warning(
                    f"run dir {self.run_dir}: {self._holder(silent)} has not renewed its lock for a while; "
                    f"watching it for {STALE_AFTER_S:.0f}s before taking it over"
                )
            if not self._try(timeout=STALE_AFTER_S + 2 * HEARTBEAT_S, poll_interval=HEARTBEAT_S / 5):
                raise self._in_use()
            if existed:
                self._taking_over(
                    "a lock file naming no holder, left untouched"
                    if silent is None
                    else f"no lease renewal from pid {silent.pid} on {silent.hostname} for {STALE_AFTER_S:.0f}s"
                )
        except LeaseSettingsMismatch:
            owner = self._lease.owner
            raise UserError(
                f"run dir {self.run_dir} is locked by {self._holder(owner)} with a lease of "
                f"{getattr(owner, 'lease_duration', '?')}s where this version uses {STALE_AFTER_S:.0f}s "
                f"(another hydralight version); wait for that run to end, or if no run uses the dir, "
                f"delete {self.path}"
            ) from None

    def _try(
        self, timeout: float | None = None, poll_interval: float | None = None, blocking: bool | None = None
    ) -> bool:
        try:
            self._lease.acquire(timeout=timeout, poll_interval=poll_interval, blocking=blocking)
        except Timeout:
            return False
        except OSError as err:
            if err.filename is None:  # a full disk: the line names where
                raise OSError(err.errno, err.strerror, str(self.path)) from err
            raise
        return True

    def _is_this_host(self, other: OwnerRecord) -> bool:
        # filelock spells host names its own way (containers apart): compare with the record it wrote for us.
        mine = self._lease.owner
        return mine is not None and mine.pid == os.getpid() and other.hostname == mine.hostname

    def _taking_over(self, why: str) -> None:
        log.warning(f"run dir {self.run_dir}: taking over a stale lock ({why})")

    def _holder(self, owner: OwnerRecord | None) -> str:
        return "an unreadable lock file" if owner is None else f"pid {owner.pid} on {owner.hostname}"

    def _in_use(self) -> UserError:
        owner = self._lease.owner
        if owner is not None:
            return UserError(
                f"run dir {self.run_dir} is in use by pid {owner.pid} on {owner.hostname} (since {self._started()}); "
                "wait for that run to end or stop it, or give this run another hydra.run.dir"
            )
        if self.path.exists():
            return UserError(
                f"run dir {self.run_dir} is locked by {self.path}, which names no holder this version can read; "
                "if no run uses the dir, delete that file"
            )
        return UserError(f"run dir {self.run_dir} was released while this run checked it; start this run again")

    def _started(self) -> str:
        # Read as filelock reads markers: never through a link, never blocking on something that is no file.
        with contextlib.suppress(OSError):
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
            try:
                text = os.read(fd, 4096).decode(errors="replace") if stat.S_ISREG(os.fstat(fd).st_mode) else ""
            finally:
                os.close(fd)
            for line in text.splitlines():
                key, _, value = line.partition("=")
                if key == STARTED:
                    return value
        return "an unknown time"

    def _lost(self, compromise: LeaseCompromise) -> None:
        # Called by the heartbeat thread: a run cannot be stopped from there, but its log says what happened.
        log.error(
            f"run dir {self.run_dir}: this run lost its lock ({compromise.reason}); another run may now use the dir"
        )

    def release(self) -> None:
        if self._lease.is_locked:
            self._lease.release()
