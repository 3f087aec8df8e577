"""Checks that stop a run of any module with one clear line instead of training on garbage or failing late:
a loss that is not finite, an objective the module never logs."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.data import extract_batch_size

from hydralight.errors import UserError
from hydralight.lightning_internals import logged_names
from hydralight.training.console import say

log = logging.getLogger(__name__)


def kept_state(last: Path) -> str:
    """What a stopped run keeps: its last checkpoint and step, or that it has none."""
    if not last.is_file():
        return "no checkpoint was saved before it"
    try:
        step = torch.load(last, map_location="cpu", weights_only=True).get("global_step")
    except Exception:  # a damaged file must not hide why the run stopped
        return f"{last}, the last checkpoint saved before it, cannot be read"
    return f"{last} (step {step}) holds the last state saved before it"


class FiniteLoss(pl.Callback):
    """Stops a run whose loss is NaN or infinite before that step's update reaches the weights or a checkpoint
    (just before backward, for any module: automatic or manual optimization)."""

    def __init__(self, last_checkpoint: str, lr_key: str | None = "optim.lr") -> None:
        self.last = Path(last_checkpoint)
        self.lr_key = lr_key  # how the user lowers the learning rate, when the module takes the plan's

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        # A scalar (any automatic optimization) is read as a Python float: a third of the cost of isfinite().all().
        if math.isfinite(loss.item()) if loss.numel() == 1 else bool(torch.isfinite(loss.detach()).all()):
            return
        lr = pl_module.hparams.get("lr") if self.lr_key else None
        lower = f"lower {self.lr_key} (now {lr:g}) or " if isinstance(lr, int | float) else ""
        raise UserError(
            f"the loss is {loss.detach().float().mean().item()} at step {trainer.global_step} (epoch "
            f"{trainer.current_epoch}); {lower}set trainer.gradient_clip_val; {kept_state(self.last)}"
        )


class ObjectiveLogged(pl.Callback):
    """After the first validation, refuses an objective the module does not log: the best checkpoint, a
    sweeper and the search would otherwise have nothing to go by."""

    def __init__(self, metric: str) -> None:
        self.metric = metric
        self.checked = False

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.checked or trainer.sanity_checking:
            return
        self.checked = True
        logged = logged_names(trainer)  # in this validation: a value training logged is no objective
        if self.metric in logged:
            return
        if not logged:  # a validation that logs nothing (Lightning's BoringModel): no objective, said once
            self._train_without_objective(trainer, pl_module)
            return
        where = " (it is logged in training)" if self.metric in trainer.callback_metrics else ""
        refused = UserError(
            f"objective.metric={self.metric} is not logged in validation by {type(pl_module).__name__}{where}; it "
            f"logs {', '.join(sorted(logged))} there: set objective.metric to one of them (objective.direction=min "
            "for a loss)"
        )
        refused.before_any_result = True  # a new run leaves no run dir
        raise refused

    def _train_without_objective(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """No best checkpoint and no objective (last.ckpt is the run's checkpoint, as for a module without a
        validation step); a sweeper or a search gets nothing to tune on from such a run."""
        for callback in list(trainer.checkpoint_callbacks):
            if getattr(callback, "monitor", None) == self.metric:
                trainer.callbacks.remove(callback)  # type: ignore[attr-defined]  # the connector's list
        if trainer.is_global_zero:
            say(  # a console line, also from a ddp_spawn rank (where no logging is set up)
                f"no objective: {type(pl_module).__name__}'s validation logs nothing, so objective.metric="
                f"{self.metric} is never measured and the run's checkpoint is last.ckpt; log it in validation_step "
                "(self.log), or skip validation with trainer.limit_val_batches=0"
            )

    def state_dict(self) -> dict[str, Any]:
        return {}


def accumulation_refused(what: str) -> UserError:
    """An accumulation other than the plan's (Lightning's GradientAccumulationScheduler): refused, as a
    `trainer.accumulate_grad_batches` is, before a step trains."""
    refused = UserError(
        f"{what} (a GradientAccumulationScheduler) where the plan sets the accumulation: the global batch would "
        "not be batch.global_size; drop it, and accumulate with batch.max_per_device (or batch.accumulation)"
    )
    refused.before_any_result = True
    return refused


class PlannedBatch(pl.Callback):
    """Measures the first training batch each rank really gets, and the first of every later epoch (a data module
    that builds its loaders again, `reload_dataloaders_every_n_epochs`), and refuses, in one line before that
    step trains, one that is not the plan's per-device batch (a data module that divides or ignores
    `batch_size`); each rank's first measurement goes into its rank record (`ranks/rank<N>.json`,
    `train_batch_size`). Refuses as well an accumulation that is not the plan's (Lightning's
    GradientAccumulationScheduler sets its own)."""

    def __init__(
        self, per_device_size: int, rank_record: Callable[[int], Path] | None = None, accumulation: int = 1
    ) -> None:
        self.per_device_size = per_device_size
        self.rank_record = rank_record
        self.accumulation = accumulation
        self.measured: int | None = None
        self._epoch: int | None = None  # the last epoch whose first batch was measured

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if trainer.accumulate_grad_batches != self.accumulation:  # set by a module's configure_callbacks
            raise accumulation_refused(f"{trainer.accumulate_grad_batches} batches an optimizer step")
        if self.measured is not None and (batch_idx != 0 or trainer.current_epoch == self._epoch):
            return  # one batch an epoch is measured: every step would cost each step
        self._epoch = trainer.current_epoch
        try:
            with warnings.catch_warnings():  # tensors of several lengths: the first one's is the batch's
                warnings.simplefilter("ignore")
                size = extract_batch_size(batch)
        except Exception:  # a batch of no tensors: nothing to measure
            self.measured = -1 if self.measured is None else self.measured
            return
        first = self.measured is None
        if first:
            self.measured = size
            self._record(trainer.global_rank)
        batches = trainer.num_training_batches
        last = isinstance(batches, int) and batch_idx == batches - 1
        if size < self.per_device_size and last and batches == 1:
            raise UserError(
                f"rank {trainer.global_rank} trains on one batch of {size} an epoch where the plan gives each device "
                f"{self.per_device_size}: its training data is smaller than one batch; lower batch.global_size (at "
                f"most {size * trainer.world_size} here) or give it more data"
            )
        if size == self.per_device_size or (last and size < self.per_device_size):
            return  # a resumed run may start at the short last batch of an epoch
        again = "" if first else f" from epoch {trainer.current_epoch} on (its loaders were built again)"
        raise UserError(
            f"rank {trainer.global_rank} trains on batches of {size}{again} where the plan gives each device "
            f"{self.per_device_size}; its data module's training loader does not use batch_size as given (the "
            "per-device batch): build its loaders with it (set the global batch with batch.global_size)"
        )

    def _record(self, rank: int) -> None:
        path = self.rank_record(rank) if self.rank_record else None
        if path is None or not path.is_file() or path.is_symlink():
            return
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(path.read_text())
            record["train_batch_size"] = self.measured
            path.write_text(json.dumps(record, indent=2) + "\n")
