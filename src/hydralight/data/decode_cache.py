"""A file of decoded data shared by the runs and sweep jobs that read the same files: built once under a
lock, written atomically, rebuilt when its key (what it was built from) changes."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock

log = logging.getLogger(__name__)


def _read(path: Path, key: str, valid: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
    """The cache's content when it was built from `key` and holds what it claims (`valid`: shapes, label range,
    counts); None when missing, stale, unreadable or not what it claims (then it is built again)."""
    if not path.is_file():
        return None
    try:
        # mmap: the tensors are paged in when used, not copied at load time.
        content = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # a file cut short by a full disk before the atomic rename existed, another format
        return None
    if not isinstance(content, dict) or content.get("key") != key:
        return None
    try:
        return content if valid(content) else None
    except Exception:  # a key missing, a value of another type: not what this project wrote
        return None


def cached(
    path: Path, key: str, build: Callable[[], dict[str, Any]], valid: Callable[[dict[str, Any]], bool] = lambda c: True
) -> tuple[dict[str, Any], bool]:
    """The content of `path` if it was built from `key` and passes `valid`, else `build()`, saved there for the
    next run.

    Returns (content, reused). Jobs that start together wait for the first one's build instead of
    decoding the same files in parallel; readers never see a half-written file. A cache folder that cannot be
    written (read-only, full) costs only the cache: the content is built for this run alone, said in one line.
    """
    if (content := _read(path, key, valid)) is not None:
        return content, True
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path.with_name(path.name + ".lock")))
        lock.acquire()
    except OSError as err:
        log.warning(f"the decode cache {path.parent} cannot be written ({err.strerror}): decoding without it")
        return {**build(), "key": key}, False
    try:
        if (content := _read(path, key, valid)) is not None:  # built by another job while we waited
            return content, True
        start = time.monotonic()
        content = {**build(), "key": key}
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        try:
            torch.save(content, partial)
            os.replace(partial, path)
        except OSError as err:
            log.warning(f"the decode cache {path} cannot be written ({err.strerror}): this run decoded without it")
            return content, False
        finally:
            partial.unlink(missing_ok=True)
        log.info(f"decoded data cached in {path} ({time.monotonic() - start:.1f} s)")
    finally:
        lock.release()
    return content, False
