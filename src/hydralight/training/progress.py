"""Progress display: a live bar on a terminal, plain periodic lines in log files."""

from __future__ import annotations

import sys
import time
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import ProgressBar, RichProgressBar

from hydralight.lightning_internals import epoch_complete, micro_batches_done
from hydralight.training.console import say


class LineProgress(ProgressBar):
    """One line every N optimizer steps and at each epoch end: readable in SLURM and CI logs (the test's
    result is the run's last line, printed by the run record).

    Lightning's bars redraw with carriage returns, which fill a log file with partial lines.
    """

    def __init__(self, every_n_steps: int = 50) -> None:
        super().__init__()
        self.every_n_steps = every_n_steps
        self._enabled = True
        self._epoch_start = 0.0
        # The epoch whose end line was printed, until the next epoch starts.
        self._line_of_epoch: int | None = None

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def _print(self, trainer: pl.Trainer, text: str) -> None:
        if self._enabled and trainer.is_global_zero:
            say(text.rstrip())

    def _metrics(self, trainer: pl.Trainer) -> str:
        return " ".join(
            f"{k}={v:.4g}"
            for k, v in self.get_metrics(trainer, trainer.lightning_module).items()
            if isinstance(v, float)
        )

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_start = time.perf_counter()  # a run resumed inside an epoch gets no epoch start
        self._count_batches(trainer)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_start = time.perf_counter()
        self._line_of_epoch = None
        self._count_batches(trainer)

    def _count_batches(self, trainer: pl.Trainer) -> None:
        self._epoch_batches = trainer.num_training_batches  # read now: a budget's stop leaves it 0 at the end
        # The batches this epoch runs: a step budget (optimizer steps, each `accumulate_grad_batches` micro-batches)
        # ends it early. Lightning's `total_train_batches` counts down as steps are taken, and not at all when
        # max_epochs is set too.
        self._epoch_total = self._epoch_batches
        if trainer.max_steps is not None and trainer.max_steps > 0:
            left = (trainer.max_steps - trainer.global_step) * trainer.accumulate_grad_batches
            self._epoch_total = min(self._epoch_batches, micro_batches_done(trainer) + left)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        done, total = batch_idx + 1, getattr(self, "_epoch_total", self.total_train_batches)
        if self.every_n_steps and done % self.every_n_steps == 0 and done != total:
            head = f"epoch {trainer.current_epoch} batch {done}/{total} step {trainer.global_step}"
            self._print(trainer, f"{head} {self._metrics(trainer)}")

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        seconds = time.perf_counter() - self._epoch_start
        # An epoch a step budget or a stop cut short says where it stopped, not "done".
        done, total = micro_batches_done(trainer), getattr(self, "_epoch_batches", 0)
        of = f"/{total}" if isinstance(total, int) and total > 0 else ""
        ended = "done" if epoch_complete(trainer) else f"stopped at batch {done}{of}"
        self._print(
            trainer,
            f"epoch {trainer.current_epoch} {ended} in {seconds:.1f}s step {trainer.global_step} {self._metrics(trainer)}",
        )
        self._line_of_epoch = trainer.current_epoch

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # A validation after its epoch's line (the final one of a run stopped between validations, at the end
        # of fit) gets a line of its own: the epoch's line showed the previous validation's values, and would
        # have been the run's last.
        if self._line_of_epoch is not None and not trainer.sanity_checking and trainer.state.fn == "fit":
            self._print(
                trainer,
                f"epoch {self._line_of_epoch} validated at step {trainer.global_step} {self._metrics(trainer)}",
            )


def progress_bar(every_n_steps: int = 50) -> ProgressBar:
    """RichProgressBar when stdout is a terminal, LineProgress otherwise."""
    return RichProgressBar() if sys.stdout.isatty() else LineProgress(every_n_steps)
