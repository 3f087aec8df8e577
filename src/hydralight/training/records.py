"""What a run measures and records about itself while it trains: each rank's record, the training
throughput, and the results of a finished run (metrics, the objective, the best checkpoint)."""

from __future__ import annotations

import json
import math
import os
import socket
import time
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from torch.nn import SyncBatchNorm

from hydralight.config.plan import ObjectivePlan
from hydralight.lightning_internals import logging_step
from hydralight.rundir.layout import RunDir
from hydralight.rundir.outcome import test_counterpart
from hydralight.rundir.record import read_json, write_json
from hydralight.training.loggers import HistoryLogger


class RankRecord(pl.Callback):
    """Each rank writes `ranks/rank<N>.json` (host, pid, device, learning rate) into the run dir at fit start.

    Shows which processes ran a job and with what settings: the first thing to check when a multi-node or
    multirun job misbehaves.
    """

    def __init__(self, run_dir: str) -> None:
        self.run_dir = RunDir.at(run_dir)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        path = self.run_dir.rank_record(trainer.global_rank)
        try:  # `ranks/` only: a run dir gone (rank 0 refused the run and removed it) is not made again
            path.parent.mkdir(exist_ok=True)
        except FileNotFoundError:
            return
        environment = getattr(trainer.strategy, "cluster_environment", None)
        record = {
            "global_rank": trainer.global_rank,
            "local_rank": trainer.local_rank,
            "node_rank": trainer.node_rank,
            "world_size": trainer.world_size,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "device": str(pl_module.device),
            "lr": pl_module.hparams.get("lr", _first_lr(trainer)),
            "sync_batchnorm_layers": sum(isinstance(m, SyncBatchNorm) for m in pl_module.modules()),
            "launcher": type(environment).__name__ if environment is not None else None,
        }
        path.write_text(json.dumps(record, indent=2) + "\n")
        if trainer.global_rank == 0:  # an earlier attempt's ranks this one does not have (it ran on more processes)
            for stale in range(trainer.world_size, trainer.world_size + 4096):
                if not self.run_dir.rank_record(stale).is_file():
                    break
                self.run_dir.rank_record(stale).unlink()


def _first_lr(trainer: pl.Trainer) -> float | None:
    """The learning rate of the first optimizer as it starts (a module that takes no `lr` sets its own)."""
    groups = trainer.optimizers[0].param_groups if trainer.optimizers else []
    return groups[0].get("lr") if groups else None


class Throughput(pl.Callback):
    """Training samples/s of this attempt from its `warmup`-th optimizer step to its last, into `into`
    (`train_samples_per_second`): process start-up, the first steps' allocations and the final validation
    are left out (validations between those steps count), so runs at different world sizes compare on
    training. The figures so far travel in each checkpoint: an attempt that trains no step (killed during
    the test, continued) reports the attempt's that trained, not a rate of zero steps."""

    def __init__(self, global_size: int, into: dict[str, Any], warmup: int = 5) -> None:
        self.global_size, self.into, self.warmup = global_size, into, warmup
        self.start_step = 0  # where this attempt began
        self._trains = False  # whether this attempt's fit loop ran (it is skipped when training is done)
        self._fit_started = time.perf_counter()
        self._first: tuple[int, float] | None = None
        self._last: tuple[int, float] | None = None
        self._earlier: dict[str, float] = {}
        self._fitting = False

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._fitting = stage == "fit"  # before a checkpoint's figures are restored into this callback

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._fit_started = time.perf_counter()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.start_step, self._first, self._last, self._trains = trainer.global_step, None, None, True

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        mark = (trainer.global_step, time.perf_counter())
        if self._first is None and trainer.global_step >= self.start_step + self.warmup:
            self._first = mark
        self._last = mark

    def _training_rate(self) -> float | None:
        if self._first is None or self._last is None or self._last[0] <= self._first[0]:
            return None  # too few steps to tell
        steps, seconds = self._last[0] - self._first[0], self._last[1] - self._first[1]
        return round(steps * self.global_size / seconds, 1)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if (rate := self._training_rate()) is not None:
            self.into["train_samples_per_second"] = rate

    def samples_per_second(self, trainer: pl.Trainer, fit_seconds: float | None) -> float | None:
        """Samples this attempt trained over its `fit` time (validations included); an attempt that trained
        none: the figure of the attempt that did."""
        if self._trains and trainer.global_step > self.start_step and fit_seconds:
            return round((trainer.global_step - self.start_step) * self.global_size / fit_seconds, 1)
        return self._earlier.get("samples_per_second")

    def state_dict(self) -> dict[str, Any]:
        figures = dict(self._earlier)
        if (rate := self._training_rate()) is not None:
            figures["train_samples_per_second"] = rate
        if self._trains and self._last is not None and self._last[0] > self.start_step:
            seconds = self._last[1] - self._fit_started
            figures["samples_per_second"] = round((self._last[0] - self.start_step) * self.global_size / seconds, 1)
        return figures

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not self._fitting:  # mode=eval's test of a checkpoint: the speed its training had is not this run's
            return
        self._earlier = {k: float(v) for k, v in state_dict.items() if isinstance(v, int | float)}
        if "train_samples_per_second" in self._earlier:  # replaced by this attempt's when it trains enough
            self.into["train_samples_per_second"] = self._earlier["train_samples_per_second"]


class FitEnd(pl.Callback):
    """What training ended with: an attempt that continues a run whose training was done (killed as `fit` ended,
    in its test or while writing its records) trains no step, so Lightning has no metrics, epoch count or
    stopping reason of the training for it; it reports those of the attempt that trained, and the history keeps
    that attempt's rows once. Written as `fit` ends (`fit_end.json` in the run dir) and kept in a checkpoint saved
    as training ends (its callback state): a kill between the two loses neither."""

    def __init__(self, run_dir: str, writer: bool) -> None:
        self.run_dir, self.writer = RunDir.at(run_dir), writer
        self._trainer: pl.Trainer | None = None
        self._started_at: int | None = None  # the step this attempt's training started from; None: it did not
        self._ended = False  # training is over: a checkpoint saved now is the final one
        self._restored: dict[str, Any] = {}
        self._at_fit_end: dict[str, Any] | None = None  # what this attempt's training ended with

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = trainer

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # This attempt trains: what an earlier one ended with is no longer the end (removed where the rank
        # runs, also in a spawned one), and history after the step it continues from belongs to an attempt that
        # did not survive (whichever checkpoint callback saved that step: the project's or a user's own).
        self._started_at = trainer.global_step
        if trainer.is_global_zero:
            self.run_dir.fit_end.unlink(missing_ok=True)
        for logger in trainer.loggers:
            forget = getattr(logger, "forget_from_step", None)
            if forget is not None:
                forget(trainer.global_step)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._ended = True  # before the last checkpoint's own end of training (Lightning calls checkpoints last)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._trained(trainer):
            self._at_fit_end = self._now(trainer)
            if self.writer:
                write_json(self.run_dir.fit_end, self._at_fit_end)

    def state_dict(self) -> dict[str, Any]:
        return self._now(self._trainer) if self._ended and self._trainer is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restored = dict(state_dict)

    def _trained(self, trainer: pl.Trainer) -> bool:
        return self._started_at is not None and trainer.global_step > self._started_at

    def _now(self, trainer: pl.Trainer) -> dict[str, Any]:
        history = next((lg for lg in trainer.loggers if isinstance(lg, HistoryLogger)), None)
        return {
            "global_step": trainer.global_step,
            "epochs": trainer.current_epoch,
            "metrics": {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1},
            "stopped_by": stopped_by(trainer),
            "history_rows": history.row_count() if history else None,
            "log_step": logging_step(trainer),  # where the test's values are written
        }

    def ended(self, trainer: pl.Trainer) -> dict[str, Any]:
        """What training ended with (call after `fit`): `metrics`, `epochs`, `stopped_by`; those of the attempt
        that trained when this one trained no step."""
        if self._trained(trainer):
            return self._at_fit_end or self._now(trainer)
        history = next((lg for lg in trainer.loggers if isinstance(lg, HistoryLogger)), None)
        for earlier in (read_json(self.run_dir.fit_end), self._restored):
            if not earlier or earlier.get("global_step") != trainer.global_step:
                continue
            metrics = earlier.get("metrics")
            if not isinstance(metrics, dict):
                continue
            if history is not None and isinstance(earlier.get("history_rows"), int):
                history.keep_rows(earlier["history_rows"])
            if history is not None and isinstance(earlier.get("log_step"), int):
                # The test's rows at the step and epoch the attempt that trained would have written them.
                history.step_of_rows, history.epoch_of_rows = earlier["log_step"], earlier["epochs"]
            return {
                "metrics": {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)},
                # (Recorded by an earlier version: the metrics only.)
                "epochs": earlier.get("epochs", trainer.current_epoch),
                "stopped_by": earlier["stopped_by"] if "stopped_by" in earlier else stopped_by(trainer),
            }
        now = self._now(trainer)
        if history is not None and (logged := history.latest_values()):
            # Stopped as its training ended, before `fit` did (in the final validation, at the last step): this
            # attempt logged nothing of the training; the history holds its last values. Written down as the
            # end, so an attempt after this one (killed in its test) reads them, and its rows, from there.
            # As Lightning holds a logged number: a tensor of torch's default dtype.
            now["metrics"] = {**{k: float(torch.tensor(v)) for k, v in logged.items()}, **now["metrics"]}
            if self.writer:
                write_json(self.run_dir.fit_end, now)
        return now


def objective_checkpoint(trainer: pl.Trainer, metric: str) -> Any:
    """The checkpoint callback that keeps the best checkpoint by the run's objective `metric`, wherever it
    stands among the callbacks (a user's own ModelCheckpoint by another metric may come first); else
    Lightning's first one."""
    return next(
        (cb for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint) and cb.monitor == metric),
        trainer.checkpoint_callback,
    )


def objective_value(trainer: pl.Trainer, metrics: dict[str, float], metric: str) -> float | None:
    """The best `metric` of the run as the best-checkpoint callback tracked it (over every validation,
    across resumed attempts), else its last value; None when the run never validated it."""
    chosen = objective_checkpoint(trainer, metric)
    score = getattr(chosen, "best_model_score", None)
    if chosen is not None and getattr(chosen, "monitor", None) == metric and score is not None:
        value: float | None = float(score)
    else:
        value = metrics.get(metric)
    return value if value is not None and math.isfinite(value) else None


def stopped_by(trainer: pl.Trainer) -> dict[str, Any] | None:
    """What ended training: early stopping, or a step or epoch budget, and the budgets given that it ended before
    (None when one budget alone was given and reached, or none was: a time limit)."""
    from pytorch_lightning.callbacks.early_stopping import EarlyStoppingReason

    budgets = {
        "trainer.max_steps": (trainer.max_steps, trainer.global_step),
        "trainer.max_epochs": (trainer.max_epochs, trainer.current_epoch),
    }
    given = {key: (limit, done) for key, (limit, done) in budgets.items() if limit not in (None, -1)}
    before = [f"{k}={limit}" for k, (limit, done) in given.items() if done < limit]
    for early in trainer.early_stopping_callbacks:
        if getattr(early, "stopping_reason", EarlyStoppingReason.NOT_STOPPED) != EarlyStoppingReason.NOT_STOPPED:
            return {"budget": f"early stopping on {early.monitor}", "before": before}
    reached = [f"{key}={limit}" for key, (limit, done) in given.items() if done >= limit]
    if not reached or len(given) < 2:
        return None
    return {"budget": reached[0], "before": before}


def run_results(
    trainer: pl.Trainer,
    metrics: dict[str, Any],
    tested: dict[str, Any],
    best: str | None,
    objective: ObjectivePlan,
    samples_per_second: float | None,
    stopped: dict[str, Any] | None = None,
    epochs: int | None = None,
    test_batches: int = 0,
) -> dict[str, Any]:
    """results.json of a finished run: epochs, steps, every final metric, the objective (the best
    validation value of `objective.metric`: what a sweeper may tune on, never a test metric), samples/s.
    `tested`: what the test stage logged, under the module's own names (test/acc, test_loss, a log_dict's);
    `stopped`: what ended training (`stopped_by`, read before the test); `epochs`: the epochs training ended
    with (`FitEnd.ended`), else the trainer's; `test_batches`: how many batches the test stage ran on each process
    (0: none)."""
    tested = {k: float(v) for k, v in tested.items()}
    metrics = {**{k: float(v) for k, v in metrics.items()}, **tested}
    # The objective's test counterpart, kept at the top level where earlier results had it (test/acc); only
    # for a module that logs it (a null there would read as "measured and lost").
    headline_key = test_counterpart(objective.metric)
    headline = {headline_key: metrics[headline_key]} if headline_key in metrics else {}
    return {
        "epochs": trainer.current_epoch if epochs is None else epochs,
        "global_step": trainer.global_step,
        "best_checkpoint": best or None,
        "metrics": metrics,
        "test": tested,
        "test_batches_per_process": test_batches,
        **headline,
        "objective": {
            "metric": objective.metric,
            "direction": objective.direction,
            "value": objective_value(trainer, metrics, objective.metric),
        },
        "samples_per_second": samples_per_second,
        "stopped_by": stopped,
    }


def result_line(results: dict[str, Any], run_dir: str) -> str:
    """The last line of a run: its test metrics (the objective's own first), the checkpoint and run dir."""
    test = results.get("test") or {}
    first = test_counterpart(results["objective"]["metric"])
    shown = " ".join(f"{k}={test[k]:.4f}" for k in sorted(test, key=lambda k: (k != first, k)) if "samples" not in k)
    where = f"(checkpoint: {results.get('best_checkpoint') or 'final weights'}; run dir: {run_dir})"
    if stop := results.get("stopped_by"):
        unreached = f", before {' and '.join(stop['before'])}" if stop["before"] else ""
        where = f"{where}; stopped by {stop['budget']} at step {results.get('global_step')}{unreached}"
    if shown:
        return f"{shown} {where}"
    value = results["objective"]["value"]
    best = f"best {results['objective']['metric']}={value:.4f}" if value is not None else "no objective"
    if results.get("test_batches_per_process"):  # its test ran and logged nothing (Lightning's BoringModel)
        return f"no test metrics (the module's test step logs nothing: log them with self.log); {best} {where}"
    return f"no test metrics (no test step in the module, or no test data); {best} {where}"
