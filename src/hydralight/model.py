"""Networks that follow their task's sizes, and the LightningModule that trains any of them as a classifier.

A network learns the task's sizes through its constructor: `num_classes` and `input_shape` (C, H, W, as
the data module delivers them) are passed to any `_target_` whose signature names them. The defaults
are MNIST's, so networks saved before the sizes were passed rebuild as they were.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torchmetrics import MeanMetric, SumMetric
from torchmetrics.classification import MulticlassAccuracy

from hydralight.errors import UserError
from hydralight.invariance import SampleDropout, keyed, sample_keys, with_global_batchnorm, with_sample_dropout

MNIST_SHAPE = (1, 28, 28)
log = logging.getLogger(__name__)


class SeedCNN(nn.Sequential):
    """conv32 -> conv64 -> max-pool -> fc128 -> classes, the classic MNIST example network."""

    def __init__(self, dropout: float = 0.25, num_classes: int = 10, input_shape: Sequence[int] = MNIST_SHAPE) -> None:
        c, h, w = input_shape
        super().__init__(
            nn.Conv2d(c, 32, 3), nn.ReLU(),
            nn.Conv2d(32, 64, 3), nn.ReLU(),
            nn.MaxPool2d(2), nn.Dropout(dropout), nn.Flatten(),
            nn.Linear(64 * ((h - 4) // 2) * ((w - 4) // 2), 128), nn.ReLU(), nn.Dropout(2 * dropout),
            nn.Linear(128, num_classes),
        )  # fmt: skip


class MLP(nn.Sequential):
    """C*H*W -> hidden... -> classes with ReLU."""

    def __init__(
        self,
        hidden: list[int] = (128, 256),  # type: ignore[assignment]
        num_classes: int = 10,
        input_shape: Sequence[int] = MNIST_SHAPE,
    ) -> None:
        sizes = [math.prod(input_shape), *hidden]
        layers: list[nn.Module] = [nn.Flatten()]
        for n_in, n_out in itertools.pairwise(sizes):
            layers += [nn.Linear(n_in, n_out), nn.ReLU()]
        super().__init__(*layers, nn.Linear(sizes[-1], num_classes))


class FastCNN(nn.Sequential):
    """Two conv + BatchNorm blocks (5x5 by default) and one hidden layer: cheap per sample, quick to converge.

    `pooled` > 0 pools the last feature map to pooled x pooled before the head, so large images keep a
    small head; 0 flattens the whole map (a quarter of the image per side, as on 28x28 digits).
    `kernels` are the two convolutions' sizes (odd: "same" padding keeps the map's size before each pool).
    """

    def __init__(
        self,
        channels: list[int] = (16, 32),  # type: ignore[assignment]
        hidden: int = 128,
        conv_bias: bool = True,
        num_classes: int = 10,
        input_shape: Sequence[int] = MNIST_SHAPE,
        pooled: int = 0,
        kernels: Sequence[int] = (5, 5),
    ) -> None:
        c1, c2 = channels
        c, h, w = input_shape
        k1, k2 = kernels
        if k1 % 2 == 0 or k2 % 2 == 0:
            raise ValueError(f"FastCNN kernels={list(kernels)}: use odd sizes (e.g. [5, 3])")
        # conv_bias=false (model=fastcnn): a bias before BatchNorm is removed by the normalization, its
        # gradient is rounding noise that Adam turns into steps. The default keeps older checkpoints loadable.
        head: list[nn.Module] = [nn.AdaptiveAvgPool2d(pooled)] if pooled else []
        side = (pooled, pooled) if pooled else (h // 4, w // 4)
        super().__init__(
            nn.Conv2d(c, c1, k1, padding=k1 // 2, bias=conv_bias), nn.BatchNorm2d(c1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, k2, padding=k2 // 2, bias=conv_bias), nn.BatchNorm2d(c2), nn.ReLU(), nn.MaxPool2d(2),
            *head, nn.Flatten(), nn.Linear(c2 * side[0] * side[1], hidden), nn.ReLU(), nn.Linear(hidden, num_classes),
        )  # fmt: skip


def small_resnet(
    arch: str = "resnet18", num_classes: int = 10, input_shape: Sequence[int] = MNIST_SHAPE, **kwargs: Any
) -> nn.Module:
    """A torchvision ResNet for small images: a 3x3 stride-1 stem without max-pool (the ImageNet stem
    would shrink a 28x28 or 32x32 image to 7x7 or 8x8 before the first block), any input channel count."""
    from torchvision import models

    net = getattr(models, arch)(weights=None, num_classes=num_classes, **kwargs)
    net.conv1 = nn.Conv2d(input_shape[0], net.conv1.out_channels, 3, stride=1, padding=1, bias=False)
    net.maxpool = nn.Identity()
    return net


def build_net(spec: dict[str, Any], num_classes: int, input_shape: Sequence[int]) -> nn.Module:
    """The network of a `_target_` spec, given the task's sizes where its constructor names them
    (explicit settings in the spec win)."""
    target = get_object(spec["_target_"]) if "_target_" in spec else None
    try:
        params = inspect.signature(target).parameters if target is not None else {}
    except (TypeError, ValueError):  # builtins without a signature
        params = {}
    sizes = {"num_classes": num_classes, "input_shape": list(input_shape)}
    named = {k for k in sizes if k in params}
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        named.add("num_classes")  # torchvision's builders pass **kwargs on to a model that takes num_classes
    return instantiate(spec, **{k: sizes[k] for k in named if k not in spec})


def run_length_kwargs(factory: Any, lr: float, total_steps: int) -> dict[str, Any]:
    """Arguments a scheduler needs that only the run knows (peak LR, number of steps)."""
    params = inspect.signature(getattr(factory, "func", factory)).parameters
    known = {"max_lr": lr, "total_steps": total_steps, "T_max": total_steps}
    return {k: v for k, v in known.items() if k in params and k not in getattr(factory, "keywords", {})}


class Classifier(pl.LightningModule):
    """Cross-entropy classifier around a network built from its Hydra config.

    The network and optimizer configs are saved as hyper-parameters, so a checkpoint rebuilds its own
    architecture: `Classifier.load_from_checkpoint(path)` needs no config.
    """

    def __init__(
        self,
        net: dict[str, Any],
        optimizer: dict[str, Any],
        lr: float,
        scheduler: dict[str, Any] | None = None,
        seed: int = 0,
        invariant_dropout: bool = True,
        global_batchnorm: bool = False,
        num_classes: int = 10,
        input_shape: Sequence[int] = MNIST_SHAPE,
        compile: dict[str, Any] | None = None,
        channels_last: bool = False,
    ) -> None:
        super().__init__()
        # How the network runs (compiled, memory layout) is not what it is: a checkpoint loads anywhere.
        self.save_hyperparameters(ignore=["compile", "channels_last"])
        self.net = build_net(net, num_classes, input_shape)
        num_classes = net.get("num_classes", num_classes)  # a size set in the network's config wins
        self.compile_options = compile
        self.channels_last = channels_last
        if channels_last:
            self.net.to(memory_format=torch.channels_last)
        # Kept out of the module tree: the state_dict keys stay the plain network's.
        self.__dict__["_compiled"] = None
        # Dropout masks keyed by (seed, epoch, sample id) instead of each process's random stream, and
        # BatchNorm statistics over every rank's micro-batch: the same training on 1 or N processes.
        if invariant_dropout:
            with_sample_dropout(self.net)
        if global_batchnorm:
            with_global_batchnorm(self.net)
        # Only networks with keyed dropout need the per-sample keys: the others skip computing them each step.
        self._keyed = any(isinstance(m, SampleDropout) for m in self.net.modules())
        # The loss is checked for NaN in training_step already; the Metric's own check syncs with the GPU.
        self.train_loss = MeanMetric(nan_strategy="disable")
        self.metrics = nn.ModuleDict(
            {
                f"{stage}_{name}": metric
                for stage in ("val", "test")
                for name, metric in (
                    ("loss", MeanMetric()),
                    ("acc", MulticlassAccuracy(num_classes, average="micro")),
                    ("samples", SumMetric()),  # proves each sample is counted once, whatever the world size
                )
            }
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The data arrives as float32; a 64-true or bf16-true network takes its own dtype.
        x = x.to(self.dtype)
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return self._runner()(x)

    def _runner(self) -> nn.Module:
        """The network, compiled on first use when asked (on the device it trains on, after DDP wrapped it)."""
        if not self.compile_options:
            return self.net
        if self._compiled is None:
            self.__dict__["_compiled"] = torch.compile(self.net, **self.compile_options)
        return self._compiled

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        x, y, *ids = batch  # a data module that knows its samples adds their ids: (x, y, ids)
        keys = sample_keys(self.hparams.seed, self.current_epoch, ids[0]) if ids and self._keyed else None
        with keyed(keys):
            loss = F.cross_entropy(self(x), y)
        if not torch.isfinite(loss):
            # Stop before this step's update reaches the weights or a checkpoint: the last one stays good.
            raise UserError(
                f"the loss is {loss.item()} at step {self.global_step} (epoch {self.current_epoch}); "
                f"lower optim.lr (now {self.hparams.lr:g}) or set trainer.gradient_clip_val; {self._kept_state()}"
            )
        # The step value is this rank's, logged as it is; the epoch value is reduced over all ranks and
        # samples once per epoch (a Metric's forward on every step would cost more than the step itself).
        self.train_loss.update(loss.detach(), len(y))
        self._log_train_loss(loss.detach(), len(y))
        return loss

    def _log_train_loss(self, loss: torch.Tensor, batch_size: int) -> None:
        """Hand the loss to Lightning only when it is used: a `self.log` costs more than a cheap step.

        The step value at the steps Lightning writes to the loggers (every `trainer.log_every_n_steps`)
        and at the last of an epoch or of the run (the progress lines show the latest); the epoch Metric
        once per epoch and trainer, which keeps it in the epoch's results (Lightning computes and resets
        it at the epoch end) while `update` above accumulates every step.
        """
        trainer = self.trainer
        last = trainer.is_last_batch or 0 < trainer.max_steps <= self.global_step + 1
        if last or trainer._logger_connector.should_update_logs or trainer.fast_dev_run:
            self.log("train/loss_step", loss, on_step=True, on_epoch=False, prog_bar=True, batch_size=batch_size)
        epoch = (id(trainer), self.current_epoch)
        if getattr(self, "_train_loss_logged", None) != epoch:
            self._train_loss_logged = epoch
            self.log("train/loss_epoch", self.train_loss, on_step=False, on_epoch=True, batch_size=batch_size)

    def _kept_state(self) -> str:
        last = Path(self.trainer.default_root_dir) / "checkpoints" / "last.ckpt"
        if not last.is_file():
            return "no checkpoint was saved before it"
        step = torch.load(last, map_location="cpu", weights_only=True, mmap=True).get("global_step")
        return f"{last} (step {step}) holds the last state saved before it"

    def _evaluate(self, stage: str, batch: tuple[torch.Tensor, ...]) -> None:
        x, y = batch[0], batch[1]
        logits = self(x)
        loss, acc, samples = (self.metrics[f"{stage}_{name}"] for name in ("loss", "acc", "samples"))
        # Metric objects are synced over ranks at epoch end, weighted by samples, not averaged per rank.
        loss(F.cross_entropy(logits, y), len(y))
        acc(logits, y)
        samples(len(y))
        self.log(f"{stage}/loss", loss, on_epoch=True, batch_size=len(y))
        self.log(f"{stage}/acc", acc, on_epoch=True, prog_bar=True, batch_size=len(y))
        self.log(f"{stage}/samples", samples, on_epoch=True, batch_size=len(y))

    def validation_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> None:
        self._evaluate("val", batch)

    def test_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> None:
        self._evaluate("test", batch)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # The epoch's running training loss, summed over ranks: a run resumed inside the epoch reports
        # the same epoch mean as an uninterrupted one. Zero at an epoch boundary (the next epoch starts anew).
        inside_epoch = (
            not self.trainer.is_last_batch and self.trainer.fit_loop.epoch_loop.batch_progress.current.processed
        )
        running = torch.stack([self.train_loss.mean_value, self.train_loss.weight]).double()
        if self.trainer.world_size > 1:
            running = self.trainer.strategy.reduce(running, reduce_op="sum")
        checkpoint["train_loss_running"] = (running if inside_epoch else torch.zeros(2)).tolist()
        # Random state too, so that a resumed run draws the same dropout masks as an uninterrupted one.
        checkpoint["rng"] = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            checkpoint["rng"]["cuda"] = torch.cuda.get_rng_state_all()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        source = str(self._trainer.ckpt_path) if self._trainer is not None else "the checkpoint"
        self.check_task_sizes(checkpoint.get("hyper_parameters", {}), source)
        self._restored_schedulers = checkpoint.get("lr_schedulers", [])
        trainer = self._trainer
        if trainer is not None and trainer.precision == "64-true":
            # Lightning loads the weights before it converts the module to float64: they would pass
            # through float32 on the way and a resumed run would drift from an uninterrupted one.
            self.double()
        if trainer is not None and trainer.state.fn == "fit":
            self._changed_lr = self._check_continued_settings(checkpoint.get("hyper_parameters", {}))
        total, weight = checkpoint.get("train_loss_running", (0.0, 0.0))
        if trainer is not None and trainer.global_rank == 0:  # rank 0 carries it; the others start at zero
            self.train_loss.mean_value = torch.tensor(total, dtype=self.train_loss.mean_value.dtype)
            self.train_loss.weight = torch.tensor(weight, dtype=self.train_loss.weight.dtype)
        rng = checkpoint.get("rng", {})
        if "torch" in rng:
            torch.set_rng_state(rng["torch"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])

    def check_task_sizes(self, saved: dict[str, Any], source: str) -> None:
        """Refuse weights trained for other data sizes (another dataset) in one line, before loading them."""
        then = (saved.get("num_classes", 10), tuple(saved.get("input_shape", MNIST_SHAPE)))
        now = (self.hparams.num_classes, tuple(self.hparams.input_shape))
        if then != now:
            raise UserError(
                f"{source} was trained on data with {then[0]} classes of shape {list(then[1])}, this run's data has "
                f"{now[0]} classes of shape {list(now[1])}; pick the data it was trained on, or start a new run dir"
            )

    def configure_optimizers(self) -> Any:
        lr = self.hparams.lr
        optimizer = instantiate(self.hparams.optimizer)(self.parameters(), lr=lr)
        if not self.hparams.scheduler:
            return optimizer
        factory = instantiate(self.hparams.scheduler)
        total = int(self.trainer.estimated_stepping_batches)
        # Estimating builds the training loader before a checkpoint is restored, and Lightning then never
        # gives it the saved position in the epoch: let it be built again after the restore.
        self.trainer.fit_loop._combined_loader = None
        scheduler = factory(optimizer, **run_length_kwargs(factory, lr, total))
        self._check_schedule_length(scheduler)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def _check_continued_settings(self, then: dict[str, Any]) -> tuple[float, float] | None:
        """Settings changed since the checkpoint this run continues: the learning rate of a run without a
        schedule is applied (returned as (then, now)); any other optimizer or schedule change is refused."""
        ckpt = self.trainer.ckpt_path
        way_out = f"or start a new run from its weights with a fresh optimizer: init_from={ckpt} resume=never"
        for key in ("optimizer", "scheduler"):
            if key in then and then[key] != self.hparams[key]:
                raise UserError(
                    f"optim.{key} differs from the one {ckpt} was trained with ({describe(then[key])}, now "
                    f"{describe(self.hparams[key])}); keep it to continue that run, {way_out}"
                )
        old, new = then.get("lr"), self.hparams.lr
        if old is None or old == new:
            return None
        if self.hparams.scheduler:
            raise UserError(
                f"the learning rate {new:g} differs from {old:g} that {ckpt} was trained with, and its schedule set "
                f"its rates when it started; keep optim.lr (and batch.global_size, with lr scaling) as they were, {way_out}"
            )
        return old, new

    def on_train_start(self) -> None:
        changed = getattr(self, "_changed_lr", None)
        if changed:
            for group in self.trainer.optimizers[0].param_groups:
                group["lr"] = changed[1]
            log.info(f"learning rate {changed[0]:g} -> {changed[1]:g}: applied to the restored optimizer")
            self._changed_lr = None

    def _check_schedule_length(self, scheduler: Any) -> None:
        """Refuse to continue a schedule whose length was fixed at its start with another length."""
        state = scheduler.state_dict()
        for saved in getattr(self, "_restored_schedulers", []):
            for key in LENGTH_KEYS:
                now, then = state.get(key), saved.get(key)
                if now is None or then is None or now == then:
                    continue
                name, ckpt = type(scheduler).__name__, self.trainer.ckpt_path
                raise UserError(
                    f"{ckpt} follows a {name} schedule of {then} steps and this run would take {now}: its length "
                    "is fixed when training starts; keep trainer.max_epochs/max_steps as they were to continue it, "
                    f"or start a new run from its weights with a fresh schedule: init_from={ckpt} resume=never"
                )


def describe(spec: Any) -> str:
    """A `_target_` config in one short phrase: `Adam(weight_decay=0.0)`, `MLP(hidden=[128, 256])`."""
    if not isinstance(spec, dict):
        return str(spec)
    target = str(spec.get("_target_", "?")).rsplit(".", 1)[-1]
    args = ", ".join(f"{k}={v}" for k, v in spec.items() if not k.startswith("_"))
    return f"{target}({args})"


# Scheduler state that fixes the schedule's length (OneCycleLR, CosineAnnealingLR).
LENGTH_KEYS = ("total_steps", "T_max")


def build_model(
    cfg: DictConfig,
    lr: float,
    global_batchnorm: bool = False,
    num_classes: int = 10,
    input_shape: Sequence[int] = MNIST_SHAPE,
) -> Classifier:
    """A fresh classifier from the config, with the learning rate and BatchNorm kind the plan decided and
    the sizes of the task's data."""
    scheduler = cfg.optim.get("scheduler")
    return Classifier(
        net=OmegaConf.to_container(cfg.model.net),
        optimizer=OmegaConf.to_container(cfg.optim.optimizer),
        scheduler=OmegaConf.to_container(scheduler) if scheduler else None,
        lr=lr,
        seed=int(cfg.seed),
        invariant_dropout=bool(cfg.model.get("invariant_dropout", True)),
        global_batchnorm=global_batchnorm,
        num_classes=num_classes,
        input_shape=tuple(input_shape),
        **runtime_options(cfg),
    )


def runtime_options(cfg: DictConfig) -> dict[str, Any]:
    """How the network runs: `model.compile` (torch.compile with `model.compile_mode`) and `model.channels_last`."""
    compiled = {"mode": cfg.model.get("compile_mode") or "default"} if cfg.model.get("compile") else None
    return {"compile": compiled, "channels_last": bool(cfg.model.get("channels_last"))}


def task_sizes(datamodule: Any) -> dict[str, Any]:
    """`num_classes` and `input_shape` from a data module that states them (the contract of hydralight.data);
    a data module that does not leaves the network's own defaults or its config to decide."""
    return {key: getattr(datamodule, key) for key in ("num_classes", "input_shape") if hasattr(datamodule, key)}
