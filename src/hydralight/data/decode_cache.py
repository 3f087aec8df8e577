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


def _read(path: Path, key: str) -> dict[str, Any] | None:
    """The cache's content when it was built from `key`; None when missing, stale or unreadable."""
    if not path.is_file():
        return None
    try:
        # mmap: the tensors are paged in when used, not copied at load time.
        content = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # a file cut short by a full disk before the atomic rename existed, another format
        return None
    return content if isinstance(content, dict) and content.get("key") == key else None


def cached(path: Path, key: str, build: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """The content of `path` if it was built from `key`, else `build()`, saved there for the next run.

    Returns (content, reused). Jobs that start together wait for the first one's build instead of
    decoding the same files in parallel; readers never see a half-written file.
    """
    if (content := _read(path, key)) is not None:
        return content, True
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path.with_name(path.name + ".lock"))):
        if (content := _read(path, key)) is not None:  # built by another job while we waited
            return content, True
        start = time.monotonic()
        content = {**build(), "key": key}
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        try:
            torch.save(content, partial)
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
        log.info(f"decoded data cached in {path} ({time.monotonic() - start:.1f} s)")
    return content, False
