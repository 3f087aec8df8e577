"""A callback that kills this process (SIGKILL: nothing of the run gets to react) at a named moment of a run,
once: the first time it fires it leaves `once` behind, so the same command run again goes through."""

import os
import signal
from pathlib import Path

import pytorch_lightning as pl


class KillAt(pl.Callback):
    """`point`:
    - `step`: when optimizer step `step` is done (inside an epoch)
    - `epoch_end`: at the end of training epoch `epoch` (0-based), after its last step, before its validation
    - `save`: while last.ckpt is being saved at step `step` (the checkpoint built, the file not yet written)
    - `validation`: inside the validation of step `step` (the final validation when it is the last step)
    - `test`: inside the test stage
    - `records`: after the test stage, before results.json is written
    - `fit_end`: as `fit` ends, its final checkpoint written
    - `next_job`: as a job starts fitting while job `job`'s results are written (between the jobs of a sweep)
    """

    def __init__(self, point: str, once: str, step: int = -1, epoch: int = -1, job: str = "") -> None:
        self.point, self.once, self.step, self.epoch, self.job = point, Path(once), step, epoch, job

    def _kill(self) -> None:
        if self.once.exists():
            return
        self.once.write_text(self.point)
        os.kill(os.getpid(), signal.SIGKILL)

    def on_train_batch_end(self, trainer: pl.Trainer, *args) -> None:
        if self.point == "step" and trainer.global_step == self.step:
            self._kill()

    def on_train_epoch_end(self, trainer: pl.Trainer, *args) -> None:
        if self.point == "epoch_end" and trainer.current_epoch == self.epoch:
            self._kill()

    def on_save_checkpoint(self, trainer: pl.Trainer, *args) -> None:
        if self.point == "save" and trainer.global_step == self.step:
            self._kill()

    def on_validation_batch_end(self, trainer: pl.Trainer, *args) -> None:
        if self.point == "validation" and trainer.global_step == self.step and not trainer.sanity_checking:
            self._kill()

    def on_test_batch_end(self, trainer: pl.Trainer, *args) -> None:
        if self.point == "test":
            self._kill()

    def teardown(self, trainer: pl.Trainer, module: pl.LightningModule, stage: str) -> None:
        if self.point == "records" and stage == "test":
            self._kill()
        if self.point == "fit_end" and stage == "fit":  # the final checkpoint written, `fit` not yet returned
            self._kill()

    def on_fit_start(self, trainer: pl.Trainer, *args) -> None:
        if self.point == "next_job" and (Path(self.job) / "results.json").exists():
            self._kill()
