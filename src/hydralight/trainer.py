"""The Lightning Trainer and its callbacks, built from `trainer.*`, `callbacks.*` and the plan."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from hydra.utils import instantiate
from lightning_fabric.plugins.environments import SLURMEnvironment
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.callbacks import Callback, LearningRateMonitor, ModelCheckpoint
from pytorch_lightning.loggers import Logger
from pytorch_lightning.strategies import Strategy

from hydralight.errors import UserError
from hydralight.last_checkpoint import AtomicCheckpointIO, LastCheckpoint
from hydralight.plan import Plan
from hydralight.schema import PLANNED

# check_val_every_n_epoch=null: validate every `val_check_interval` steps, counted across epochs.
NULL_IS_A_SETTING = ("check_val_every_n_epoch",)


def build_callbacks(cfg: DictConfig, loggers: list[Logger]) -> list[Callback]:
    callbacks = [instantiate(spec) for spec in (cfg.get("callbacks") or {}).values() if spec is not None]
    # The LR monitor writes to a logger; with logger=none it would refuse to start.
    return [c for c in callbacks if loggers or not isinstance(c, LearningRateMonitor)]


def build_trainer(
    cfg: DictConfig,
    plan: Plan,
    strategy: str | Strategy,
    callbacks: list[Callback],
    loggers: list[Logger],
    shards_by_rank: bool = True,
) -> pl.Trainer:
    options: dict[str, Any] = OmegaConf.to_container(cfg.trainer, resolve=True)  # type: ignore[assignment]
    for key, owner in PLANNED.items():
        if options.get(key) is not None:
            raise UserError(f"trainer.{key} is set by the plan; set {owner} instead")
    # null means "Lightning's default", except where null is a setting of its own.
    options = {k: v for k, v in options.items() if (v is not None or k in NULL_IS_A_SETTING) and k not in PLANNED}
    options = instantiate(options, _convert_="all")  # e.g. trainer.profiler={_target_: ...}
    options.update(plan.trainer_kwargs(shards_by_rank))
    # Without our checkpoint callbacks (callbacks=none), Lightning's default one would write into the
    # logger's folder, where resume=auto never looks: such a run writes no checkpoint.
    if not any(isinstance(c, ModelCheckpoint | LastCheckpoint) for c in callbacks):
        options["enable_checkpointing"] = False
    # Budgets count optimizer steps (global batches), whatever the accumulation: Lightning counts micro-batches.
    limit = options.get("limit_train_batches")
    if isinstance(limit, int) and not isinstance(limit, bool):
        options["limit_train_batches"] = limit * plan.task.accumulation
    # Under srun the Preemption callback owns the signals; Lightning's own SLURM requeue stays off.
    plugins: list[Any] = [AtomicCheckpointIO()]
    if SLURMEnvironment.detect():
        plugins.append(SLURMEnvironment(auto_requeue=False))
    return pl.Trainer(
        **options,
        # Lightning looks for its own `hpc_ckpt_*` files there: never in the working directory.
        default_root_dir=cfg.paths.output_dir,
        plugins=plugins,
        strategy=strategy,
        callbacks=callbacks,
        logger=loggers or False,
    )
