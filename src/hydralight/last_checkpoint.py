"""`checkpoints/last.ckpt`: the state a run continues from, written whenever training may stop.

It is written inside epochs (every N optimizer steps and/or M minutes), at every epoch end (with or
without a validation), and at the end of `fit` whatever ended it (epochs done, `max_steps`,
`max_time`, `limit_train_batches`, early stopping). When training ended between validations, one
more validation runs first, so the best-checkpoint choice and the results include the final weights.

Lightning marks an epoch as finished when `fit` stops, also in the middle of one (a step budget),
and a checkpoint taken then resumes into the next epoch, skipping the rest of the current one. The
final checkpoint therefore records the loop state of the moment training really stopped: the end of
its last optimizer step (mid-epoch), or the boundary before the next epoch.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from lightning_fabric.plugins import TorchCheckpointIO
from pytorch_lightning.callbacks import Callback

from hydralight.agreement import agreement
from hydralight.errors import UserError

LAST = "last.ckpt"


def at_step_boundary(trainer: pl.Trainer, batch_idx: int) -> bool:
    """True after a micro-batch that completes an optimizer step inside the epoch: the safe places to save.

    The epoch's last batch is left to the epoch-end checkpoint, which records a clean epoch boundary.
    """
    return (batch_idx + 1) % trainer.accumulate_grad_batches == 0 and not trainer.is_last_batch


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


class LastCheckpoint(Callback):
    """Owns `last.ckpt`: periodic saves inside epochs, a save at every epoch end and at the end of `fit`.

    `every_n_steps` / `every_minutes` bound what a kill without warning (SIGKILL, OOM, node lost)
    can cost; `null` turns either off.
    """

    def __init__(self, checkpoint_dir: str, every_n_steps: int | None = 200, every_minutes: float | None = 10) -> None:
        self.path = Path(checkpoint_dir) / LAST
        self.every_n_steps = every_n_steps
        self.every_minutes = every_minutes
        self._last_save = time.monotonic()
        self._saved_step = -1
        self._validated_step = -1
        self._validated_since_save = False
        self.start_step = 0
        # How the loop state is recorded in the checkpoint being written: None (as Lightning has it),
        # "boundary" (epoch done, the next one not begun) or "stopped" (mid-epoch, after the last step).
        self._form: str | None = None

    @property
    def saved_step(self) -> int:
        """The optimizer step of the last `last.ckpt` this process wrote (-1: none)."""
        return self._saved_step

    def _save(self, trainer: pl.Trainer, form: str | None) -> None:
        self._form = form
        try:
            write_checkpoint(trainer, self.path)
        finally:
            self._form = None
        self._saved_step = trainer.global_step
        self._validated_since_save = False
        self._last_save = time.monotonic()

    # Resuming: history after the restored step belongs to the attempt that did not survive.
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.start_step = trainer.global_step  # where this attempt began (throughput counts from here)
        self._last_save = time.monotonic()
        if self.every_minutes:
            agreement(trainer).register("save_due", self._time_due, rank_zero_decides=True)
        self._saved_step = trainer.global_step if self.path.is_file() else -1
        for logger in trainer.loggers:
            forget = getattr(logger, "forget_from_step", None)
            if forget is not None:
                forget(trainer.global_step)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        # Lightning's logging step counts optimizer steps; a restart at an epoch boundary can leave it
        # one ahead. Keeping it equal to the step makes a resumed run log exactly what an uninterrupted one does.
        trainer.fit_loop.epoch_loop._batches_that_stepped = trainer.global_step

    def _time_due(self) -> int:
        return int(time.monotonic() - self._last_save >= 60 * self.every_minutes)  # type: ignore[operator]

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if not at_step_boundary(trainer, args[-1]):
            return
        due = bool(self.every_n_steps) and trainer.global_step % self.every_n_steps == 0
        if self.every_minutes:
            # Clocks differ between ranks: rank 0's decides, agreed with the other step-boundary decisions.
            due = agreement(trainer).agreed(trainer, pl_module)["save_due"] > 0 or due
        if due:
            self._save(trainer, None)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._validated_step = trainer.global_step
            self._validated_since_save = True

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:  # a whole epoch, not one cut by a budget
            self._save(trainer, "boundary")

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        form = "boundary" if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch else "stopped"
        self._form = form  # a best checkpoint saved by the final validation records the same state
        try:
            self._validate_final_weights(trainer)
        finally:
            self._form = None
        if trainer.global_step > 0 and (self._saved_step != trainer.global_step or self._validated_since_save):
            self._save(trainer, form)

    def _validate_final_weights(self, trainer: pl.Trainer) -> None:
        if not trainer.enable_validation or trainer.global_step in (0, self._validated_step):
            return
        loop = trainer.fit_loop.epoch_loop
        stepped = loop._batches_that_stepped
        # Logged at the last step's index, as Lightning logs an epoch-end validation.
        loop._batches_that_stepped = trainer.global_step - 1
        trainer.validating = True
        try:
            loop.val_loop.run()
        finally:
            trainer.training = True
            loop._batches_that_stepped = stepped

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self._form is None or "loops" not in checkpoint:
            return
        fit = checkpoint["loops"]["fit_loop"]
        epochs, batches = fit["epoch_progress"], fit["epoch_loop.batch_progress"]
        if self._form == "boundary":
            # Epoch done, next not begun: a resumed run starts the next epoch at its first batch.
            for part in ("total", "current"):
                epochs[part].update(dict.fromkeys(("ready", "processed", "completed"), epochs[part]["started"]))
            batches["current"] = dict.fromkeys(batches["current"], 0)
            batches["is_last_batch"] = False
            checkpoint["epoch"] = epochs["current"]["started"]
        else:
            # As if saved right after the last optimizer step (the form periodic checkpoints have):
            # a resumed run continues the same epoch with the next batch.
            for part in ("total", "current"):
                epochs[part]["processed"] = epochs[part]["completed"] = epochs[part]["started"] - 1
                batches[part]["completed"] = batches[part]["processed"] - 1
            fit["epoch_loop.state_dict"]["_batches_that_stepped"] = trainer.global_step - 1
            checkpoint["epoch"] = epochs["current"]["started"] - 1
