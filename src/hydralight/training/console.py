"""What a run prints: its plan and run dir first, then progress and the result.

Lightning's banners and tips (device availability, "Tip: ...", the srun hint outside SLURM, why `fit`
stopped, checkpoint loading for the test) say nothing a user acts on; they are kept out of the console
and `train.log`. Real warnings pass.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING

from hydralight.data.contract import last_batch_note, replaced_by_plan
from hydralight.rundir.launch import is_rank_zero

if TYPE_CHECKING:
    from torch import nn

    from hydralight.config.plan import RunPlan

_console = logging.getLogger("hydralight.console")


def apply_extras(config: dict) -> None:
    """`extras.*` at the start of a run: hide Python warnings, print the composed config (rank 0)."""
    extras = config.get("extras") or {}
    if extras.get("ignore_warnings"):
        warnings.filterwarnings("ignore")
    if extras.get("print_config") and is_rank_zero():
        import yaml

        say("config:\n" + yaml.safe_dump(config, sort_keys=False).rstrip())


# The job's log file, for the processes it spawns (ddp_spawn ranks), where no Hydra job set up logging.
JOB_LOG_ENV = "HYDRALIGHT_JOB_LOG"


def say(text: str) -> None:
    """One line of the run for its reader: through logging, so that the run dir's log file holds what the
    console showed (the job's logging prints the message alone and files it with its time); where logging is
    not set up (a ddp_spawn rank) printed as it is, and added to the job's log file the same way."""
    if logging.getLogger().handlers and _console.isEnabledFor(logging.INFO):
        _console.info(text)
        return
    print(text, flush=True)
    if path := os.environ.get(JOB_LOG_ENV):
        from datetime import datetime

        stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
        with contextlib.suppress(OSError), open(path, "a") as log_file:
            log_file.write(f"[{stamp}][{_console.name}][INFO] - {text}\n")


def share_job_log() -> None:
    """Name this job's log file (the file handler Hydra's job logging opened) for the ranks it spawns."""
    files = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    if files:
        os.environ[JOB_LOG_ENV] = files[0].baseFilename
    else:
        os.environ.pop(JOB_LOG_ENV, None)


# Start of each message left out; the plan line says what runs where, the progress lines say where it stopped.
BANNERS = (
    "GPU available:",
    "TPU available:",
    "HPU available:",
    "LOCAL_RANK:",
    "💡 Tip:",
    "`Trainer.fit` stopped:",
    "`weights_only` was not set",
    # Resuming: the project's own line names the checkpoint it continues from and where in the epoch.
    "Restoring states from the checkpoint path",
    "Restored all states from the checkpoint",
    "You're resuming from a checkpoint that ended before the epoch ended",
    "Found current_model_state in the checkpoint",  # weight averaging continues its average
    # DDP set-up: the plan line says how many processes run.
    "Initializing distributed:",
    # A schedule sized by the run's steps (one-cycle) asks for them; the plan line already says the batch.
    "Loading `train_dataloader` to estimate number of stepping batches",
)
# Left out wherever they stand in a message (the DDP banner is framed by lines of dashes).
INSIDE = ("All distributed processes registered",)
# The test reloads the best checkpoint, which the result line names.
TEST_LOADING = ("Restoring states from the checkpoint path", "Loaded model weights from the checkpoint")
LOGGERS = (
    "pytorch_lightning.utilities.rank_zero",
    "lightning_fabric.utilities.rank_zero",
    "pytorch_lightning.accelerators.cuda",
    "pytorch_lightning.trainer.connectors.checkpoint_connector",
    "lightning_fabric.utilities.distributed",
)


class _Banners(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.testing = False

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith(BANNERS) or any(part in message for part in INSIDE):
            return False
        return not (self.testing and message.startswith(TEST_LOADING))


_BANNERS = _Banners()


def quiet_framework() -> None:
    """Keep Lightning's banners and tips out of this process's output (idempotent); name the job's log file
    for the ranks it may spawn."""
    share_job_log()
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if _BANNERS not in logger.filters:
            logger.addFilter(_BANNERS)
    # Lightning suggests srun whenever the command exists; a run outside SLURM was meant to be one.
    if "SLURM_JOB_ID" not in os.environ:
        warnings.filterwarnings("ignore", message="The `srun` command is available on your system")
    # Lightning-internal deprecation that users cannot act on, printed once per rank.
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    # The run dir's checkpoints folder holds the run's own checkpoints, which a resumed run continues.
    warnings.filterwarnings("ignore", message="Checkpoint directory .* exists and is not empty")
    # The history logs every epoch's end whatever the interval; short epochs lose nothing a user reads.
    warnings.filterwarnings("ignore", message="The number of training batches .* is smaller than the logging interval")
    warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch ended")


@contextlib.contextmanager
def testing() -> Iterator[None]:
    """While the test stage loads its checkpoint: the result line names it, Lightning need not; nor need it say
    that the checkpoint callback's state, saved in another run dir (`mode=eval`), is not reloaded: testing
    reads none of it."""
    _BANNERS.testing = True
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The dirpath has changed from")
            yield
    finally:
        _BANNERS.testing = False


def plan_line(plan: RunPlan, model: nn.Module) -> str:
    """The run plan in one line, with the model's size (the full table: `plan=true`) and the learning rate
    the module received from the plan, if it takes one."""
    hw, fw, task = plan.hardware, plan.framework, plan.task
    where = f"{hw.num_nodes} nodes x {hw.devices}" if hw.num_nodes > 1 else f"{hw.devices}"
    processes = f"{where} {hw.accelerator} process{'es' if hw.world_size > 1 else ''}"
    # A strategy asked for one process (strategy=ddp_spawn: a process of its own) is said too.
    strategy = f", {fw.strategy}" + (f" ({fw.backend})" if fw.backend else "") if fw.strategy != "auto" else ""
    split = f"{task.per_device_size} per device x {hw.world_size}" + (
        f" x {task.accumulation} accumulated" if task.accumulation > 1 else ""
    )
    params = sum(p.numel() for p in model.parameters())
    hparams = getattr(model, "hparams", {})
    lr = hparams.get("lr") if "lr" in hparams else (plan.model.offered.get("optimizer") or {}).get("lr")
    # Where it came from: the plan (optim.lr, scaled with the batch) or, for a module of your own, its default.
    own = " (the module's own)" if lr is not None and not plan.model.lr_offered else ""
    rate = f", lr {lr:g}{own}" if isinstance(lr, int | float) else ""
    import pytorch_lightning as pl
    from pytorch_lightning.utilities.model_helpers import is_overridden

    # Layers a module builds in `configure_model` do not exist yet: its size is told once it has them.
    later = params == 0 and isinstance(model, pl.LightningModule) and is_overridden("configure_model", model)
    size = "layers built in configure_model" if later else f"{params / 1e6:.2f}M params"
    import torch

    threads = torch.get_num_threads()  # in force now (the plan's cpus, or the OMP_NUM_THREADS set before the run)
    cpus = f"{hw.cpus_per_task} cpu{'s' if hw.cpus_per_task > 1 else ''} each" + (
        f", torch on {threads} thread{'s' if threads > 1 else ''}" if threads != hw.cpus_per_task else ""
    )
    return (
        f"plan: {processes} ({cpus}){strategy}, {fw.precision}; "
        f"global batch {task.global_size} ({split}){rate}; "
        f"model {model_name(model)} {size}"
    )


def model_name(model: nn.Module) -> str:
    """A module by its class and the classes of its children that hold weights: `LitModel(SimpleNet)`."""
    parts = [type(child).__name__ for child in model.children() if next(child.parameters(), None) is not None]
    return f"{type(model).__name__}({', '.join(parts)})" if parts else type(model).__name__


def show_start(plan: RunPlan, model: nn.Module, divides_batch: bool = False) -> None:
    """The first lines of a run: its plan and its run dir. `divides_batch`: the data module divides batch_size by
    the world size itself, and was given the global batch (its own note said so)."""
    say(plan_line(plan, model))
    for line in replaced_by_plan(plan.data.spec, plan.data.offered):
        if not (divides_batch and line.startswith("data.batch_size=")):
            say(f"note: {line}")
    if (last := last_batch_note(plan.data.spec, plan.data.offered)) is not None:
        say(f"note: {last}")
    from pytorch_lightning.utilities.model_helpers import is_overridden

    if plan.resume.mode == "train" and is_overridden("train_dataloader", model):
        say(
            f"note: {type(model).__name__} has a train_dataloader of its own, which this run does not use: it trains "
            f"on the data module's loaders ({plan.data.spec.get('_target_')}); give your data as a "
            "LightningDataModule (data._target_=...) to train on it"
        )
    say(f"run dir: {plan.paths.run_dir}")
