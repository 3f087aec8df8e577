"""The Lightning Trainer and its callbacks, built from the plan's slices."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import urllib.error
from collections.abc import Iterator
from typing import Any, NoReturn

import pytorch_lightning as pl
from lightning_fabric.plugins.environments import (
    ClusterEnvironment,
    LightningEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)
from pytorch_lightning.callbacks import (
    Callback,
    Checkpoint,
    GradientAccumulationScheduler,
    ModelCheckpoint,
    WeightAveraging,
)
from pytorch_lightning.loggers import Logger
from pytorch_lightning.strategies import Strategy

from hydralight.config.binding import bind, import_target, instantiate
from hydralight.config.plan import RunPlan
from hydralight.errors import EXIT_USER_ERROR, UserError
from hydralight.lightning_internals import skip_unused_step_hooks
from hydralight.rundir.launch import external_launcher, is_rank_zero
from hydralight.rundir.layout import RunDir
from hydralight.training.checkpoint_io import AtomicCheckpointIO
from hydralight.training.epochs import EpochOfLastStep, LoggedAtItsStep
from hydralight.training.guards import FiniteLoss, ObjectiveLogged, PlannedBatch, accumulation_refused
from hydralight.training.invariance import (
    EpochValuesOverRanks,
    InvarianceCheck,
    SampleKeys,
    batchnorm_advice,
    has_sample_dropout,
)
from hydralight.training.modules import validates
from hydralight.training.step_metrics import StepMetricsAtValidation

log = logging.getLogger(__name__)


def build_callbacks(plan: RunPlan, module: pl.LightningModule, into: dict[str, Any], *own: Callback) -> list[Callback]:
    """The configured callbacks (`callbacks.*`), then the project's guards around `module` and `own` (the
    run's throughput, its resume state); `into`: the run record's extra fields, which the invariance check
    fills in."""
    checks = validates(module)
    # First: the configured callbacks log at batch start with the step it sets.
    callbacks: list[Callback] = [LoggedAtItsStep(), *configured_callbacks(plan, checks)]
    callbacks += [
        FiniteLoss(str(RunDir.at(plan.paths.run_dir).last), lr_key="optim.lr" if "lr" in module.hparams else None),
        # Only a module with keyed dropout needs keys: Lightning calls every callback at every hook of every step.
        *([SampleKeys(plan.seed)] if has_sample_dropout(module) else []),
        PlannedBatch(plan.task.per_device_size, RunDir.at(plan.paths.run_dir).rank_record, plan.task.accumulation),
        StepMetricsAtValidation(),
        EpochValuesOverRanks(),
        EpochOfLastStep(),
        InvarianceCheck(plan.model.sync_batchnorm, into=into, advice=batchnorm_advice(plan.config.get("model") or {})),
        *own,
    ]
    if checks:
        callbacks.append(ObjectiveLogged(plan.objective.metric))
    # An average of the weights is updated at each step's end before anything saves that step (a stop, a
    # periodic checkpoint), or the saved average would miss the step that a resumed run does not redo.
    return sorted(callbacks, key=lambda c: not isinstance(c, WeightAveraging))


def configured_callbacks(plan: RunPlan, validates: bool) -> list[Callback]:
    """The configured callbacks (`callbacks.*`), each given the run dir, its checkpoint folder and the run's
    seed where its constructor names them. A module without a validation step has no objective: the
    best-checkpoint callback is left out (last.ckpt is the run's checkpoint)."""
    run_dir = RunDir.at(plan.paths.run_dir)
    offered = {"run_dir": str(run_dir.path), "dirpath": str(run_dir.checkpoints), "seed": plan.seed}
    callbacks = []
    for name, spec in plan.callbacks.items():
        target = import_target(str(spec.get("_target_")), f"callbacks.{name}._target_")
        callback = instantiate(spec, **bind(target, spec, offered, f"callbacks.{name}"))
        if isinstance(callback, GradientAccumulationScheduler):
            raise accumulation_refused(f"callbacks.{name} accumulates by epoch")
        if isinstance(callback, ModelCheckpoint) and callback.monitor and not validates:
            log.info(
                f"no best checkpoint by {callback.monitor}: the module has no validation step "
                f"({run_dir.last} is the run's checkpoint)"
            )
            continue
        callbacks.append(callback)
    return callbacks


def cluster_environment(world_size: int) -> ClusterEnvironment:
    """Who started the ranks, as the plan saw it (not Lightning's guess, which takes any shell with SLURM
    variables for an srun launch and would read the allocation's task layout for ranks this run starts)."""
    launcher = external_launcher()
    if launcher == "torchrun":
        return TorchElasticEnvironment()
    if launcher == "slurm" or (world_size == 1 and SLURMEnvironment.detect()):
        # The Preemption callback owns the signals; Lightning's own SLURM requeue stays off.
        return SLURMEnvironment(auto_requeue=False)
    if world_size > 1 and "LOCAL_RANK" not in os.environ:  # the launching rank, before it starts the others
        _free_master_port()
    return LightningEnvironment()


def _free_master_port() -> None:
    """A MASTER_PORT left in the shell that another process listens on would hang the ranks' rendezvous past any
    deadline: another port is taken, said in one line (a value that is no port is refused)."""
    given = os.environ.get("MASTER_PORT")
    if given is None:
        return
    if not given.isdigit() or not 0 < int(given) < 65536:
        raise UserError(f"MASTER_PORT={given!r} in the environment is no port; unset it (a free port is chosen)")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((os.environ.get("MASTER_ADDR", "127.0.0.1"), int(given)))
            return
        except OSError:
            pass
    from lightning_fabric.plugins.environments.lightning import find_free_network_port

    os.environ["MASTER_PORT"] = str(find_free_network_port())
    log.warning(
        f"MASTER_PORT={given} from the environment is in use by another process; this run's ranks meet on port "
        f"{os.environ['MASTER_PORT']} instead (unset MASTER_PORT to have one chosen)"
    )


def build_trainer(
    plan: RunPlan,
    strategy: str | Strategy,
    callbacks: list[Callback],
    loggers: list[Logger],
    shards_by_rank: bool = True,
) -> pl.Trainer:
    options: dict[str, Any] = instantiate(plan.trainer_kwargs(shards_by_rank))  # e.g. a profiler's _target_
    # Without a checkpoint callback (callbacks=none), Lightning's default one would write into the
    # logger's folder, where a rerun never looks: such a run writes no checkpoint.
    if not any(isinstance(c, Checkpoint) for c in callbacks):
        options["enable_checkpointing"] = False
    plugins: list[Any] = [AtomicCheckpointIO(), cluster_environment(plan.hardware.world_size)]
    try:
        trainer = pl.Trainer(
            **options, plugins=plugins, strategy=strategy, callbacks=callbacks, logger=loggers or False
        )
    except RuntimeError as err:
        twins = re.search(r"more than one stateful callback of type `?(\w+)", str(err))
        if twins is None:
            raise
        raise UserError(
            f"two callbacks are {twins[1]}s with the same settings (the run's callbacks.model_checkpoint and one of "
            "yours, as a template adds it): a checkpoint cannot keep their states apart; set the run's own "
            "(callbacks.model_checkpoint.KEY=...) instead of adding another, or give yours another monitor, mode "
            "or interval"
        ) from None
    # With the ones Lightning added (progress bar, timer); its connector sets `callbacks`, the class does not declare it.
    skip_unused_step_hooks(trainer.callbacks)  # type: ignore[attr-defined]
    return trainer


# Lightning's rewording of torch's error (before a manual backward) and torch's own (at the next forward).
UNUSED_PARAMETERS = re.compile(
    r"parameters that were not used in producing the loss|Expected to have finished reduction in the prior iteration"
)


@contextlib.contextmanager
def lightning_refusals(accumulation: int = 1) -> Iterator[None]:
    """Settings Lightning refuses only once `fit` has the data (a validation interval longer than the epoch, an
    option of a user's module or data it rejects, parameters DDP finds unused), and a data folder or file that is
    not there, as one line instead of a traceback from its internals. `accumulation`: the micro-batches of an
    optimizer step, in which Lightning counts training batches."""
    from lightning_fabric.utilities.exceptions import MisconfigurationException
    from torch.multiprocessing import ProcessRaisedException

    try:
        yield
    except SystemExit as stop:
        # Lightning ends a Ctrl-C it caught before the project took the signal (fit's set-up, the sanity check)
        # with exit code 1 (`trainer/call.py`); it is a Ctrl-C, ended as one (130, a run dir begun for nothing goes).
        if type(stop) is SystemExit and stop.code == 1 and isinstance(stop.__context__, KeyboardInterrupt):
            raise KeyboardInterrupt from None
        raise
    except MisconfigurationException as err:
        said = _first_line(err)
        # Lightning names its own Trainer arguments; these the plan set from the user's keys.
        if "manual optimization" in said and "accumulate_grad_batches" in said:
            said = (
                f"a module with manual optimization cannot accumulate the plan's {accumulation} micro-batches a "
                "step: give batch.max_per_device at least the per-device share of batch.global_size (or "
                "batch.accumulation=1)"
            )
        elif "manual optimization" in said and "gradient_clip" in said:
            said = (
                "trainer.gradient_clip_val is not applied to a module with manual optimization: drop it, and clip "
                "in its training_step (self.clip_gradients)"
            )
        raise UserError(f"Lightning refuses this run's settings: {said}") from None
    except ProcessRaisedException as err:  # a ddp_spawn rank's error, in its parent: a refusal stays one line
        refused = [line for line in str(err).splitlines() if line.startswith(SPAWNED_REFUSAL)]
        if refused:
            raise UserError(refused[-1][len(SPAWNED_REFUSAL) :]) from None
        _unused_parameters(err)
    except RuntimeError as err:
        if str(err).startswith("Error(s) in loading state_dict"):  # torch's, as Lightning restores a checkpoint
            detail = " ".join(str(err).split("\n", 1)[-1].split())[:240]
            _refused_on_every_rank(
                f"the checkpoint does not fit the module this run builds ({detail}); continue it with the model "
                "settings it was trained with (its run's config.yaml), or start a new run in a new dir"
            )
        if str(err).startswith("Dataset not found"):  # torchvision's data sets, as a user's data module reads them
            _data_missing(f"the data set is not there ({_first_line(err)})")
        if str(err).startswith("Error downloading"):  # torchvision's download, every mirror tried
            _data_missing(f"the data could not be downloaded ({_first_line(err)})")
        _unused_parameters(err)
    except TypeError as err:
        if "inject a (distributed) sampler" not in str(err):
            raise
        _refused_on_every_rank(
            "the data module's training loader has a batch sampler that Lightning cannot split over the processes "
            "(it does not subclass torch's BatchSampler); let the data module shard its loaders by rank itself "
            "(trainer.global_rank, trainer.world_size) and say so with `shards_by_rank = True` on its class, or run "
            "on 1 process"
        )
    except urllib.error.URLError as err:  # a data module's own download
        _data_missing(f"the data could not be downloaded ({err})")
    except (FileNotFoundError, NotADirectoryError) as err:  # a path of the data config (a user's data module)
        missing = f"{err.filename or err} is missing ({err.strerror or type(err).__name__}"
        opener = _opened_outside_the_data(err)
        if opener is None:
            _data_missing(f"{missing}, where the run reads its data)")
        _refused_on_every_rank(f"{missing}, opened by {opener}); check the path its config gives, or make it")
    except ValueError as err:
        counts = re.match(r"`val_check_interval` \((\d+)\).*?\((\d+)\)", str(err).strip())
        if counts is None:
            raise
        interval, batches = (int(count) // accumulation for count in counts.groups())
        raise UserError(
            f"trainer.val_check_interval={interval} is more than the {batches} training batches of an epoch; "
            f"validate within the epoch (at most {batches}), or count across epochs with "
            "trainer.check_val_every_n_epoch=null"
        ) from None


def _opened_outside_the_data(err: BaseException) -> str | None:
    """Where a file was opened, when not by the data (a data module, a data set, a loader): the innermost frame of
    the code that did (`Module.training_step (file:line)`), so a module's own missing file is not blamed on data.*."""
    import torch.utils.data

    frames = []
    tb = err.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    data_code = ("/torch/utils/data/", "/torchvision/datasets/")
    for frame in frames:
        owner = frame.f_locals.get("self")
        if isinstance(owner, pl.LightningDataModule | torch.utils.data.Dataset) or any(
            part in frame.f_code.co_filename for part in data_code
        ):
            return None
    own = [
        f for f in frames if "site-packages" not in f.f_code.co_filename and "/lib/python" not in f.f_code.co_filename
    ]
    frame = (own or frames)[-1]
    return f"{frame.f_code.co_qualname} ({frame.f_code.co_filename}:{frame.f_lineno})"


def _refused_on_every_rank(message: str) -> NoReturn:
    """A refusal every rank meets alike (the same settings, data and checkpoint): rank 0 says it, for the run,
    and the others leave quietly."""
    if not is_rank_zero():
        raise SystemExit(EXIT_USER_ERROR) from None
    raise UserError(message) from None


def _data_missing(what: str) -> NoReturn:
    _refused_on_every_rank(f"{what}; check the path the data config gives (data.*), or put the files there")


# How a spawned rank's UserError ends the text of the exception its parent receives.
SPAWNED_REFUSAL = f"{UserError.__module__}.{UserError.__qualname__}: "


def _unused_parameters(err: BaseException) -> None:
    """DDP reduces every parameter's gradient after each backward; a step that leaves some without one (a GAN's
    discriminator step, a branch some batches skip) fails at the next backward or forward, on every rank: one
    line instead. Any other error is raised as it is."""
    if not UNUSED_PARAMETERS.search(str(err)):
        raise err
    _refused_on_every_rank(
        "DDP found parameters that received no gradient in a training step (some of the module's parameters "
        "are not used in its loss, or only by another optimizer); set strategy.find_unused_parameters=true"
    )


def _first_line(err: BaseException) -> str:
    return " ".join(str(err).split())
