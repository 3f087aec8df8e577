"""Training the same network on 1 and N processes, for any module: the project's keyed layers put in, the
per-sample keys set around each training step, and a report of what a model or data uses that breaks it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pytorch_lightning as pl
import torch
from torch import nn

from hydralight.data.contract import batch_sample_ids
from hydralight.keyed import SampleDropout, sample_keys, set_keys, with_global_batchnorm, with_sample_dropout
from hydralight.lightning_internals import call_after_module_hook, restore_module_hooks, sync_epoch_values, unsync

log = logging.getLogger(__name__)


def make_invariant(module: nn.Module, invariant_dropout: bool, global_batchnorm: bool) -> nn.Module:
    """Put the keyed layers into any module: every torch dropout becomes SampleDropout (`model.invariant_dropout`)
    and, for BatchNorm over every rank on CPU (`model.sync_batchnorm`), every BatchNorm a GlobalBatchNorm.
    Neither has weights of its own, so checkpoints load either way."""
    if invariant_dropout:
        with_sample_dropout(module)
    if global_batchnorm:
        with_global_batchnorm(module)
    return module


def has_sample_dropout(module: nn.Module) -> bool:
    return any(isinstance(m, SampleDropout) for m in module.modules())


class SampleKeys(pl.Callback):
    """Keys the dropout of any module by (seed, epoch, sample id) during its training steps, when the data
    module's batches carry sample ids (`sample_ids = True`): the same masks on any rank and world size."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.active = False

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Only modules with keyed dropout need keys (the run adds this callback only then; one a user adds to
        # their own callbacks may meet any module).
        keyed = has_sample_dropout(pl_module)
        # `datamodule` is set on the Trainer by Lightning's data connector, not declared by the class.
        self.active = keyed and bool(getattr(getattr(trainer, "datamodule", None), "sample_ids", False))

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.active and (ids := batch_sample_ids(batch)) is not None:
            set_keys(sample_keys(self.seed, trainer.current_epoch, ids))

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        set_keys(None)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        set_keys(None)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        set_keys(None)


# torchvision transforms that draw random numbers per call (from the process's stream).
_RANDOM_TRANSFORM_WORDS = ("Random", "Augment", "ColorJitter", "GaussianBlur", "ElasticTransform", "RandAugment")


def _random_transforms(root: Any, depth: int = 5) -> list[str]:
    """Names of stochastic torchvision transforms reachable from `root`'s attributes."""
    found, seen = [], set()

    def walk(obj: Any, level: int) -> None:
        if id(obj) in seen or level > depth or isinstance(obj, torch.Tensor | str | bytes | int | float):
            return
        seen.add(id(obj))
        kind = type(obj)
        if kind.__module__.startswith("torchvision.transforms") and any(
            w in kind.__name__ for w in _RANDOM_TRANSFORM_WORDS
        ):
            found.append(kind.__name__)
        children = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, list | tuple) else None
        if children is None:
            children = getattr(obj, "__dict__", {}).values()
        for child in children:
            walk(child, level + 1)

    walk(root, 0)
    return sorted(set(found))


# The built-in model options (conf/model/*.yaml, the schema's `model`) have the key.
SET_SYNC_BATCHNORM = "set model.sync_batchnorm=true"
# A model config of the user's own (a LightningModule's constructor arguments) lacks it: Hydra refuses
# `model.sync_batchnorm=true` there as not a config key, while an added key reaches the project, not the module.
ADD_SYNC_BATCHNORM = (
    "add sync_batchnorm: true to the model's config, or ++model.sync_batchnorm=true on the command line"
)
# BatchNorm layers named in the advice before the rest are counted (a timm network has dozens).
_NAMED_LAYERS = 3


def batchnorm_advice(model_config: Mapping[str, Any]) -> str:
    """How BatchNorm over every rank is turned on for the run's model config: the key it has, or the one to add."""
    return SET_SYNC_BATCHNORM if "sync_batchnorm" in model_config else ADD_SYNC_BATCHNORM


def _batchnorm_layers(names: list[str]) -> str:
    """A network's BatchNorm layers, named (the first few) and counted."""
    if len(names) == 1:
        return f"BatchNorm {names[0]}"
    shown = ", ".join(names[:_NAMED_LAYERS]) + (
        f" and {len(names) - _NAMED_LAYERS} more" if len(names) > _NAMED_LAYERS else ""
    )
    return f"{len(names)} BatchNorm layers ({shown})"


def _batchnorm_reason(names: list[str], advice: str) -> str:
    """One reason for all of a network's per-process BatchNorms: the advice is the same for each."""
    if len(names) == 1:
        return f"{names[0]} is a BatchNorm over each process's micro-batch; {advice}"
    return f"{_batchnorm_layers(names)} normalize each process's micro-batch; {advice}"


def invariance_report(
    model: nn.Module,
    datamodule: Any,
    sync_batchnorm: bool,
    advice: str = SET_SYNC_BATCHNORM,
    accumulation: int = 1,
) -> dict[str, Any]:
    """Whether 1 and N processes train the same network with this model, data and `model.sync_batchnorm` as one
    process taking each step's batch whole, and, when not, why (what we cannot key); `advice`: how this run's
    config turns BatchNorm over every rank on (`batchnorm_advice`); `accumulation`: the micro-batches of a step."""
    reasons, batchnorms = [], []
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            reasons.append(f"{name} is torch's {type(module).__name__}: each process draws its own masks")
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            batchnorms.append(name)
    if batchnorms and accumulation > 1:
        # Over every rank or not, a BatchNorm normalizes the micro-batch in front of it, never the whole step.
        reasons.append(
            f"{_batchnorm_layers(batchnorms)} normalize{'s' if len(batchnorms) == 1 else ''} each of the "
            f"{accumulation} micro-batches of a step apart, not the step's whole batch: a run that accumulates "
            "another number of them (batch.max_per_device, other hardware) trains another network"
        )
    elif batchnorms and not sync_batchnorm:
        reasons.append(_batchnorm_reason(batchnorms, advice))
    if has_sample_dropout(model) and not getattr(datamodule, "sample_ids", False):
        reasons.append("the batches carry no sample ids (sample_ids = True): per-sample dropout falls back to torch's")
    if not getattr(datamodule, "shards_by_rank", False):
        reasons.append("the data module does not shard by rank itself: Lightning's sampler batches by world size")
    for transform in _random_transforms(datamodule):
        reasons.append(f"the data uses torchvision's {transform}: each process draws its own augmentation")
    return {"holds": not reasons, "reasons": reasons}


class InvarianceCheck(pl.Callback):
    """At the start of fit (the data set up, the model built): say whether 1 and N processes train alike
    with this model and data, and why not; the report goes into `into` (the run's manifest and results)."""

    def __init__(self, sync_batchnorm: bool, into: dict[str, Any], advice: str = SET_SYNC_BATCHNORM) -> None:
        self.sync_batchnorm = sync_batchnorm
        self.into = into
        self.advice = advice

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        datamodule = getattr(trainer, "datamodule", None)
        report = invariance_report(
            pl_module, datamodule, self.sync_batchnorm, self.advice, trainer.accumulate_grad_batches
        )
        self.into["world_size_invariance"] = report
        if not trainer.is_global_zero or report["holds"]:
            return
        # A note for runs on several processes or steps of several micro-batches; the reference (one process taking
        # each step whole) has only its record (manifest, results).
        if trainer.world_size > 1 or trainer.accumulate_grad_batches > 1:
            log.warning(
                "1 and N processes do NOT train alike with this model and data: " + "; ".join(report["reasons"])
            )


class EpochValuesOverRanks(pl.Callback):
    """In a run of several processes, a value a module logs for the epoch in validation or test (`self.log("val_loss",
    loss)` in a step, or a mean of the step outputs in `on_validation_epoch_end`, as Lightning's docs write both) is
    its mean over every rank's samples, as `sync_dist=True` makes it: the objective, the best checkpoint and the test
    results do not depend on the number of processes (by default Lightning keeps each rank's own share, and warns).
    Set after a loader's last batch and after the module's epoch-end hook, when Lightning computes the epoch's
    values; put back once the loop ends."""

    def __init__(self) -> None:
        self.changed: list[Any] = []

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if trainer.world_size > 1:
            for hook in ("on_validation_epoch_end", "on_test_epoch_end"):
                call_after_module_hook(trainer, pl_module, hook)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        restore_module_hooks(pl_module)

    def on_validation_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:  # fmt: skip
        counts = trainer.num_sanity_val_batches if trainer.sanity_checking else trainer.num_val_batches
        self._at_last(trainer, counts, batch_idx, dataloader_idx)

    def on_test_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:  # fmt: skip
        self._at_last(trainer, trainer.num_test_batches, batch_idx, dataloader_idx)

    def _at_last(self, trainer: pl.Trainer, counts: list[int | float], batch_idx: int, dataloader_idx: int) -> None:
        if dataloader_idx < len(counts) and batch_idx + 1 == counts[dataloader_idx]:
            self._sync(trainer)

    def _sync(self, trainer: pl.Trainer) -> None:
        if trainer.world_size > 1:
            self.changed += sync_epoch_values(trainer)

    def after_on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._sync(trainer)  # what the module's hook logged, before Lightning computes it

    after_on_test_epoch_end = after_on_validation_epoch_end

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        unsync(self.changed)
        self.changed = []

    on_test_end = on_validation_end
