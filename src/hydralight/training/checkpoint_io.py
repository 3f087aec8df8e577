"""How checkpoint files are written: whole or not at all, and a full disk said in one line."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shutil
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from lightning_fabric.plugins import TorchCheckpointIO

from hydralight.errors import UserError


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoint files written whole or not at all, and a full disk said in one line.

    The checkpoint is serialized in memory, written to a temporary file beside the target, flushed to
    disk and renamed over it: a kill or a full disk during the write leaves the previous file intact.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        path = Path(path)
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        data = buffer.getbuffer()
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with open(temporary, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, path)
        except OSError as err:
            with contextlib.suppress(OSError):
                temporary.unlink()
            if err.errno in (errno.ENOSPC, errno.EDQUOT):
                free = shutil.disk_usage(path.parent).free
                kept = f"the previous {path.name} is intact; " if path.exists() else ""
                raise UserError(
                    f"no space left in {path.parent} to save {path.name} ({len(data) / 2**20:.1f} MiB needed, "
                    f"{free / 2**20:.1f} MiB free); {kept}free some space and rerun the same command to continue, "
                    "or give the run dir a larger disk (hydra.run.dir=...)"
                ) from None
            raise


def write_checkpoint(trainer: pl.Trainer, path: Path) -> None:
    """Save the trainer's state to `path`, with the metrics logged so far flushed to disk first."""
    for logger in trainer.loggers:
        logger.save()
    trainer.save_checkpoint(path, weights_only=False)  # the whole state: a run continues from it
