"""Resolving a composed config into the run plan (hydralight.config.plan), once, before anything is written.

The resources in three layers, each depending on the one before (hardware -> framework -> task), then
what the run builds (model, data, trainer, callbacks, loggers) and what it starts from (the resume
decision). Checks that need arithmetic (a batch that does not divide) are made here; checks that need the
machine (GPUs that are not there) by `check_plan`.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from hydralight.config.capacity import check_capacity
from hydralight.config.declaration import ModuleDeclaration
from hydralight.config.plan import (
    OWNERS,
    DataPlan,
    FrameworkPlan,
    HardwarePlan,
    Machine,
    ModelPlan,
    ObjectivePlan,
    PathsPlan,
    ResumePlan,
    RunPlan,
    TaskPlan,
)
from hydralight.config.schema import (
    LR_SCALING,
    PLANNED,
    PRECISIONS,
    STRATEGIES,
    ModuleOptions,
    override_key,
    set_by_plan,
)
from hydralight.config.trust import SHIPPED_CONF, check_trusted, configured_targets
from hydralight.errors import UserError
from hydralight.rundir.launch import external_launcher, is_rank_zero
from hydralight.rundir.layout import RunDir, not_a_checkpoint_file
from hydralight.rundir.record import read_json, read_yaml_record

# The project's options of any module, applied by the core (hydralight.keyed), never passed to a constructor.
MODULE_OPTIONS = tuple(f.name for f in fields(ModuleOptions))
# Values the plan decides for a module, and where a user sets them instead of in `model.*` (a module of your own
# may keep its own learning rate, unless it says `lr_from_plan = True`).
MODEL_OWNED = {"lr": "optim.lr", "seed": "seed"}
# check_val_every_n_epoch=null: validate every `val_check_interval` steps, counted across epochs.
NULL_IS_A_SETTING = ("check_val_every_n_epoch",)
# Settings a continued run may change: how long it trains.
EXTENDABLE = ("trainer.max_epochs", "trainer.max_steps")
# ... and what it runs on, which changes none of its steps (the global batch and its order hold on any layout).
RUNS_ON = ("hardware", "strategy", "batch.max_per_device", "batch.accumulation")


def _runs_on(key: str) -> bool:
    return any(key == root or key.startswith(f"{root}.") for root in RUNS_ON)


# trainer.max_epochs=null with no step or time budget: the project's default length.
DEFAULT_EPOCHS = 2


@dataclass(frozen=True)
class JobInfo:
    """What Hydra knows of the running job: where it writes and what the command line chose."""

    run_dir: str
    sweep_dir: str | None = None
    job_name: str | None = None
    overrides: list[str] = field(default_factory=list)
    choices: dict[str, Any] = field(default_factory=dict)


def as_container(cfg: DictConfig | dict[str, Any]) -> dict[str, Any]:
    """The config as plain containers: interpolations resolved, choices as plain strings."""
    if isinstance(cfg, dict):
        return cfg
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)  # type: ignore[return-value]


def resolve(cfg: DictConfig | dict[str, Any], machine: Machine, job: JobInfo) -> RunPlan:
    """The run plan of a composed config on `machine`; `auto` values are read off the machine."""
    if isinstance(cfg, DictConfig):  # a job Hydra composed, on any process (a SLURM node, a torchrun rank)
        from hydralight.config.compose import check_composed

        check_composed(cfg)
    config = as_container(cfg)
    config, run_dir = resumed_config(config, job)
    c = OmegaConf.create(config)
    _check_top_level(c)
    _check_starting_points(c)
    hw, fw, task = resources(c, machine)
    paths = PathsPlan(run_dir=run_dir, sweep_dir=job.sweep_dir, job_name=job.job_name, overrides=list(job.overrides))
    model, data = _model(c, task, job), _data(c, task, job)
    if not model.lr_offered:  # the module's own rate stands: the plan records it, when it can be told
        own = _module_lr(model.spec)
        task = replace(task, base_lr=own, lr_scaling="none", lr=own)
    # The records hold what is built: the arguments of a replaced option (`model._target_=my.Module`) that the new
    # module does not take are not in them.
    for group, spec in (("model", model.spec), ("data", data.spec)):
        config[group] = {k: v for k, v in config[group].items() if k in spec or k in MODULE_OPTIONS}
    return RunPlan(
        seed=int(c.seed),
        hardware=hw,
        framework=fw,
        task=task,
        model=model,
        data=data,
        trainer=_trainer(c, hw, fw, task, run_dir, _eval_batch_fixed(data.spec)),
        callbacks=_callbacks(c.get("callbacks"), fw.strategy),
        loggers=_specs(c.get("logger")),
        paths=paths,
        resume=_resume(c, config, run_dir),
        objective=ObjectivePlan(str(c.objective.metric), str(c.objective.direction)),
        config=config,
    )


def check_objective(metric: str) -> None:
    """A run, a sweep and a search choose by validation, never by the test set."""
    if metric.startswith("test/"):
        raise UserError(
            f"objective.metric={metric} is a test metric; tune on validation, e.g. objective.metric=val/acc"
        )


# Names of metrics where lower is better: a loss or an error by name, or one of the usual ones by its short name.
LOWER_IS_BETTER = re.compile(
    r"loss|error|(^|[_.-])(err|mse|mae|rmse|msle|mape|nll|ce|ppl|perplexity|bpc|bpd|bits|wer|cer|fid|distance)([_.-]|$)"
)


def _check_best_checkpoint(c: DictConfig) -> None:
    """The best checkpoint is chosen by the objective, in its direction: a loss maximised, or the shipped
    best-checkpoint callback set to another metric or mode, would keep (and test) the worst checkpoint."""
    metric, direction = str(c.objective.metric), str(c.objective.direction)
    lower = lambda name: LOWER_IS_BETTER.search(name.split("/")[-1].lower()) is not None  # noqa: E731
    if direction == "max" and lower(metric):
        raise UserError(
            f"objective.metric={metric} is maximised (objective.direction=max): the run would keep its highest "
            f"{metric} as its best; add objective.direction=min"
        )
    best = (c.get("callbacks") or {}).get("model_checkpoint")
    if not isinstance(best, Mapping) or not str(best.get("_target_", "")).endswith(".epochs.BestCheckpoint"):
        return
    for key, value, owner in (("monitor", metric, "objective.metric"), ("mode", direction, "objective.direction")):
        if best.get(key) is not None and str(best.get(key)) != value:
            wanted = f"{owner}={best.get(key)}"
            if key == "monitor" and direction == "max" and lower(str(best.get(key))):
                wanted += " objective.direction=min"
            raise UserError(
                f"callbacks.model_checkpoint.{key}={best.get(key)} differs from {owner}={value}, which chooses the "
                f"best checkpoint (and what a sweep tunes on); set {wanted} instead"
            )


def _check_starting_points(c: DictConfig) -> None:
    """What a run starts from is applied or refused, never ignored: `mode=eval` tests `ckpt_path`; `init_from`
    starts a new run from weights, `ckpt_path` continues one."""
    # (A model set on the command line: see resume.policy, which reads the checkpoint.)
    if c.mode in ("eval", "predict"):
        if c.get("init_from") is not None:
            uses = "tests" if c.mode == "eval" else "predicts with"
            raise UserError(f"mode={c.mode} {uses} ckpt_path; init_from would be ignored: drop it")
        if c.ckpt_path and _run_dir_given(c):
            uses = "test" if c.mode == "eval" else "predict with"
            raise UserError(
                f"ckpt_path={c.ckpt_path} and resume={c.resume} both name the checkpoint to {uses}; keep one"
            )
    elif c.get("init_from") is not None and c.get("ckpt_path") is not None:
        raise UserError(
            f"init_from={c.init_from} (a new run from those weights) and ckpt_path={c.ckpt_path} (continue that "
            "run) are both given; keep one"
        )


def _check_top_level(c: DictConfig) -> None:
    check_objective(str(c.objective.metric))
    _check_best_checkpoint(c)
    if c.extras.enforce_tags and not c.tags:
        raise UserError("extras.enforce_tags=true and the run has no tags: give it some, e.g. 'tags=[baseline,v2]'")
    seed = c.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise UserError(f"seed={seed} must be an integer from 0 to 2**32-1; use e.g. seed=42")
    if c.mode not in ("train", "eval", "predict"):
        raise UserError(f"mode={c.mode} is not a mode; use mode=train, mode=eval or mode=predict")
    if c.mode in ("eval", "predict") and not c.ckpt_path and not _run_dir_given(c):
        uses = "test" if c.mode == "eval" else "predict with"
        raise UserError(
            f"mode={c.mode} needs the checkpoint to {uses}: add ckpt_path=PATH/TO/file.ckpt, or resume=RUN_DIR "
            "(that run's best checkpoint)"
        )
    source = (c.get("predict") or {}).get("source")
    if source is not None and c.mode != "predict":
        raise UserError(f"predict.source={source} is read by mode=predict only; add mode=predict, or drop it")
    _check_ranges(c)


# Trainer counts and budgets: (key, what is allowed, check). Lightning refuses most of these only after the run
# dir is written, with a traceback; -1 means "no limit" where Lightning reads it so.
def _count(low: int, *special: int) -> Any:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and (v >= low or v in special)


def _fraction_or_count(v: Any) -> bool:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    return v >= 0 if isinstance(v, int) else 0.0 <= v <= 1.0


TRAINER_RANGES = (
    ("max_epochs", "-1 (no limit) or an integer >= 1", _count(1, -1)),
    ("min_epochs", "an integer >= 0", _count(0)),
    ("max_steps", "-1 (no limit) or an integer >= 1", _count(1, -1)),
    ("min_steps", "an integer >= 0", _count(0)),
    ("limit_train_batches", "a number of batches >= 0 or a fraction from 0.0 to 1.0", _fraction_or_count),
    ("limit_val_batches", "a number of batches >= 0 or a fraction from 0.0 to 1.0", _fraction_or_count),
    ("limit_test_batches", "a number of batches >= 0 or a fraction from 0.0 to 1.0", _fraction_or_count),
    ("limit_predict_batches", "a number of batches >= 0 or a fraction from 0.0 to 1.0", _fraction_or_count),
    ("overfit_batches", "a number of batches >= 0 or a fraction from 0.0 to 1.0", _fraction_or_count),
    ("val_check_interval", "a number of batches >= 1 or a fraction of the epoch above 0.0 up to 1.0",
     lambda v: _fraction_or_count(v) and v > 0),
    ("check_val_every_n_epoch", "an integer >= 1", _count(1)),
    ("num_sanity_val_steps", "-1 (all) or an integer >= 0", _count(0, -1)),
    ("log_every_n_steps", "an integer >= 1", _count(1)),
    ("gradient_clip_val", "a number >= 0", lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v >= 0),
)  # fmt: skip


# auto: online with a login and a server that answers, else offline; the rest are wandb's own modes.
WANDB_MODES = ("auto", "online", "offline", "disabled", "shared", "dryrun", "run")
# What Lightning's Timer takes for trainer.max_time: "DD:HH:MM:SS", or timedelta's arguments as a mapping.
MAX_TIME = re.compile(r"\d+:\d\d:\d\d:\d\d")
TIMEDELTA_KEYS = {"weeks", "days", "hours", "minutes", "seconds", "milliseconds", "microseconds"}


def _duration(value: Any) -> bool:
    if isinstance(value, str):
        return MAX_TIME.fullmatch(value.strip()) is not None
    if isinstance(value, Mapping):
        amounts = list(value.values())
        numbers = all(isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in amounts)
        return bool(value) and set(value) <= TIMEDELTA_KEYS and numbers
    return False


def _check_ranges(c: DictConfig) -> None:
    """Values whose type is right but whose value cannot run, refused before anything is written."""
    trainer = c.get("trainer") or {}
    for key, allowed, ok in TRAINER_RANGES:
        value = trainer.get(key)
        if value is not None and not ok(value):
            raise UserError(f"trainer.{key}={value} is out of range: use {allowed}")
    if c.get("mode", "train") == "train" and trainer.get("limit_train_batches") == 0:
        # Lightning would skip training and report the test of the untrained weights as the run's result.
        raise UserError(
            f"trainer.limit_train_batches={trainer.get('limit_train_batches')} trains nothing; give a number of "
            "batches >= 1 to train, or test a "
            "trained run with mode=eval resume=<its run dir>"
        )
    wandb = (c.get("logger") or {}).get("wandb")
    mode = wandb.get("mode") if isinstance(wandb, Mapping) else None
    if mode is not None and mode not in WANDB_MODES:
        raise UserError(f"logger.wandb.mode={mode} is not allowed; use one of {', '.join(WANDB_MODES[:4])}")
    if (clip := trainer.get("gradient_clip_algorithm")) not in (None, "norm", "value"):
        raise UserError(f"trainer.gradient_clip_algorithm={clip} is not allowed; use norm or value")
    if (budget := trainer.get("max_time")) is not None and not _duration(budget):
        raise UserError(
            f"trainer.max_time={budget} is not a duration: use DD:HH:MM:SS (trainer.max_time=00:12:00:00) or "
            "amounts such as trainer.max_time={hours:12,minutes:30}"
        )
    data = c.get("data") or {}
    for key in ("max_shift", "val_size"):
        value = data.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
            raise UserError(f"data.{key}={value} is out of range: use a number >= 0")
    optimizer = (c.get("optim") or {}).get("optimizer") or {}
    for key in ("weight_decay", "momentum"):
        value = optimizer.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
            raise UserError(f"optim.optimizer.{key}={value} is out of range: use a number >= 0")
    if data.get("data_dir") == "":
        raise UserError("data.data_dir is empty; give it a folder, or leave it out to use DATA_DIR (else ./data)")
    for key in ("data_dir", "cache_dir"):
        where = data.get(key)
        if isinstance(where, str) and Path(where).expanduser().exists() and not Path(where).expanduser().is_dir():
            raise UserError(f"data.{key}={where} is a file, not a folder; point it (or DATA_DIR) at a folder")


# -- resources: hardware -> framework -> task ---------------------------------------------------------


def resources(c: DictConfig, machine: Machine) -> tuple[HardwarePlan, FrameworkPlan, TaskPlan]:
    """The three resource layers of a config (what launchers size a job by)."""
    hw = _hardware(c.hardware, machine)
    fw = _framework(c, hw, machine)
    return hw, fw, _task(c, hw)


def _positive_int(value: Any, name: str, or_auto: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UserError(f"{name}={value} must be a positive integer{' or auto' if or_auto else ''}")
    return value


def _hardware(hw: DictConfig, machine: Machine) -> HardwarePlan:
    accelerator = hw.accelerator
    if accelerator == "auto":
        accelerator = "gpu" if machine.gpus > 0 else "cpu"
    if accelerator == "cuda":
        accelerator = "gpu"
    if accelerator not in ("cpu", "gpu"):
        raise UserError(f"hardware.accelerator={hw.accelerator} is not supported; use cpu, gpu or auto")
    devices = hw.devices
    if devices in ("auto", -1):
        devices = machine.gpus if accelerator == "gpu" else 1
        if devices == 0:  # not a count the user gave: say what asked for it
            raise UserError(
                f"hardware.accelerator={hw.accelerator} with hardware.devices={hw.devices} takes every GPU of this "
                "machine, which has none; use hardware=cpu or hardware=auto, or give the count of the machine it is "
                "planned for (hardware.devices=N)"
            )
    devices = _positive_int(devices, "hardware.devices", or_auto=True)
    num_nodes = _positive_int(hw.num_nodes, "hardware.num_nodes")
    cpus = hw.get("cpus_per_task", "auto")
    if cpus == "auto":
        # Inside a SLURM job the allocation says; elsewhere share this machine's cores.
        cpus = int(os.environ.get("SLURM_CPUS_PER_TASK", 0)) or max(1, machine.cpu_cores // devices)
    cpus = _positive_int(cpus, "hardware.cpus_per_task", or_auto=True)
    memory = hw.get("mem_gb", "auto")
    if memory == "auto":
        memory = machine.memory_gb
    elif isinstance(memory, bool) or not isinstance(memory, int | float) or not memory > 0 or math.isinf(memory):
        raise UserError(f"hardware.mem_gb={memory} must be auto or a positive number of GB")
    return HardwarePlan(
        accelerator=accelerator,
        devices=devices,
        num_nodes=num_nodes,
        world_size=devices * num_nodes,
        cpus_per_task=cpus,
        mem_gb=float(memory),
        gpus_per_node=devices if accelerator == "gpu" else 0,
    )


def _framework(c: DictConfig, hw: HardwarePlan, machine: Machine) -> FrameworkPlan:
    strategy = c.strategy.name
    if strategy not in STRATEGIES:
        raise UserError(f"strategy={strategy} is not supported; use one of {', '.join(STRATEGIES)}")
    if strategy == "auto":
        # DDP for any multi-process run, on CPU too: it is what torchrun and srun start, and gloo runs it.
        strategy = "ddp" if hw.world_size > 1 else "auto"
    precision = str(c.trainer.precision)
    if precision not in PRECISIONS:
        raise UserError(f"precision={precision} is not a Lightning precision; use one of {', '.join(PRECISIONS)}")
    if hw.accelerator == "cpu" and precision in ("16-mixed", "16-true"):  # whatever the machine: a plan says so too
        raise UserError(f"precision={precision} needs a CUDA GPU; on CPU use precision=bf16-mixed or precision=32-true")
    shard = [str(name) for name in c.strategy.get("shard") or []]
    checkpoint = str(c.strategy.get("checkpoint", "full"))
    if strategy != "fsdp" and (shard or checkpoint != "full"):
        given = f"strategy.shard={shard}" if shard else f"strategy.checkpoint={checkpoint}"
        raise UserError(f"{given} is read by strategy=fsdp only; add strategy=fsdp, or drop it")
    if strategy == "fsdp":
        if twice := next((name for i, name in enumerate(shard) if name in shard[:i]), None):
            raise UserError(f"strategy.shard names {twice} twice; each submodule is sharded once: name it once")
        if bad := next((name for name in shard if not re.fullmatch(r"[A-Za-z_]\w*(\.\w+)*", name)), None):
            raise UserError(
                f"strategy.shard names submodules by their dotted path; {bad!r} is none (e.g. blocks.layers)"
            )
        # Lightning's ModelParallelStrategy (FSDP2) takes no float64 and no fp16 autocast.
        if precision in ("64-true", "16-mixed"):
            raise UserError(
                f"strategy=fsdp does not train in precision={precision}; use precision=32-true or bf16-mixed"
            )
        # Planning without a run (`--cfg`, a sweep's check) has no run dir yet.
        run_dir = OmegaConf.select(c, "paths.output_dir", throw_on_resolution_failure=False)
        last = RunDir.at(str(run_dir)).last if run_dir else None
        if last is not None and last.is_dir() and c.mode == "train" and c.get("resume") != "never":
            raise UserError(
                f"{last} is a sharded checkpoint (strategy.checkpoint=sharded), which a run cannot continue from; "
                "use strategy.checkpoint=full for runs you may continue, or start over with resume=never"
            )
    gpu = hw.accelerator == "gpu"
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"} if gpu else {}
    if os.environ.get("NCCL_DEBUG") and gpu:
        env["NCCL_DEBUG"] = os.environ["NCCL_DEBUG"]
    return FrameworkPlan(
        strategy=strategy,
        backend=None if hw.world_size == 1 else ("nccl" if gpu else "gloo"),
        precision=precision,
        # TF32 matmuls keep fp32 range at a fraction of the cost; Ampere and newer have them. Planning
        # from a machine without GPUs assumes a current GPU.
        matmul_precision="high" if gpu and (machine.tf32 or machine.gpus == 0) else None,
        sync_batchnorm=bool((c.get("model") or {}).get("sync_batchnorm", False)) and hw.world_size > 1,
        find_unused_parameters=bool(c.strategy.get("find_unused_parameters", False)),
        timeout_s=_positive_int(c.strategy.get("timeout_s", 1800), "strategy.timeout_s"),
        env=env,
        shard=shard,
        checkpoint=checkpoint,
    )


def _accumulation(batch: DictConfig, global_size: int, world: int) -> int:
    requested = batch.get("accumulation", "auto")
    cap = batch.get("max_per_device")
    if cap is not None:
        cap = _positive_int(cap, "batch.max_per_device")
    if requested != "auto":
        requested = _positive_int(requested, "batch.accumulation")
        if cap is not None and global_size // (world * requested) > cap:
            raise UserError(
                f"batch.accumulation={requested} gives each device {global_size // (world * requested)} a "
                f"micro-batch, above batch.max_per_device={cap}; give one of them (batch.max_per_device alone picks "
                "the accumulation)"
            )
        return requested
    if cap is None:
        return 1
    # Smallest accumulation that splits the global batch evenly with no device above the cap.
    for accumulation in range(max(1, math.ceil(global_size / (world * cap))), global_size // world + 1):
        if global_size % (world * accumulation) == 0 and global_size // (world * accumulation) <= cap:
            return accumulation
    raise UserError(
        f"batch.global_size={global_size} cannot be split over {world} processes with at most "
        f"batch.max_per_device={cap} each; use a global size that is a multiple of {world}"
    )


def check_task_values(c: DictConfig) -> None:
    """The task layer's values that no hardware changes (the batch sizes, the learning rate and its rule), as the
    run checks them: a sweep checks each job's before its first job starts."""
    _positive_int(c.batch.global_size, "batch.global_size")
    _positive_int(c.batch.get("eval_size", 1000), "batch.eval_size")
    _learning_rate(c.optim)
    # The values given to the module's and the data module's constructors (`model.width=16,abc`), by their
    # annotations: a wrong one is refused before the sweep's first job, not when its own job starts.
    from hydralight.config.binding import check_values

    for group in ("model", "data"):
        try:
            spec = OmegaConf.to_container(c[group], resolve=True) if c.get(group) is not None else {}
        except Exception:  # a value only the plan resolves: its job checks it as it starts
            continue
        if isinstance(spec, dict):
            check_values({str(k): v for k, v in spec.items()}, group, skip=MODULE_OPTIONS)


def _learning_rate(optim: DictConfig) -> tuple[float, str]:
    try:
        base_lr = float(optim.lr)
    except (TypeError, ValueError):
        raise UserError(f"optim.lr={optim.lr} is not a number; use e.g. optim.lr=1e-3") from None
    if not base_lr > 0 or math.isinf(base_lr):
        raise UserError(f"optim.lr={optim.lr} must be a positive number")
    scaling = optim.get("lr_scaling", "none")
    if scaling not in LR_SCALING:
        raise UserError(f"optim.lr_scaling={scaling} is not a rule; use none, linear or sqrt")
    return base_lr, scaling


def _task(c: DictConfig, hw: HardwarePlan) -> TaskPlan:
    batch, optim = c.batch, c.optim
    global_size = _positive_int(batch.global_size, "batch.global_size")
    world = hw.world_size
    if global_size < world:
        raise UserError(
            f"batch.global_size={global_size} is smaller than the {world} processes of this hardware; "
            f"use batch.global_size>={world}"
        )
    accumulation = _accumulation(batch, global_size, world)
    if global_size % (world * accumulation):
        raise UserError(
            f"batch.global_size={global_size} is not divisible by world size {world} x accumulation "
            f"{accumulation}; use a multiple of {world * accumulation}"
        )
    eval_size = _positive_int(batch.get("eval_size", 1000), "batch.eval_size")
    base_lr, scaling = _learning_rate(optim)
    reference = _positive_int(batch.get("reference_size") or global_size, "batch.reference_size")
    ratio = global_size / reference
    lr = base_lr * {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[scaling]
    # Only the tensor loader needs no workers; a data module without a `loader` setting gets them.
    tensor_loader = (c.get("data") or {}).get("loader") == "tensor"
    workers = batch.get("num_workers", "auto")
    if workers == "auto":
        # The tensor loader needs none; otherwise leave one core of the process for the training loop.
        workers = 0 if tensor_loader else min(8, hw.cpus_per_task - 1)
    elif isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise UserError(f"batch.num_workers={workers} must be auto or an integer >= 0")
    pin = batch.get("pin_memory", "auto")
    # Pinning helps host-to-GPU copies only; the tensor loader's data already lives on the device.
    pin = hw.accelerator == "gpu" and not tensor_loader and (pin is True or pin == "auto")
    return TaskPlan(
        global_size=global_size,
        per_device_size=global_size // (world * accumulation),
        accumulation=accumulation,
        eval_size=eval_size,
        base_lr=base_lr,
        lr_scaling=scaling,
        lr=lr,
        num_workers=workers,
        pin_memory=pin,
        persistent_workers=workers > 0,
        drop_last=bool(batch.get("drop_last", True)),
    )


# -- what the run builds ------------------------------------------------------------------------------


def _overridden(job: JobInfo, *keys: str, groups: tuple[str, ...] = ()) -> str | None:
    """The first command-line override that sets one of `keys` (or a key below one) or picks an option of one
    of `groups`, as given."""
    for item in job.overrides:
        key = override_key(item)
        if key in groups or any(key == k or key.startswith(f"{k}.") for k in keys):
            return item
    return None


def _plain(node: Any) -> dict[str, Any]:
    """A config node as a plain dict (none: empty)."""
    value = OmegaConf.to_container(node) if node is not None else {}
    assert isinstance(value, dict)  # the nodes read here are mappings by their schema
    return {str(k): v for k, v in value.items()}


def _model(c: DictConfig, task: TaskPlan, job: JobInfo) -> ModelPlan:
    spec = _plain(c.get("model"))
    if "_target_" not in spec:
        raise UserError(
            "the model has no _target_: pick a model option (model=cnn, ...), or name your LightningModule "
            "with model._target_=my_package.MyModule"
        )
    options = {key: spec.pop(key) for key in MODULE_OPTIONS if key in spec}
    declared = ModuleDeclaration.of(spec)
    declared.check(spec)
    for key, owner in MODEL_OWNED.items():
        if key in spec and (key != "lr" or declared.lr_from_plan):
            raise UserError(set_by_plan(f"model.{key}", owner))
    optim = c.optim
    offered: dict[str, Any] = {"seed": int(c.seed)}
    if declared.lr_from_plan or declared.lr_required or _lr_chosen(c, job):
        offered["lr"] = task.lr  # else a module's own default learning rate stands
        own = declared.own_lr
        if own is not None and not declared.lr_from_plan and not _lr_chosen(c, job, ("lr",)) and own != task.base_lr:
            # Only a rule was chosen: it would scale optim.lr's default, silently replacing the module's own rate.
            raise UserError(
                f"optim.lr_scaling={task.lr_scaling} scales optim.lr ({task.base_lr:g}), but "
                f"{declared.target.__name__} has a learning rate of its own ({own:g}), which it would replace; "
                f"give the rate to scale: optim.lr={own:g} optim.lr_scaling={task.lr_scaling}"
            )
    for key in ("optimizer", "scheduler"):
        if optim.get(key) is not None:
            offered[key] = OmegaConf.to_container(optim[key])
    injected = _lr_into_optimizer(spec, offered, declared, task)
    for key, partial in [*((f"model.{k}", v) for k, v in spec.items()), *((f"optim.{k}", offered.get(k)) for k in
                         ("optimizer", "scheduler"))]:  # fmt: skip
        _check_partial(partial, key)
    # What the command line set for the plan must reach the module, or be refused: never silently ignored.
    explicit = {}
    for value, keys, groups in (("lr", ("optim.lr", "optim.lr_scaling"), ()),
                                ("optimizer", ("optim.optimizer",), ("optim",)),
                                ("scheduler", ("optim.scheduler",), ("optim",))):  # fmt: skip
        item = _overridden(job, *keys, groups=groups)
        if item is not None and (value != "scheduler" or "scheduler" in offered) and not (value == "lr" and injected):
            explicit[value] = item
    nested = [f"model.{key}._target_" for key, value in spec.items() if isinstance(value, dict) and "_target_" in value]
    replaced = override_key(_overridden(job, "model._target_", *nested) or "") or None
    if replaced == "model._target_":
        spec = _without_the_replaced_options_arguments(spec, job, "model")
    return ModelPlan(
        spec=spec,
        offered=offered,
        explicit=explicit,
        invariant_dropout=bool(options.get("invariant_dropout", True)),
        sync_batchnorm=bool(options.get("sync_batchnorm", False)),
        option=job.choices.get("model"),
        replaced=replaced,
    )


def _check_partial(spec: Any, key: str) -> None:
    """A `_partial_: true` config (an optimizer the module calls with its parameters) is built only when the
    module calls it, in its own code: a misspelt or unknown argument is refused here, in one line, instead."""
    from hydralight.config.binding import bind, import_target

    if isinstance(spec, dict) and spec.get("_partial_") is True and "_target_" in spec:
        bind(import_target(str(spec["_target_"]), f"{key}._target_"), spec, {}, key, pending=None)


def _lr_into_optimizer(
    spec: dict[str, Any], offered: dict[str, Any], declared: ModuleDeclaration, task: TaskPlan
) -> bool:
    """A module of your own that takes the plan's optimizer (a `_partial_` config it calls with its parameters)
    and no `lr` gets the plan's rate inside that optimizer, where torch's default would stand in unseen. True:
    the rate went in."""
    from hydralight.config.binding import accepted_arguments

    if declared.target is None or declared.lr_from_plan:
        return False
    names, _ = accepted_arguments(declared.target)
    _check_schedule_length(spec, offered.get("scheduler"), names, declared.target.__name__)
    optimizer = offered.get("optimizer")
    if "lr" in names or "optimizer" not in names or "optimizer" in spec or not isinstance(optimizer, dict):
        return False
    if "lr" not in optimizer:
        offered["optimizer"] = {**optimizer, "lr": task.lr}
    return True


def _check_schedule_length(spec: dict[str, Any], scheduler: Any, names: set[str], module: str) -> None:
    """The plan's scheduler, offered to a module of your own that builds its schedule itself, refused when it
    needs what only the built-in modules fill in from the run (its steps, its rate; OneCycleLR both)."""
    from hydralight.config.binding import import_target

    if (
        "scheduler" not in names
        or "scheduler" in spec
        or not isinstance(scheduler, dict)
        or "_target_" not in scheduler
    ):
        return
    factory = import_target(str(scheduler["_target_"]), "optim.scheduler._target_")
    params = inspect.signature(factory).parameters
    filled = [k for k in ("T_max", "max_lr", "total_steps") if k in params and scheduler.get(k) is None]
    if any(params[k].default is inspect.Parameter.empty for k in filled):
        raise UserError(
            f"optim.scheduler ({factory.__name__}) needs {', '.join(filled)}, which the run fills in only for the "
            f"built-in modules; {module} builds its schedule itself: give "
            f"{' '.join(f'+optim.scheduler.{k}=...' for k in filled)}, or optim.scheduler=null"
        )


def _module_lr(spec: dict[str, Any]) -> float | None:
    """The learning rate a module keeps when the plan offers none: its config's `lr`, its optimizer config's
    (`optimizer: {_partial_: true, lr: ...}`, as lightning-hydra-template writes it) or its constructor's
    default; None when it cannot be told (a rate under another name)."""
    optimizer = spec.get("optimizer")
    for value in (spec.get("lr"), optimizer.get("lr") if isinstance(optimizer, dict) else None):
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return ModuleDeclaration.of(spec).own_lr


def _lr_chosen(c: DictConfig, job: JobInfo, keys: tuple[str, ...] = ("lr", "lr_scaling")) -> bool:
    """Whether this run chose a learning rate (`keys`: a rate or a scaling rule): on the command line (a sweep's
    and a search trial's values are overrides too), or in a preset that changed the optim option's own
    (experiment=charlm)."""
    if _overridden(job, *(f"optim.{key}" for key in keys), groups=("optim",)) is not None:
        return True
    option = job.choices.get("optim")
    shipped = SHIPPED_CONF / "optim" / f"{option}.yaml"
    if not option or not shipped.is_file():
        return True  # an option of the user's own: its learning rate is a choice
    own = {"lr_scaling": "none", **(yaml.safe_load(shipped.read_text()) or {})}
    return any(c.optim.get(key, own.get(key)) != own.get(key) for key in keys)


def _without_the_replaced_options_arguments(spec: dict[str, Any], job: JobInfo, group: str) -> dict[str, Any]:
    """`model._target_=my.Module` (`data._target_=my.DataModule`) on the command line over an option: the module's
    own defaults stand, and the option's values (a network, a data folder) fill only the arguments it cannot be
    built without; those given on the command line stay, checked against its constructor. An option's value the
    module would have taken is said in one note (it was passed on silently)."""
    from hydralight.config.binding import accepted_arguments, import_target, required_arguments

    keys = [override_key(item) for item in job.overrides]
    given = {key.split(".")[1] for key in keys if key.startswith(f"{group}.")}
    target = import_target(str(spec["_target_"]), f"{group}._target_")
    names, takes_any = accepted_arguments(target)
    if takes_any:
        return spec
    needed = set(required_arguments(target))
    # `_recursive_: false` was the replaced module's (it built its nested targets itself); others get theirs built.
    unused = [k for k in spec if k not in given and k != "_target_" and (k == "_recursive_" or k not in needed)]
    if (own := [k for k in unused if k in names]) and is_rank_zero():
        print(
            f"note: {group}._target_={spec['_target_']} keeps its own defaults for {', '.join(own)}, not those of "
            f"the option it replaces ({group}={job.choices.get(group, '?')}); give one as {group}.{own[0]}=...",
            file=sys.stderr,
            flush=True,
        )
    return {k: v for k, v in spec.items() if k not in unused}


def _data(c: DictConfig, task: TaskPlan, job: JobInfo) -> DataPlan:
    spec = _plain(c.get("data"))
    if "_target_" not in spec:
        raise UserError(
            "the data has no _target_: pick a data option (data=<name>; --help lists them) or set data._target_=..."
        )
    # The data config's own value of a planned setting gives way to the plan's (said at start); one given on the
    # command line was meant to be used: it is refused, naming where the plan takes it from.
    for name, owner in OWNERS.items():
        item = _overridden(job, f"data.{name}")
        if item is not None and not item.startswith("~"):
            raise UserError(
                f"{item} is set on the command line, but the plan gives the data module its {name} (the same "
                f"training on any hardware); set {owner} instead"
            )
    if override_key(_overridden(job, "data._target_") or "") == "data._target_":
        spec = _without_the_replaced_options_arguments(spec, job, "data")
    ModuleDeclaration.of(spec).check(spec)  # the data module's own check of its config, as a model's
    offered = {
        "global_size": task.global_size,
        "batch_size": task.per_device_size,
        "accumulation": task.accumulation,
        "eval_size": task.eval_size,
        "num_workers": task.num_workers,
        "pin_memory": task.pin_memory,
        "persistent_workers": task.persistent_workers,
        # A run that trains nothing (mode=eval, mode=predict) drops no training batch: its data is not refused
        # for a global batch larger than the training split it never reads.
        "drop_last": task.drop_last and getattr(c.mode, "name", str(c.mode)).lower() == "train",
        "seed": int(c.seed),
    }
    # What the command line set for the loaders must reach the data module, or be refused: never silently ignored.
    explicit = {
        name: item
        for name in ("drop_last", "num_workers", "pin_memory")
        if (item := _overridden(job, f"batch.{name}")) is not None
    }
    return DataPlan(spec=spec, offered=offered, explicit=explicit)


def _trainer(
    c: DictConfig, hw: HardwarePlan, fw: FrameworkPlan, task: TaskPlan, run_dir: str, eval_batch_fixed: bool = True
) -> dict[str, Any]:
    given: dict[str, Any] = OmegaConf.to_container(c.trainer)  # type: ignore[assignment]
    for key, owner in PLANNED.items():
        if given.get(key) is not None:
            raise UserError(set_by_plan(f"trainer.{key}", owner))
    # null means "Lightning's default", except where null is a setting of its own.
    options = {k: v for k, v in given.items() if (v is not None or k in NULL_IS_A_SETTING) and k not in PLANNED}
    # Budgets count optimizer steps (global batches), whatever the accumulation: Lightning counts micro-batches.
    if options.get("max_epochs") is None:
        # A step or time budget given alone is the budget: an epoch default never cuts it short unseen.
        bounded = options.get("max_steps", -1) != -1 or options.get("max_time") is not None
        options["max_epochs"] = -1 if bounded else DEFAULT_EPOCHS
    for key in ("limit_train_batches", "val_check_interval", "overfit_batches"):
        limit = options.get(key)
        if isinstance(limit, int) and not isinstance(limit, bool):  # N batches: N optimizer steps
            options[key] = limit * task.accumulation
        elif isinstance(fraction := limit, float) and 0 < fraction < 1 and task.accumulation > 1:
            # Lightning takes the fraction of the micro-batches: a limit ends the epoch on a step of part of a
            # global batch, a validation (and the best checkpoint) falls inside a step, with gradients half summed.
            raise UserError(
                f"trainer.{key}={fraction:g} is a fraction of micro-batches, and this plan accumulates "
                f"{task.accumulation} of them a step; give a whole number of optimizer steps (trainer.{key}=N), or "
                "a batch that needs no accumulation"
            )
    for key in ("limit_val_batches", "limit_test_batches", "limit_predict_batches"):
        options.update(_evaluation_limit(key, options.get(key), hw.world_size if eval_batch_fixed else 1))
    options.update(
        accelerator=hw.accelerator,
        devices=hw.devices,
        num_nodes=hw.num_nodes,
        precision=fw.precision,
        accumulate_grad_batches=task.accumulation,
        # torch's SyncBatchNorm runs on GPUs only; on CPU the project's GlobalBatchNorm does it.
        sync_batchnorm=fw.sync_batchnorm and hw.accelerator == "gpu",
        # Lightning looks for its own `hpc_ckpt_*` files there: never in the working directory.
        default_root_dir=run_dir,
    )
    return options


def _eval_batch_fixed(spec: dict[str, Any]) -> bool:
    """Whether the data's evaluation batch on each device is known to be the same on any number of processes:
    a data module that takes `eval_size` (the project's samplers). Lightning's docs write evaluation loaders
    with the per-device `batch_size` instead (1/N of the global batch on N processes), for which Lightning's
    own count (N batches on each process) already scores the samples of 1 process; others are left to it."""
    from hydralight.config.binding import accepted_arguments, import_target

    try:
        names, _ = accepted_arguments(import_target(str(spec.get("_target_")), "data._target_"))
    except UserError:
        return False  # refused in one line where the data module is built
    return "eval_size" in names


def _evaluation_limit(key: str, limit: Any, world: int) -> dict[str, Any]:
    """An evaluation limit of N batches scores the samples N batches hold on 1 process, however many there are:
    Lightning counts each process's batches, so where each process's evaluation batch is as large as 1 process's
    (`world`: 1 where it shrinks with the number of processes) each takes N / world of them (rounded up, and
    said)."""
    if not isinstance(limit, int) or isinstance(limit, bool) or world == 1:
        return {}
    share = -(-limit // world)
    if share * world != limit and is_rank_zero():
        print(
            f"note: trainer.{key}={limit} does not divide over {world} processes; each scores {share}, "
            f"{share * world} batches in all (a multiple of {world} scores the same samples as 1 process)",
            file=sys.stderr,
            flush=True,
        )
    return {key: share}


def _specs(group: Any) -> dict[str, dict[str, Any]]:
    """The `_target_` specs of a group of named objects (callbacks, loggers); a null entry is switched off."""
    if not group:
        return {}
    return {str(name): OmegaConf.to_container(spec) for name, spec in group.items() if spec is not None}  # type: ignore[misc]


def _callbacks(group: Any, strategy: str) -> dict[str, dict[str, Any]]:
    """The callbacks' specs, each checked against the strategy: one that averages the weights (Lightning's
    `WeightAveraging`: EMA, SWA) keeps a deep copy of the module, which FSDP's sharded module cannot give."""
    from hydralight.config.binding import import_target

    specs = _specs(group)
    for name, spec in specs.items() if strategy == "fsdp" else ():
        target = import_target(str(spec.get("_target_")), f"callbacks.{name}._target_")
        bases = {f"{k.__module__}.{k.__qualname__}" for k in getattr(target, "__mro__", ())}
        if bases & {"pytorch_lightning.callbacks.weight_averaging.WeightAveraging",
                    "lightning.pytorch.callbacks.weight_averaging.WeightAveraging"}:  # fmt: skip
            raise UserError(
                f"callbacks.{name} ({target.__name__}) averages the weights in a copy of the module, which "
                "strategy=fsdp cannot make of its sharded module; use strategy=ddp, or drop it from callbacks"
            )
    return specs


# -- what the run starts from -------------------------------------------------------------------------


def resumed_config(config: dict[str, Any], job: JobInfo) -> tuple[dict[str, Any], str]:
    """The config to run and its run dir: with `resume=RUN_DIR`, that run's saved config, where the command
    line may only extend training (any other override that contradicts it is refused, naming each key)."""
    run_dir = str(job.run_dir or (config.get("paths") or {}).get("output_dir") or ".")
    if config.get("resume") in ("auto", "never", None) or config.get("mode") in ("eval", "predict"):
        return config, run_dir  # mode=eval/predict read an earlier run's checkpoint, never its config (see _resume)
    earlier = RunDir.at(str(config["resume"]))
    if not earlier.config.is_file():
        raise UserError(
            f"resume={config['resume']} is not the dir of an earlier run (no config.yaml there); "
            "pass a run dir (outputs/<date>/<time>), or use resume=auto / resume=never"
        )
    saved = read_yaml_record(earlier.config, f"resume={config['resume']}")
    # Its config is data: the classes it names are built only when this command's configs name them too.
    check_trusted(saved, configured_targets(config), f"resume={earlier.path} (its config.yaml)")
    now, then = OmegaConf.create(config), OmegaConf.create(saved)
    differ = []
    for item in job.overrides:
        key = override_key(item)
        if key == "resume" or key.startswith("hydra") or key in EXTENDABLE or _runs_on(key):
            continue
        plain = lambda v: OmegaConf.to_container(v) if OmegaConf.is_config(v) else v  # noqa: E731
        absent = object()
        if (
            OmegaConf.select(now, key, default=absent) is absent
            and OmegaConf.select(then, key, default=absent) is absent
        ):
            # A group that is no key of the config (experiment=...): it sets others, and the run's own choice counts.
            chosen = chosen_by(earlier, key)
            if chosen != item.split("=", 1)[-1]:
                differ.append(f"{key} (run: {chosen}, now: {item.split('=', 1)[-1]})")
            continue
        was, asked = plain(OmegaConf.select(then, key)), plain(OmegaConf.select(now, key))
        if was != asked and isinstance(was, dict) and isinstance(asked, dict):  # a group: its option, or its keys
            chosen, option = chosen_by(earlier, key) or "its own", item.split("=", 1)[-1]
            if chosen != option:
                differ.append(f"{key} (run: {chosen}, now: {option})")
            else:  # the same option, set otherwise on the run's command line
                differ += [f"{key}.{k} (run: {a}, now: {b})" for k, a, b in _leaves_that_differ(was, asked)][:3]
        elif was != asked:
            differ.append(f"{key} (run: {was}, now: {asked})")
    if differ:
        raise UserError(
            f"resume={earlier.path} is a different experiment: {'; '.join(dict.fromkeys(differ))}; "
            "drop those overrides to continue that run, or start a new one"
        )
    # A longer budget given on the command line extends the run; the saved one stands otherwise.
    given = {override_key(item) for item in job.overrides}
    for key in [*EXTENDABLE, *(k for k in given if _runs_on(k))]:  # the layout too: it continues on this one
        if key in given:
            OmegaConf.update(then, key, OmegaConf.select(now, key), force_add=True, merge=False)
    # A copied or moved run dir is a run of its own: nothing it writes may land in the original.
    old = str((saved.get("paths") or {}).get("output_dir", earlier.path))
    moved = _moved(OmegaConf.to_container(then), old, str(earlier.path.resolve()))
    if outside := _writes_outside(moved, earlier.path.resolve()):
        raise UserError(
            f"resume={earlier.path} (its config.yaml) would write outside its run dir: {outside}; a run writes only "
            "into its own run dir: delete that key from its config.yaml, or start a new run"
        )
    moved["resume"] = "auto"
    return moved, str(earlier.path.resolve())


def _leaves_that_differ(a: Any, b: Any, where: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, value in a, value in b) of each leaf two configs differ in."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [
            d for k in sorted(set(a) | set(b), key=str) for d in _leaves_that_differ(a.get(k), b.get(k), f"{where}{k}.")
        ]
    return [] if a == b else [(where.rstrip("."), a, b)]


def chosen_by(run: RunDir, group: str) -> str | None:
    """The option of `group` the run chose (Hydra's record of its choices, else its command line; None: not
    known, or the default)."""
    with contextlib.suppress(UserError, AttributeError, TypeError):
        record = read_yaml_record(run.overrides.with_name("hydra.yaml"), "its record")
        choice = record["hydra"]["runtime"]["choices"].get(group)
        return None if choice is None else str(choice)
    try:
        overrides = read_yaml_record(run.overrides, "its record", kind=list)
    except UserError:
        return None
    given = [str(item).split("=", 1)[-1] for item in overrides if override_key(str(item)) == group]
    return given[-1] if given else None


# Keys whose value says where a callback, logger, profiler or the trainer writes its files.
_WRITE_KEYS = frozenset({"dirpath", "run_dir", "save_dir", "default_root_dir", "output_dir", "log_dir", "dir"})


def _writes_outside(value: Any, run_dir: Path, where: str = "") -> str | None:
    """The first `key=path` in a saved config that would have a run write outside `run_dir` (a hostile or
    edited config.yaml pointing a checkpoint folder at another run's); None when all stay inside."""
    if not isinstance(value, dict):
        return None
    for key, item in value.items():
        name = f"{where}{key}"
        if isinstance(item, dict):
            if found := _writes_outside(item, run_dir, f"{name}."):
                return found
        elif key in _WRITE_KEYS and isinstance(item, str):
            target = Path(item) if Path(item).is_absolute() else Path.cwd() / item
            if not target.resolve().is_relative_to(run_dir):
                return f"{name}={item}"
        elif key == "filename" and isinstance(item, str) and (Path(item).is_absolute() or ".." in Path(item).parts):
            return f"{name}={item}"  # a file name is joined to its folder: `../` or a root leaves it
    return None


def _moved(value: Any, old: str, new: str) -> Any:
    """`value` with every path inside the `old` run dir rewritten into `new`."""
    if isinstance(value, str) and (value == old or value.startswith(old.rstrip("/") + "/")):
        return new + value[len(old) :]
    if isinstance(value, dict):
        return {k: _moved(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_moved(v, old, new) for v in value]
    return value


def _resume(c: DictConfig, config: dict[str, Any], run_dir: str) -> ResumePlan:
    """Where `fit` continues from: the run dir's own last.ckpt once the run has saved one (reruns and requeues
    continue, never restart), else `ckpt_path`; `resume=never` ignores the run's own checkpoint."""
    own = RunDir.at(run_dir).last
    policy = str(c.resume)
    ckpt_path = c.ckpt_path
    if ckpt_path == "last":  # Lightning's spelling of this run's own last checkpoint
        if not own.is_file():
            raise UserError(f"ckpt_path=last: this run dir has no {own} yet; run it once, or give a checkpoint file")
        ckpt_path = str(own)
    uses_own = c.mode == "train" and policy != "never" and own.is_file()
    for key, path in (("ckpt_path", None if uses_own else ckpt_path), ("init_from", c.get("init_from"))):
        if not path:
            continue
        problem = not_a_checkpoint_file(path)
        if problem is not None and Path(path).exists():  # a missing file is the machine check's (check_plan)
            raise UserError(f"{key}={path} {problem}")
    if c.mode in ("eval", "predict"):  # into a new run dir: never continuing one, never writing into the run it reads
        if RunDir.at(run_dir).config.is_file():
            raise UserError(
                f"mode={c.mode} writes into a new run dir, but {run_dir} holds a run already; leave hydra.run.dir "
                "out, or name a new dir"
            )
        if c.mode == "eval" and not _run_dir_given(c):
            return ResumePlan(mode="eval", policy=policy, ckpt_path=ckpt_path)
        return ResumePlan(mode=str(c.mode), policy="never", ckpt_path=ckpt_path or _checkpoint_of_run(policy))
    if policy == "never" and (read_json(RunDir.at(run_dir).manifest) or {}).get("status") == "finished":
        # Starting over replaces what the run saved under the same names: its results, its checkpoints.
        raise UserError(
            f"resume=never starts a new run, but {run_dir} holds a finished one, whose results and checkpoints "
            "it would replace; leave hydra.run.dir out or name a new dir (init_from=<its checkpoint> starts from "
            "its weights)"
        )
    if uses_own:
        continue_from, is_own = str(own), True
    else:
        continue_from, is_own = ckpt_path, False
    return ResumePlan(
        mode="train",
        policy=policy,
        continue_from=continue_from,
        own=is_own,
        ckpt_path=ckpt_path,
        init_from=c.get("init_from"),
        finished=finished_result(config, run_dir) if policy != "never" else None,
        finished_before=is_own and (read_json(RunDir.at(run_dir).manifest) or {}).get("status") == "finished",
    )


def _run_dir_given(c: DictConfig) -> bool:
    return str(c.get("resume")) not in ("auto", "never", "None")


def _checkpoint_of_run(run_dir: str) -> str:
    """The checkpoint of an earlier run that `mode=predict resume=RUN_DIR` predicts with: its best by the
    objective (as its results name it), else its last.ckpt."""
    earlier = RunDir.at(run_dir)
    if not earlier.config.is_file():
        raise UserError(
            f"resume={run_dir} is not the dir of an earlier run (no config.yaml there); pass a run dir "
            "(outputs/<date>/<time>), or the checkpoint itself with ckpt_path=FILE"
        )
    best = (read_json(earlier.results) or {}).get("best_checkpoint")
    for path in (best, earlier.last):
        # A run dir copied or moved keeps its checkpoints inside: the recorded path may point at the original.
        if path and (inside := earlier.checkpoints / Path(path).name).is_file():
            if not inside.resolve().is_relative_to(earlier.path.resolve()):  # a link: another run's weights
                raise UserError(
                    f"resume={run_dir}: its checkpoint {inside} leads out of the run dir (to {inside.resolve()}), so "
                    "the weights read would not be that run's; pass the checkpoint itself with ckpt_path=FILE"
                )
            return str(inside)
        if path and (problem := not_a_checkpoint_file(inside)) and inside.is_dir():
            raise UserError(f"resume={run_dir}: its checkpoint {inside} {problem}")
    raise UserError(
        f"resume={run_dir} holds no checkpoint ({earlier.checkpoints} is empty or missing); pass ckpt_path=FILE"
    )


def finished_result(config: dict[str, Any], run_dir: str) -> dict[str, Any] | None:
    """The results of this run dir when it already finished with this very config (the same command run
    again): nothing is left to do. A grown budget or any other change continues the run instead."""
    files = RunDir.at(run_dir)
    if config.get("mode") != "train" or not (files.results.is_file() and files.config.is_file()):
        return None
    if (read_json(files.manifest) or {}).get("status") != "finished":
        return None
    if read_yaml_record(files.config, "this run dir") != config:
        return None
    return read_json(files.results)


# -- checks against a machine -------------------------------------------------------------------------

# Hardware fields a job that runs on another machine must name: this machine cannot answer for them.
ELSEWHERE_FIELDS = ("accelerator", "devices", "cpus_per_task", "mem_gb")


def resources_elsewhere(cfg: DictConfig | dict[str, Any]) -> tuple[HardwarePlan, FrameworkPlan, TaskPlan]:
    """The resources of a job that runs on another machine (a SLURM node, a cloud instance): every one comes
    from the config, none is read off the submitting machine."""
    c = OmegaConf.create(as_container(cfg)) if isinstance(cfg, dict) else cfg
    hw = c.hardware
    auto = [f"hardware.{key}" for key in ELSEWHERE_FIELDS if hw.get(key, "auto") in ("auto", -1)]
    if auto:
        raise UserError(
            f"{', '.join(auto)} cannot be auto for a job that runs on another machine; pick a profile such as "
            f"hardware=1gpu or hardware=8gpu, or set {'=..., '.join(auto)}=..."
        )
    return resources(c, Machine())


def _check_slurm_tasks(world_size: int) -> None:
    """SLURM's task count against the plan's processes: a shell left with another job's SLURM_* variables,
    or an `srun --ntasks` without a per-node count, would otherwise fail deep inside Lightning."""
    tasks = int(os.environ["SLURM_NTASKS"])
    if "SLURM_NTASKS_PER_NODE" not in os.environ:
        raise UserError(
            f"SLURM_NTASKS={tasks} is set without SLURM_NTASKS_PER_NODE: start the ranks with "
            f"srun --ntasks-per-node=N (hydra/launcher=slurm does), or unset SLURM_NTASKS to run one process here"
        )
    if tasks != world_size:
        raise UserError(
            f"SLURM started {tasks} tasks (SLURM_NTASKS) but the plan runs {world_size} process(es); set "
            "hardware.devices and hardware.num_nodes to match the srun task layout, or submit with hydra/launcher=slurm"
        )


def check_plan(plan: RunPlan, machine: Machine) -> None:
    """Refuse, with the fix, a plan this machine cannot run."""
    hw, fw = plan.hardware, plan.framework
    if hw.accelerator == "gpu" and machine.gpus < hw.devices:
        found = "no CUDA GPU" if machine.gpus == 0 else f"{machine.gpus} GPU(s)"
        fix = (
            "use hardware=auto or hardware=cpu"
            if machine.gpus == 0
            else f"use hardware=auto or hardware.devices={machine.gpus}"
        )
        raise UserError(f"the plan asks for {hw.devices} GPU(s) per node but this machine has {found}; {fix}")
    if external_launcher() == "slurm":
        _check_slurm_tasks(hw.world_size)
    if external_launcher() == "torchrun" and int(os.environ.get("WORLD_SIZE", hw.world_size)) != hw.world_size:
        # Each rank would otherwise plan a run of its own size: the others train nothing and exit 0.
        started = int(os.environ["WORLD_SIZE"])
        raise UserError(
            f"torchrun started {started} processes (WORLD_SIZE) but the plan runs {hw.world_size}; set "
            "hardware.devices to --nproc_per_node (and hardware.num_nodes to --nnodes), or start torchrun with "
            f"--nproc_per_node={hw.devices}"
        )
    if hw.num_nodes > 1 and external_launcher() is None:
        raise UserError(
            f"hardware.num_nodes={hw.num_nodes} needs a launcher that starts every node: submit with "
            "hydra/launcher=slurm or start each node with torchrun --nnodes; or use hardware.num_nodes=1"
        )
    # A SLURM task sees only its own cores and the whole node's memory: its allocation is the request.
    oversubscribe = bool((plan.config.get("hardware") or {}).get("oversubscribe", False))
    check_capacity(hw, None if external_launcher() == "slurm" else machine, oversubscribe)
    if hw.accelerator == "gpu" and fw.precision.startswith("bf16") and not machine.bf16:
        raise UserError(
            f"precision={fw.precision} but {machine.gpu_name or 'this GPU'} has no bfloat16 support; use precision=16-mixed"
        )
    for key in ("ckpt_path", "init_from"):
        path = plan.resume.ckpt_path if key == "ckpt_path" else plan.resume.init_from
        if path and not plan.resume.own and not Path(path).is_file():
            raise UserError(f"{key}={path} does not exist; pass the .ckpt file of a run (its checkpoints/ folder)")
