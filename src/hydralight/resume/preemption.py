"""Ending a run on request (the cluster's warning signal, SIGTERM, Ctrl-C) with a checkpoint.

One owner for these signals: this callback. A handler only records the signal; at a step boundary the
ranks agree (hydralight.resume.agreement: at the next step in one process, within about a second in several),
save `last.ckpt` together, rank 0 asks SLURM to requeue the job when the signal was the
time-limit/preemption warning, and every rank exits. Saving inside
the handler instead (as Lightning's SLURM handler does) can run in the middle of an optimizer step or
a collective and write a torn checkpoint or hang.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from types import FrameType
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback, ModelCheckpoint

from hydralight.lightning_internals import call_after_module_hook, log_step_metrics_now, restore_module_hooks
from hydralight.resume.agreement import agreement
from hydralight.resume.last_checkpoint import at_step_boundary
from hydralight.rundir.layout import RunDir
from hydralight.training.checkpoint_io import write_checkpoint

log = logging.getLogger(__name__)

NONE, STOP, REQUEUE = 0, 1, 2


class Interrupted(SystemExit):
    """Raised on every rank after the checkpoint is saved; SystemExit so no result is recorded as final."""


class Preemption(Callback):
    """Checkpoint-and-exit on SIGTERM/SIGINT, checkpoint-requeue-and-exit on the SLURM warning signal.

    `requeue_signal` is what the job was told to expect before its time limit or preemption
    (submitit asks SLURM for SIGUSR2 `signal_delay_s` seconds ahead); SIGUSR1, Lightning's, is taken as one
    too (a `--signal=USR1@90` of the user's would otherwise kill the job unsaved). `max_requeues` bounds the
    requeues of one job (SLURM counts them in SLURM_RESTART_COUNT).
    """

    def __init__(self, run_dir: str, requeue_signal: str = "SIGUSR2", max_requeues: int = 3) -> None:
        self.checkpoint_path = RunDir.at(run_dir).last
        self.requeue_signals = {signal.Signals[requeue_signal], signal.SIGUSR1, signal.SIGUSR2}
        self.max_requeues = max_requeues
        self.requested = NONE
        self._previous: dict[signal.Signals, Any] = {}
        self._sigints = 0
        self._held: signal.Signals | None = None  # a stop signal received and not acted on yet
        self._stopped_by = signal.SIGTERM  # the stop signal this rank received: its exit code is 128 + it
        self._zero = True  # this process is the run's rank 0 (set as a stage starts)

    # Signal side: record only.
    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT:
            self._sigints += 1
            if self._sigints > 1:  # a second Ctrl-C means now (a KeyboardInterrupt, Lightning would end with 1)
                raise SystemExit(128 + signal.SIGINT)
        if signum not in self.requeue_signals:
            self._held = self._stopped_by = signal.Signals(signum)
        wanted = REQUEUE if signum in self.requeue_signals else STOP
        self.requested = max(self.requested, wanted)
        log.warning(f"received {signal.Signals(signum).name}: checkpointing at the next step boundary")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Runs after Lightning (and submitit) installed theirs: from here this callback owns them.
        for signum in (signal.SIGTERM, signal.SIGINT, *sorted(self.requeue_signals)):
            self._previous[signum] = signal.signal(signum, self._handler)
        agreement(trainer).register("signal", lambda: self.requested)  # the strongest request over ranks

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # The test after training: the warning signal (a time limit, a preemption) requeues the job at once, and
        # the job's next attempt tests again from the checkpoint training ended with. Only the warning: a stop
        # signal ends the test as the process's own handlers end it, and the same command tests again.
        self._zero = trainer.is_global_zero
        for signum in sorted(self.requeue_signals):
            self._previous.setdefault(signum, signal.signal(signum, self._requeue_now))

    def _requeue_now(self, signum: int, frame: FrameType | None) -> None:
        requeued = self._zero and self._requeue()
        if self._zero:
            what = "requeued: its next attempt tests again" if requeued else "stopped: the same command tests again"
            log.warning(f"received {signal.Signals(signum).name} during the test; run {what}")
        raise Interrupted(0 if requeued or not self._zero else 128 + signum)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        restore_module_hooks(pl_module)
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        # A stop asked for after the ranks' last agreement (training's last hooks, its final save) was held, not
        # acted on: it is given back now, to the handlers found, and stops the run before its test.
        held, self._held = self._held, None
        if held is not None and stage == "fit":
            log.warning(f"{held.name} received as training ended: stopping before the test")
            signal.raise_signal(held)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # Saved after the module's own on_train_batch_end, as LastCheckpoint saves (hydralight.resume.last_checkpoint).
        if stage == "fit":
            call_after_module_hook(trainer, pl_module, "on_train_batch_end")

    # Training side: act at a step boundary, all ranks together, once the module's own hook has run.
    def after_on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if not at_step_boundary(trainer, args[-1]):
            return  # mid-accumulation: the next boundary is a few micro-batches away
        requested = agreement(trainer).agreed(trainer, pl_module)["signal"]
        if requested == NONE:
            return
        # This step's metrics are logged right after this hook, which the exit below skips: log them now,
        # or the resumed run (which starts at the next step) would leave a hole in the history.
        log_step_metrics_now(trainer)
        self._stop(trainer, requested)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # A signal after the last step boundary stops the run too, before its test: the checkpoint holds finished
        # training, so the same command continues with the test.
        if (requested := agreement(trainer).at_end(trainer, pl_module)["signal"]) != NONE:
            self._stop(trainer, requested)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # The validation of the final weights runs after the check above (hydralight.resume.last_checkpoint's, at
        # the end of training); every rank runs it, so the ranks agree once more at its end.
        if trainer.sanity_checking or not trainer.fit_loop.done:
            return
        if (requested := agreement(trainer).at_end(trainer, pl_module)["signal"]) != NONE:
            # The best checkpoint this validation chooses is saved first, as in an uninterrupted run (Lightning
            # calls the checkpoint callbacks' hook after this one; the stop would skip it).
            for callback in trainer.checkpoint_callbacks:
                if isinstance(callback, ModelCheckpoint):
                    callback.on_validation_end(trainer, pl_module)
            self._stop(trainer, requested)

    def _stop(self, trainer: pl.Trainer, requested: int) -> None:
        self._held = None  # acted on here
        if not trainer.fast_dev_run:  # type: ignore[attr-defined]  # a smoke test leaves nothing to continue
            write_checkpoint(trainer, self.checkpoint_path)
        requeued = requested == REQUEUE and trainer.is_global_zero and self._requeue()
        if trainer.is_global_zero:  # one line for the run, not one per rank
            what = "requeued" if requeued else "stopped"
            log.warning(f"checkpoint saved at step {trainer.global_step} to {self.checkpoint_path}; run {what}")
        raise Interrupted(0 if requeued else 128 + self._stopped_by)

    def _requeue(self) -> bool:
        job = os.environ.get("SLURM_JOB_ID")
        if job is None:
            return False
        if array := os.environ.get("SLURM_ARRAY_JOB_ID"):
            job = f"{array}_{os.environ['SLURM_ARRAY_TASK_ID']}"
        restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
        if restarts >= self.max_requeues:
            log.warning(f"job {job} was requeued {restarts} times already (max {self.max_requeues}); not again")
            return False
        result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
        if result.returncode:
            log.error(f"scontrol requeue {job} failed: {result.stderr.strip()}")
        return result.returncode == 0
