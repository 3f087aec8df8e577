"""What a checkpoint carries beyond Lightning's own state, and what a continued run checks and applies once
Lightning has restored it: for any module, by callback.

Saved: the run's record (which module, built from which config, for which data sizes and global batch),
the random state (a resumed run draws the same dropout masks as an uninterrupted one), and the
hyperparameters as plain data (a module built by Hydra holds objects in them; the checkpoint stays readable
with `weights_only=True`). On loading: the loop state of a loader without a position is rewound to the
start of its epoch; a schedule of another length is refused; a new learning rate is applied to the
restored optimizer when no schedule sets the rates, refused otherwise.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import pytorch_lightning as pl
import torch

from hydralight.errors import EXIT_USER_ERROR, UserError
from hydralight.lightning_internals import (
    forget_train_loader,
    loader_state_saved,
    mid_epoch,
    plateau_step_pending,
    record_loop_state,
    spawned_rank,
)

log = logging.getLogger(__name__)

RECORD = "hydralight"
LR_CHANGES = "hydralight_lr_changes"  # a continued run's changes of the learning rate, with their steps
# The plateau schedulers' steps due at the end of the epoch a checkpoint was saved in: their metric, and where
# each stood (Lightning skips that step when it resumes from there).
PLATEAU_PENDING = "hydralight_plateau_pending"
# Scheduler state that fixes the schedule's length (OneCycleLR, CosineAnnealingLR).
LENGTH_KEYS = ("total_steps", "T_max")
PLAIN = (type(None), bool, int, float, str)


def new_run_from(source: Any, what: str) -> str:
    """The way out of a continuation that cannot go on: a new run, in a dir of its own, from `source`'s weights
    (in the same dir it would replace the run's results and checkpoints)."""
    return f"start a new run from {what} in a new dir: init_from={source}, leaving hydra.run.dir and resume= out"


def plain_value(value: Any, spec: Any = None) -> Any:
    """`value` as plain data (numbers, strings, lists, dicts): an object built from a config (a network, a
    `_partial_` optimizer) is saved as that config, `spec`, or else by its type's name."""
    if isinstance(value, PLAIN):
        return value
    if isinstance(value, list | tuple):
        return [plain_value(v) for v in value]
    if isinstance(value, dict):
        return {
            str(k): plain_value(v, (spec or {}).get(k) if isinstance(spec, dict) else None) for k, v in value.items()
        }
    if spec is not None:
        return spec
    kind = type(value)
    return f"<{kind.__module__}.{kind.__qualname__}>"


def plain_hparams(hparams: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """A module's hyperparameters as plain data, objects replaced by the config they were built from."""
    return {str(k): plain_value(v, spec.get(k)) for k, v in dict(hparams).items()}


def epochs_done(checkpoint: dict[str, Any]) -> int:
    """The epochs a checkpoint's run has completed, as Lightning's fit loop counts them for `max_epochs`."""
    progress = (((checkpoint.get("loops") or {}).get("fit_loop") or {}).get("epoch_progress") or {}).get("current")
    return int((progress or {}).get("processed", checkpoint.get("epoch") or 0))


def moved_with_the_run(state: dict[str, Any], dirpath: str) -> None:
    """A checkpoint callback's saved state, kept to this run's checkpoint folder. Where the run dir was moved or
    copied since, its best checkpoints are the ones in this folder (Lightning would forget them for another
    folder, and keep a best path into the old one), and a file not found here is left out, so nothing is read
    from or removed in the old. Wherever it was saved, a path that leads out of the folder (`../`, a link: a
    crafted checkpoint) is left out too: Lightning removes a best checkpoint a better one replaces."""
    old = str(state.get("dirpath") or "").rstrip("/")
    moved = bool(old) and os.path.realpath(old) != os.path.realpath(dirpath)
    inside = os.path.realpath(dirpath) + os.sep

    def here(path: Any) -> str | None:
        if not isinstance(path, str) or not path:
            return None
        if moved:
            if not path.startswith(f"{old}/"):
                return None
            path = os.path.join(dirpath, path[len(old) + 1 :])
            if not os.path.isfile(path):
                return None
        return path if os.path.realpath(path).startswith(inside) else None

    if moved:
        state["dirpath"] = dirpath
    for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
        if state.get(key):
            state[key] = here(state.get(key)) or ""
    if isinstance(state.get("best_k_models"), dict):
        state["best_k_models"] = {kept: score for path, score in state["best_k_models"].items() if (kept := here(path))}
    if "best_model_path" in state and not state["best_model_path"]:
        state["best_model_score"] = None


def configured_lrs(optimizer_states: Any) -> list[list[float]] | None:
    """The learning rate each optimizer's parameter groups were configured with (a one-cycle schedule's peak, another
    schedule's starting rate: not where it has taken them), from optimizer states; None when they are not plain optimizer states (a
    sharded checkpoint's)."""
    try:
        return [
            [float(group.get("max_lr", group.get("initial_lr", group["lr"]))) for group in state["param_groups"]]
            for state in optimizer_states
        ]
    except (KeyError, TypeError, ValueError):
        return None


def _first_change(saved: list[list[float]], fresh: list[list[float]]) -> tuple[float, float] | None:
    """The first rate (then, now) that differs, where both runs have the same optimizers and groups."""
    if [len(g) for g in saved] != [len(g) for g in fresh]:
        return None
    pairs = (pair for then, now in zip(saved, fresh, strict=True) for pair in zip(then, now, strict=True))
    return next(((a, b) for a, b in pairs if a != b), None)


def _plateau_steps_due(trainer: pl.Trainer) -> list[dict[str, Any]]:
    """The plateau schedulers' steps Lightning has still to take at the end of this epoch, when a checkpoint is
    saved there: the metric each is stepped with (as Lightning reads it), the epoch, and its scheduler's count."""
    if trainer.state.fn != "fit" or not plateau_step_pending(trainer):
        return []
    due = []
    for index, config in enumerate(trainer.lr_scheduler_configs):
        if not config.reduce_on_plateau or config.interval != "epoch" or (trainer.current_epoch + 1) % config.frequency:
            continue
        value = trainer.callback_metrics.get(config.monitor) if config.monitor else None
        if value is not None:
            steps = getattr(config.scheduler, "last_epoch", None)
            due.append({"scheduler": index, "epoch": trainer.current_epoch, "value": float(value), "steps": steps})
    return due


class ResumeState(pl.Callback):
    """Saves the run's record, the random state and plain hyperparameters into every checkpoint; checks and
    applies a continued run's changes once Lightning restored the checkpoint (see the module)."""

    def __init__(self, record: dict[str, Any], into: dict[str, Any], finished_before: bool = False) -> None:
        self.record = record  # module, model spec, data sizes, global batch: what a continued run is checked against
        self.into = into  # the run's results: how it continued
        self.finished_before = finished_before  # the run dir holds a finished run: a budget it reached is refused
        self._reached: tuple[int, int] = (0, 0)  # the checkpoint's optimizer steps and completed epochs
        self._restored_schedulers: list[dict[str, Any]] = []
        self._saved_lrs: list[list[float]] | None = None  # the checkpoint's configured rates, optimizer by group
        self._saved_lr: float | None = None  # its module's `lr` hyperparameter, where its optimizers' are not plain
        # The rates to set once the optimizers are restored, and the first change (then, now).
        self._apply_lr: tuple[list[list[float]], tuple[float, float]] | None = None
        self._checks_on_load = False
        self._lr_changes: list[dict[str, Any]] = []  # a continued run's changes of the learning rate, in order
        self._plateau_pending: list[dict[str, Any]] = []  # a loaded checkpoint's (PLATEAU_PENDING)

    # -- saving ---------------------------------------------------------------------------------------

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        checkpoint[RECORD] = self.record
        if self._lr_changes:
            checkpoint[LR_CHANGES] = self._lr_changes
        if pending := _plateau_steps_due(trainer):
            checkpoint[PLATEAU_PENDING] = pending
        checkpoint["rng"] = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            checkpoint["rng"]["cuda"] = torch.cuda.get_rng_state_all()
        spec = self.record.get("model") or {}
        for key in ("hyper_parameters", "datamodule_hyper_parameters"):
            if key in checkpoint:
                checkpoint[key] = plain_hparams(checkpoint[key], spec if key == "hyper_parameters" else {})

    # -- loading --------------------------------------------------------------------------------------

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        rng = checkpoint.get("rng", {})
        if "torch" in rng:
            torch.set_rng_state(rng["torch"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        if trainer.state.fn != "fit":
            return
        for callback in trainer.checkpoint_callbacks:
            state = (checkpoint.get("callbacks") or {}).get(getattr(callback, "state_key", None))
            dirpath = getattr(callback, "dirpath", None)  # a ModelCheckpoint's folder
            if isinstance(state, dict) and isinstance(dirpath, str):
                moved_with_the_run(state, dirpath)
        if mid_epoch(checkpoint) and not loader_state_saved(checkpoint):
            # The training loader keeps no position: the epoch it stopped in starts over.
            record_loop_state(checkpoint, "epoch start", checkpoint.get("global_step", 0))
            self.into["resumed_at"] = "the start of the epoch (the training loader keeps no position in it)"
            log.info("the training loader keeps no position inside an epoch: continuing from the start of the epoch")
        elif mid_epoch(checkpoint):
            self.into["resumed_at"] = "inside the epoch, after its last trained batch"
        self._reached = (int(checkpoint.get("global_step") or 0), epochs_done(checkpoint))
        self._lr_changes = [dict(change) for change in checkpoint.get(LR_CHANGES, [])]
        if self._lr_changes:
            self.into["learning_rate_changes"] = self._lr_changes
        self._restored_schedulers = list(checkpoint.get("lr_schedulers", []))
        self._plateau_pending = list(checkpoint.get(PLATEAU_PENDING) or [])
        self._saved_lrs = configured_lrs(checkpoint.get("optimizer_states"))
        self._saved_lr = (checkpoint.get("hyper_parameters") or {}).get("lr")
        if self._checks_on_load:  # fit started before the checkpoint was read: checked now, before it is applied
            self._checks_on_load = False
            forget_train_loader(trainer)
            self._check_continuation(trainer, pl_module)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Runs after `configure_optimizers`, before Lightning restores the optimizers and the loop; a strategy that
        # restores the checkpoint only after setting up (fsdp) reads it after this hook: the checks wait for it.
        if trainer.strategy.restore_checkpoint_after_setup:  # its checkpoint (if any) is not even named yet
            self._checks_on_load = True
            return
        if not trainer.ckpt_path:
            return
        forget_train_loader(trainer)
        self._check_continuation(trainer, pl_module)

    def _check_continuation(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A continued run's settings against its checkpoint's: a schedule of another length, another learning
        rate under a schedule, a budget already reached are refused before anything trains. Every rank reads the
        same checkpoint and settings: rank 0 says it, once."""
        try:
            self._compare(trainer, pl_module)
        except UserError:
            if trainer.global_rank != 0 and not spawned_rank(trainer):
                raise SystemExit(EXIT_USER_ERROR) from None
            raise

    def _compare(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        source = trainer.ckpt_path
        for config in trainer.lr_scheduler_configs:
            state = config.scheduler.state_dict()
            for saved in self._restored_schedulers:
                for key in LENGTH_KEYS:
                    now, then = state.get(key), saved.get(key)
                    if now is not None and then is not None and now != then:
                        raise UserError(
                            f"{source} follows a {type(config.scheduler).__name__} schedule of {then} steps and this "
                            f"run would take {now}: its length is fixed when training starts; keep "
                            "trainer.max_epochs/max_steps as they were to continue it, or "
                            f"{new_run_from(source, 'its weights and a fresh schedule')}"
                        )
        # The rates the module's optimizers start with, against those its checkpoint's were configured with: read
        # from the optimizers, so a module that keeps its rate under any name (or in no hparams) is compared.
        fresh = configured_lrs([{"param_groups": optimizer.param_groups} for optimizer in trainer.optimizers])
        if self._saved_lrs is not None and fresh is not None:
            changed = _first_change(self._saved_lrs, fresh)
        else:  # a sharded checkpoint's optimizer states: its module's `lr` hyperparameter, if it keeps one
            saved_lr, new = self._saved_lr, pl_module.hparams.get("lr")
            changed = (saved_lr, new) if saved_lr is not None and new is not None and new != saved_lr else None
            fresh = [[changed[1]] * len(o.param_groups) for o in trainer.optimizers] if changed else None
        if changed and trainer.lr_scheduler_configs:
            saved_lr, new = changed
            raise UserError(
                f"the learning rate {new:g} differs from {saved_lr:g} that {source} was trained with, and its "
                "schedule set its rates when it started; keep optim.lr (and batch.global_size, with lr scaling) as "
                f"they were, or {new_run_from(source, 'its weights and a fresh optimizer')}"
            )
        self._something_to_train(trainer)
        if changed and fresh is not None:
            self._apply_lr = (fresh, changed)

    def _something_to_train(self, trainer: pl.Trainer) -> None:
        """A finished run continued with a budget it already reached would only test and record again: refused,
        its results.json and metrics.csv left as they were."""
        if not self.finished_before:
            return  # an attempt stopped before its test: continuing it tests and records
        step, epochs = self._reached
        limits = {"trainer.max_steps": (trainer.max_steps, step), "trainer.max_epochs": (trainer.max_epochs, epochs)}
        reached = [
            f"{key}={limit}" for key, (limit, done) in limits.items() if limit not in (None, -1) and done >= limit
        ]
        if reached:
            refused = UserError(
                f"nothing to train: this run finished at step {step} with {epochs} whole epoch(s), which "
                f"{' and '.join(reached)} already reach{'es' if len(reached) == 1 else ''}; raise "
                f"{'it' if len(reached) == 1 else 'them'} (or set one to -1 to leave the other budget to decide) to "
                "train on, or give this changed config a run dir of its own (hydra.run.dir=DIR) to run it anew; the "
                "run's results are left as they were"
            )
            refused.before_any_result = True
            raise refused

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # The plateau steps due at the end of the epoch the checkpoint was saved in, before the next epoch trains:
        # each where its scheduler still stands where it did (Lightning skipped it as it resumed).
        configs, due = trainer.lr_scheduler_configs, []
        for entry in self._plateau_pending:
            if trainer.current_epoch <= entry["epoch"]:
                due.append(entry)  # that epoch is still running (a resume inside it)
            elif trainer.current_epoch == entry["epoch"] + 1 and entry["scheduler"] < len(configs):
                scheduler = configs[entry["scheduler"]].scheduler
                if getattr(scheduler, "last_epoch", None) == entry["steps"]:
                    pl_module.lr_scheduler_step(scheduler, entry["value"])
        self._plateau_pending = due

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._apply_lr is None:
            return
        fresh, (old, new) = self._apply_lr
        for optimizer, rates in zip(trainer.optimizers, fresh, strict=True):
            for group, rate in zip(optimizer.param_groups, rates, strict=True):
                group["lr"] = rate
        log.info(f"learning rate {old:g} -> {new:g}: applied to the restored optimizer")
        # The run's records give the new rate; each change, and the step it took effect at, travels in the
        # checkpoints and is recorded in results.json.
        self._lr_changes.append({"step": trainer.global_step, "from": old, "to": new})
        self.into["learning_rate_changes"] = self._lr_changes
        self._apply_lr = None
