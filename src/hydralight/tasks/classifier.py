"""The built-in task: a cross-entropy classifier around any network (`model.net`), trained like any other
LightningModule the run is given. What every module gets (keyed dropout, the NaN stop, resume, the records)
the core adds through callbacks; this module holds only what classification needs.

The network, optimizer and schedule configs are saved as hyperparameters, so a checkpoint rebuilds its
own architecture.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Sequence
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from torch import nn
from torchmetrics import MeanMetric, Metric, SumMetric
from torchmetrics.classification import MulticlassAccuracy

from hydralight.errors import UserError, run_config_check
from hydralight.tasks.nets import MNIST_SHAPE, build_net

ADAM = {"_target_": "torch.optim.Adam", "_partial_": True}
# torch.compile modes that replay CUDA graphs: their outputs live in a memory pool the next replay overwrites.
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


class Classifier(pl.LightningModule):
    """Cross-entropy on batches `(x, y)` or `(x, y, ids)`: `y` class indices, `x` what the network takes.

    `net` is the network's `_target_` spec (built here, sized by the data) or a network built already.
    `lr` is the plan's (after batch-size scaling); `optimizer` and `scheduler` are `_partial_` specs
    (`optim.*`): a scheduler's `max_lr`, `total_steps` or `T_max` are filled in from the run.
    `compile`, `compile_mode` and `channels_last` say how the network runs, not what it is: they are left
    out of checkpoints, which load anywhere.
    """

    # What it declares to the run (hydralight.config.declaration), as any module may.
    # Its batches carry their sample ids (the built-in data modules' third element): they key its dropout.
    takes_sample_ids = True
    # Its learning rate is the plan's, whatever the optim option: the default below is for use outside a run.
    lr_from_plan = True
    # How the network runs, not what it is: a checkpoint is tested with this run's choice of them.
    how_it_runs = ("compile", "compile_mode", "channels_last")

    @classmethod
    def check_config(cls, config: dict[str, Any]) -> None:
        """Refuse values of its config before anything is built or launched."""
        smoothing = config.get("label_smoothing", 0.0)
        if isinstance(smoothing, int | float) and not 0.0 <= smoothing < 1.0:
            raise ValueError(
                f"model.label_smoothing={smoothing} is out of range: use a number from 0.0 up to (not) 1.0"
            )

    def __init__(
        self,
        net: dict[str, Any] | nn.Module,
        lr: float = 1.0e-3,
        optimizer: dict[str, Any] | None = None,
        scheduler: dict[str, Any] | None = None,
        num_classes: int = 10,
        input_shape: Sequence[int] = MNIST_SHAPE,
        label_smoothing: float = 0.0,
        compile: bool = False,
        compile_mode: str = "default",
        channels_last: bool = False,
    ) -> None:
        super().__init__()
        run_config_check(self.check_config, {"label_smoothing": label_smoothing})
        self.save_hyperparameters(ignore=list(self.how_it_runs))
        if isinstance(net, nn.Module):  # built already (a config instantiated recursively): sized by its own config
            self.net = net
        else:
            self.net = build_net(net, num_classes, input_shape)
            num_classes = net.get("num_classes", num_classes)  # a size set in the network's config wins
        self.compile_mode = compile_mode if compile else None
        self.channels_last = channels_last
        if channels_last:
            self.net.to(memory_format=torch.channels_last)
        # Kept out of the module tree: the state_dict keys stay the plain network's.
        self.__dict__["_compiled"] = None
        # The loss is checked for NaN by the run (a callback); the Metric's own check would sync with the GPU.
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
        if not self._replays_graphs(x):
            return self._runner()(x)
        # Each call is a step of its own, and what it hands back outlives the next replay (a logged value, a
        # loss still to be backpropagated through after a validation): a copy of its own.
        torch.compiler.cudagraph_mark_step_begin()
        return self._runner()(x).clone()

    def _replays_graphs(self, x: torch.Tensor) -> bool:
        return self.compile_mode in CUDA_GRAPH_MODES and x.is_cuda

    def on_after_backward(self) -> None:
        # Gradients computed by a replayed graph are in its pool too: copied before the next replay overwrites
        # them (an accumulated micro-batch, the optimizer of a later step, the model moved at the end).
        if self.compile_mode in CUDA_GRAPH_MODES:
            for param in self.net.parameters():
                if param.grad is not None and param.grad.is_cuda:
                    param.grad = param.grad.clone()

    def _runner(self) -> nn.Module:
        """The network, compiled on first use when asked (on the device it trains on, after DDP wrapped it)."""
        if self.compile_mode is None:
            return self.net
        if self._compiled is None:
            self.__dict__["_compiled"] = torch.compile(self.net, mode=self.compile_mode)
        compiled = self._compiled
        assert isinstance(compiled, nn.Module)  # torch.compile of a module is a module (OptimizedModule)
        return compiled

    @staticmethod
    def inputs_and_labels(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """`(x, y)` of a batch; one clear line for a batch this task cannot train on."""
        if isinstance(batch, tuple | list) and len(batch) in (2, 3) and all(torch.is_tensor(b) for b in batch[:2]):
            x, y = batch[0], batch[1]
            if y.dim() == 1 and not y.is_floating_point() and not y.is_complex() and len(y) == len(x):
                return x, y
            raise UserError(
                f"the built-in classifier needs class indices as labels (one integer per sample); the data module's "
                f"labels are {y.dtype} of shape {list(y.shape)}: for another task (regression, several targets) "
                "train a LightningModule of your own (model._target_=...)"
            )
        raise UserError(
            f"the built-in classifier trains on batches (inputs, labels) or (inputs, labels, ids); the data module "
            f"yields {_describe(batch)}: train a LightningModule of your own on it (model._target_=...)"
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = self.inputs_and_labels(batch)
        loss = F.cross_entropy(self(x), y, label_smoothing=self.hparams["label_smoothing"])
        # The epoch value is reduced over all ranks and samples once per epoch (a Metric's forward on every step
        # would cost more than the step itself).
        self.train_loss.update(loss.detach(), len(y))
        self._log_train_loss(loss.detach(), len(y), batch_idx)
        return loss

    def _log_train_loss(self, loss: torch.Tensor, batch_size: int, batch_idx: int) -> None:
        """Hand the loss to Lightning only when it is used: a `self.log` costs more than a cheap step.

        The step value is the mean loss of the step's whole batch (its accumulated micro-batches, over every
        rank: the same on any hardware, as the step is), at the steps Lightning writes to the loggers (every
        `trainer.log_every_n_steps`) and at the last step before a validation or the end, which the run's
        StepMetricsAtValidation callback writes to the loggers there (curves of short runs have points, and the
        progress lines show the latest); the epoch Metric once per epoch and trainer, which keeps it in the
        epoch's results (Lightning computes and resets it at the epoch end) while `update` above accumulates
        every step.
        """
        trainer = self.trainer
        total, count = getattr(self, "_step_loss", (0.0, 0))
        self._step_loss = (total + loss * batch_size, count + batch_size)
        if (batch_idx + 1) % trainer.accumulate_grad_batches and not trainer.is_last_batch:
            return  # the step's batch is not whole yet (Lightning's own rule for stepping)
        (total, count), self._step_loss = self._step_loss, (0.0, 0)
        step = self.global_step + 1  # the optimizer step this batch ends
        last = trainer.is_last_batch or 0 < trainer.max_steps <= step or trainer.should_stop
        validates = isinstance(trainer.val_check_batch, int) and step % max(1, trainer.val_check_batch) == 0
        # Both set on the Trainer by Lightning's connectors, which its class does not declare.
        every, fast_dev_run = trainer.log_every_n_steps, trainer.fast_dev_run  # type: ignore[attr-defined]
        written = step % max(1, every) == 0 or bool(fast_dev_run)
        if last or validates or written:  # the same steps on every rank: the mean over them is taken there
            mean = total / count
            self.log("train/loss_step", mean, on_step=True, on_epoch=False, prog_bar=True, batch_size=count,
                     sync_dist=trainer.world_size > 1)  # fmt: skip
        epoch = (id(trainer), self.current_epoch)
        if getattr(self, "_train_loss_logged", None) != epoch:
            self._train_loss_logged = epoch
            self.log("train/loss_epoch", self.train_loss, on_step=False, on_epoch=True, batch_size=batch_size)

    def _evaluate(self, stage: str, batch: Any) -> None:
        x, y = self.inputs_and_labels(batch)
        logits = self(x)
        loss, acc, samples = (self._metric(f"{stage}_{name}") for name in ("loss", "acc", "samples"))
        # Metric objects are synced over ranks at epoch end, weighted by samples, not averaged per rank.
        loss(F.cross_entropy(logits, y), len(y))
        acc(logits, y)
        samples(len(y))
        self.log(f"{stage}/loss", loss, on_epoch=True, batch_size=len(y))
        self.log(f"{stage}/acc", acc, on_epoch=True, prog_bar=True, batch_size=len(y))
        self.log(f"{stage}/samples", samples, on_epoch=True, batch_size=len(y))

    def _metric(self, name: str) -> Metric:
        metric = self.metrics[name]
        assert isinstance(metric, Metric)  # every entry of self.metrics is one
        return metric

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate("val", batch)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate("test", batch)

    def predict_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        """Class probabilities of a batch `x`, `(x, y)` or `(x, y, ids)`, with the labels (-1: none) and sample
        ids it carries: what hydralight.training.predictions writes as one CSV row per sample."""
        if torch.is_tensor(batch):
            return {"probabilities": self(batch).float().softmax(-1)}
        x, y = self.inputs_and_labels(batch)
        out = {"probabilities": self(x).float().softmax(-1), "labels": y}
        if len(batch) == 3:
            out["ids"] = batch[2]
        return out

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # The epoch's running training loss, summed over ranks: a run resumed inside the epoch reports the
        # same epoch mean as an uninterrupted one. Zero at an epoch boundary (the next epoch starts anew).
        trainer = self.trainer
        running = torch.stack([self.train_loss.mean_value, self.train_loss.weight]).double()
        if trainer.world_size > 1:
            running = trainer.strategy.reduce(running, reduce_op="sum")
        inside_epoch = not trainer.is_last_batch and bool(running[1] > 0)
        checkpoint["train_loss_running"] = (running if inside_epoch else torch.zeros(2)).tolist()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        total, weight = checkpoint.get("train_loss_running", (0.0, 0.0))
        trainer = self._trainer
        if trainer is not None and trainer.global_rank == 0:  # rank 0 carries it; the others start at zero
            self.train_loss.mean_value = torch.tensor(total, dtype=self.train_loss.mean_value.dtype)
            self.train_loss.weight = torch.tensor(weight, dtype=self.train_loss.weight.dtype)

    def configure_optimizers(self) -> Any:
        lr = self.hparams["lr"]
        spec = self.hparams["optimizer"] or ADAM
        with _refused_as("optim.optimizer", spec):
            optimizer = _factory(spec)(self.parameters(), lr=lr)
        if not self.hparams["scheduler"]:
            return optimizer
        total = int(self.trainer.estimated_stepping_batches)
        with _refused_as("optim.scheduler", self.hparams["scheduler"], total):
            factory = _factory(self.hparams["scheduler"])
            scheduler = factory(optimizer, **run_length_kwargs(factory, lr, total))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def _factory(spec: Any) -> Any:
    """The optimizer or scheduler factory of a `_partial_` config, or the config already built (a subclass
    named by `model._target_` is built recursively, as a user's module is)."""
    return spec if callable(spec) else instantiate(spec)


@contextlib.contextmanager
def _refused_as(key: str, spec: Any, steps: int | None = None) -> Iterator[None]:
    """The optimizer or schedule a config asks for, refused in one line when torch refuses its values."""
    target = str(spec.get("_target_", "?")).rsplit(".", 1)[-1] if hasattr(spec, "get") else "?"
    try:
        yield
    except ZeroDivisionError:  # a schedule whose phases round to no step (OneCycleLR: pct_start x steps = 1)
        raise UserError(
            f"{key} ({target}) cannot schedule a run of {steps} optimizer steps: one of its phases would last no "
            "step; run more steps or change the schedule's phases (e.g. optim.scheduler.pct_start)"
        ) from None
    except (ValueError, TypeError, IndexError, InstantiationException) as err:  # out of range, unknown, too few
        # The first line (OmegaConf adds the key's details below); Hydra's hint: the line is the whole story.
        reason = str(err).strip().splitlines()[0].split(", set env var HYDRA_FULL_ERROR")[0]
        raise UserError(f"{key} ({target}) refuses its config: {reason}; fix or remove that value") from None


def run_length_kwargs(factory: Any, lr: float, total_steps: int) -> dict[str, Any]:
    """Arguments a scheduler needs that only the run knows (peak LR, number of steps)."""
    params = inspect.signature(getattr(factory, "func", factory)).parameters
    known = {"max_lr": lr, "total_steps": total_steps, "T_max": total_steps}
    return {k: v for k, v in known.items() if k in params and k not in getattr(factory, "keywords", {})}


def _describe(batch: Any) -> str:
    if torch.is_tensor(batch):
        return f"a single {batch.dtype} tensor of shape {list(batch.shape)} (no labels)"
    if isinstance(batch, dict):
        return f"dicts with keys {', '.join(map(str, batch))}"
    if isinstance(batch, tuple | list):
        parts = ", ".join(f"{b.dtype}{list(b.shape)}" if torch.is_tensor(b) else type(b).__name__ for b in batch)
        return f"{type(batch).__name__}s of {len(batch)} ({parts})"
    return f"{type(batch).__name__} objects"
