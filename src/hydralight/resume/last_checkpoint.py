"""`checkpoints/last.ckpt`: the state a run continues from, written whenever training may stop.

It is written inside epochs (every N optimizer steps and/or M minutes), at every epoch end (with or
without a validation), and at the end of `fit` whatever ended it (epochs done, `max_steps`,
`max_time`, `limit_train_batches`, early stopping). When training ended between validations, one
more validation runs first, so the best-checkpoint choice and the results include the final weights.
The final checkpoint records the loop state of the moment training really stopped
(hydralight.lightning_internals.record_loop_state).
"""

from __future__ import annotations

import time
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Checkpoint

from hydralight.errors import UserError
from hydralight.lightning_internals import (
    call_after_module_hook,
    epoch_complete,
    record_loop_state,
    restore_module_hooks,
    validate_now,
    validation_follows,
)
from hydralight.resume.agreement import agreement
from hydralight.rundir.layout import RunDir
from hydralight.training.checkpoint_io import write_checkpoint


def at_step_boundary(trainer: pl.Trainer, batch_idx: int) -> bool:
    """True after a micro-batch that completes an optimizer step inside the epoch: the safe places to save.

    The epoch's last batch is left to the epoch-end checkpoint, which records a clean epoch boundary.
    """
    return (batch_idx + 1) % trainer.accumulate_grad_batches == 0 and not trainer.is_last_batch


class LastCheckpoint(Checkpoint):
    """Owns `last.ckpt`: periodic saves inside epochs, a save at every epoch end and at the end of `fit`.

    `every_n_steps` / `every_minutes` bound what a kill without warning (SIGKILL, OOM, node lost)
    can cost; `null` turns either off.
    """

    def __init__(self, run_dir: str, every_n_steps: int | None = None, every_minutes: float | None = 10) -> None:
        self.path = RunDir.at(run_dir).last
        # A negative count would save at its multiples, 0 never, a string always: refused, not guessed.
        for key, value, kind in (("every_n_steps", every_n_steps, int), ("every_minutes", every_minutes, int | float)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, kind) or not value > 0):
                raise UserError(f"callbacks.last_checkpoint.{key}={value!r}: use a number above 0, or null (off)")
        self.every_n_steps = every_n_steps
        self.every_minutes = every_minutes
        self._last_save = time.monotonic()
        self._saved_step = -1
        self._validated_step = -1
        self._validated_since_save = False
        self._after_validation = False  # a periodic save due at a step that validates: made once it has
        # How the loop state is recorded in the checkpoint being written: None (as Lightning has it),
        # "boundary" (epoch done, the next one not begun) or "stopped" (mid-epoch, after the last step).
        self._form: str | None = None

    def _save(self, trainer: pl.Trainer, form: str | None) -> None:
        if trainer.fast_dev_run:  # type: ignore[attr-defined]  # a smoke test: nothing for a later run to continue
            return
        self._form = form
        try:
            write_checkpoint(trainer, self.path)
        finally:
            self._form = None
        self._saved_step = trainer.global_step
        self._validated_since_save = False
        self._last_save = time.monotonic()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last_save = time.monotonic()
        if self.every_minutes:
            agreement(trainer).register("save_due", self._time_due, rank_zero_decides=True)
        self._saved_step = trainer.global_step if self.path.is_file() else -1

    def _time_due(self) -> int:
        # Registered only when every_minutes is set.
        return int(self.every_minutes is not None and time.monotonic() - self._last_save >= 60 * self.every_minutes)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # Saved after the module's own on_train_batch_end: what it does there at a step (an EMA of its weights) is
        # in the checkpoint, as it is in an uninterrupted run's weights.
        if stage == "fit":
            call_after_module_hook(trainer, pl_module, "on_train_batch_end")

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        restore_module_hooks(pl_module)

    def after_on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if not at_step_boundary(trainer, args[-1]):
            return
        due = bool(self.every_n_steps and trainer.global_step % self.every_n_steps == 0)
        if self.every_minutes:
            # Clocks differ between ranks: rank 0's decides, agreed with the other step-boundary decisions.
            due = agreement(trainer).agreed(trainer, pl_module)["save_due"] > 0 or due
        if due and validation_follows(trainer):
            # Saved before the validation due at this step, a checkpoint has Lightning skip that validation when
            # it continues from it: saved once the validation is done, it holds its result too.
            self._after_validation = True
        elif due:
            self._save(trainer, None)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._validated_step = trainer.global_step
            self._validated_since_save = True
            if self._after_validation:
                self._after_validation = False
                self._save(trainer, None)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if epoch_complete(trainer):  # a whole epoch, not one cut by a budget
            self._save(trainer, "boundary")

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        form = "boundary" if epoch_complete(trainer) else "stopped"
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
        validate_now(trainer)

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self._form is not None:
            record_loop_state(checkpoint, self._form, trainer.global_step)
