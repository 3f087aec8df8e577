"""The resource plan: hardware, framework and task settings resolved together and checked up front.

Each layer depends on the one before: the world size fixes the per-device batch, the accelerator
fixes the backend and what precisions can run. Resolving them in one place means the trainer, the
data loaders and the SLURM request all read the same numbers.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

from omegaconf import DictConfig

from hydralight.errors import UserError
from hydralight.run_dir import external_launcher
from hydralight.schema import LR_SCALING, PRECISIONS, STRATEGIES, plain


@dataclass(frozen=True)
class Machine:
    """What this machine offers; injected in tests to plan for machines we do not have."""

    gpus: int = 0
    gpu_name: str | None = None
    bf16: bool = False
    tf32: bool = False
    cpu_cores: int = 1
    memory_gb: float = 0.0

    @classmethod
    def detect(cls) -> Machine:
        import torch

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 if hasattr(os, "sysconf") else 0.0
        if not torch.cuda.is_available():
            return cls(cpu_cores=cores, memory_gb=round(memory, 1))
        major, _ = torch.cuda.get_device_capability(0)
        return cls(
            gpus=torch.cuda.device_count(),
            gpu_name=torch.cuda.get_device_name(0),
            bf16=torch.cuda.is_bf16_supported(),
            tf32=major >= 8,
            cpu_cores=cores,
            memory_gb=round(memory, 1),
        )


@dataclass(frozen=True)
class HardwarePlan:
    accelerator: str  # cpu | gpu
    devices: int  # processes (devices) per node
    num_nodes: int
    world_size: int
    cpus_per_task: int
    mem_gb: float  # host memory per node
    gpus_per_node: int


@dataclass(frozen=True)
class FrameworkPlan:
    strategy: str  # auto (single process) | ddp | ddp_spawn
    backend: str | None  # process-group backend; None for a single process
    precision: str
    matmul_precision: str | None  # torch.set_float32_matmul_precision, on GPUs with TF32
    sync_batchnorm: bool = False  # BatchNorm statistics over all ranks (CUDA only in torch)
    find_unused_parameters: bool = False
    timeout_s: int = 1800  # collective operations give up after this long
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskPlan:
    global_size: int
    per_device_size: int
    accumulation: int
    eval_size: int
    base_lr: float
    lr_scaling: str
    lr: float
    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    drop_last: bool


# Plan fields no consumer reads directly: shown in the plan table, the consumers read what follows from them.
DERIVED = ("hardware.world_size", "task.base_lr", "task.lr_scaling")


@dataclass(frozen=True)
class Plan:
    """Everything the run's consumers get from the config and the machine, through the methods below only:
    the Trainer, the data module, the model, the DDP strategy, the SLURM request and the dstack request."""

    hardware: HardwarePlan
    framework: FrameworkPlan
    task: TaskPlan

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def trainer_kwargs(self, shards_by_rank: bool = True) -> dict[str, Any]:
        """The Trainer arguments this plan decides (the rest come from `trainer.*`); `shards_by_rank`: the data
        module's loaders take each rank's share themselves (hydralight.data.shards_by_rank)."""
        return {
            "accelerator": self.hardware.accelerator,
            "devices": self.hardware.devices,
            "num_nodes": self.hardware.num_nodes,
            "precision": self.framework.precision,
            "accumulate_grad_batches": self.task.accumulation,
            # torch's SyncBatchNorm runs on GPUs only; on CPU the model's own GlobalBatchNorm does it.
            "sync_batchnorm": self.framework.sync_batchnorm and self.hardware.accelerator == "gpu",
            # Our samplers shard by rank themselves; Lightning's DistributedSampler would re-shuffle and pad.
            # A data module without them needs it, or every rank would train on every sample.
            "use_distributed_sampler": not shards_by_rank,
        }

    def data_kwargs(self) -> dict[str, Any]:
        """The data module arguments this plan decides; a data module gets those its constructor names
        (hydralight.data.datamodule_kwargs): the global batch for the project's samplers, `batch_size` (the
        per-device micro-batch) for an ordinary data module."""
        task = self.task
        return {
            "global_size": task.global_size,
            "batch_size": task.per_device_size,
            "accumulation": task.accumulation,
            "eval_size": task.eval_size,
            "num_workers": task.num_workers,
            "pin_memory": task.pin_memory,
            "persistent_workers": task.persistent_workers,
            "drop_last": task.drop_last,
        }

    def model_kwargs(self) -> dict[str, Any]:
        """The model's arguments this plan decides: the learning rate after batch-size scaling."""
        return {
            "lr": self.task.lr,
            "global_batchnorm": self.framework.sync_batchnorm and self.hardware.accelerator == "cpu",
        }

    def strategy_kwargs(self) -> dict[str, Any] | None:
        """The DDP strategy's arguments; None for a single process."""
        fw = self.framework
        if fw.strategy == "auto":
            return None
        return {
            "process_group_backend": fw.backend,
            "find_unused_parameters": fw.find_unused_parameters,
            "timeout": timedelta(seconds=fw.timeout_s),
        }

    def slurm_resources(self, one_task: bool = False) -> dict[str, Any]:
        """The launcher's resource request of one job (sbatch --nodes, --ntasks-per-node, --gpus-per-node,
        --cpus-per-task, --mem). `one_task`: a single process that starts the other ranks itself."""
        hw = self.hardware
        tasks = 1 if one_task else hw.devices
        return {
            "nodes": hw.num_nodes,
            "tasks_per_node": tasks,
            "gpus_per_node": hw.gpus_per_node or None,
            "cpus_per_task": hw.cpus_per_task * hw.devices // tasks,
            "mem_gb": math.ceil(hw.mem_gb) or None,
        }

    def dstack_resources(self, shm_size_gb: int) -> dict[str, Any]:
        """dstack's `resources:` of one node: at least what the plan asks for."""
        hw = self.hardware
        return {
            "gpu": hw.gpus_per_node,
            "cpu": f"{hw.cpus_per_task * hw.devices}..",
            "memory": f"{math.ceil(hw.mem_gb)}GB..",
            "shm_size": f"{shm_size_gb}GB",
        }

    def rows(self) -> list[tuple[str, str, str]]:
        """(layer, setting, value) rows for display."""
        return [
            (layer, key, "-" if value is None or value == {} else str(value))
            for layer, part in (("hardware", self.hardware), ("framework", self.framework), ("task", self.task))
            for key, value in asdict(part).items()
        ]

    def table(self) -> str:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="Resource plan")
        for col in ("layer", "setting", "value"):
            table.add_column(col)
        previous = None
        for layer, key, value in self.rows():
            table.add_row(layer if layer != previous else "", key, value)
            previous = layer
        console = Console(width=100, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
        console.print(table)
        return console.export_text()


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UserError(f"{name}={value} must be a positive integer")
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
    devices = _positive_int(devices, "hardware.devices")
    num_nodes = _positive_int(hw.num_nodes, "hardware.num_nodes")
    cpus = hw.get("cpus_per_task", "auto")
    if cpus == "auto":
        # Inside a SLURM job the allocation says; elsewhere share this machine's cores.
        cpus = int(os.environ.get("SLURM_CPUS_PER_TASK", 0)) or max(1, machine.cpu_cores // devices)
    cpus = _positive_int(cpus, "hardware.cpus_per_task")
    memory = hw.get("mem_gb", "auto")
    if memory == "auto":
        memory = machine.memory_gb
    elif isinstance(memory, bool) or not isinstance(memory, int | float) or memory <= 0:
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


def _framework(cfg: DictConfig, hw: HardwarePlan, machine: Machine) -> FrameworkPlan:
    strategy = cfg.strategy.name
    if strategy not in STRATEGIES:
        raise UserError(f"strategy={strategy} is not supported; use one of {', '.join(STRATEGIES)}")
    if strategy == "auto":
        # DDP for any multi-process run, on CPU too: it is what torchrun and srun start, and gloo runs it.
        strategy = "ddp" if hw.world_size > 1 else "auto"
    precision = str(cfg.trainer.precision)
    if precision not in PRECISIONS:
        raise UserError(f"precision={precision} is not a Lightning precision; use one of {', '.join(PRECISIONS)}")
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
        sync_batchnorm=bool(cfg.model.get("sync_batchnorm", False)) and hw.world_size > 1,
        find_unused_parameters=bool(cfg.strategy.get("find_unused_parameters", False)),
        timeout_s=_positive_int(cfg.strategy.get("timeout_s", 1800), "strategy.timeout_s"),
        env=env,
    )


def _accumulation(batch: DictConfig, global_size: int, world: int) -> int:
    requested = batch.get("accumulation", "auto")
    cap = batch.get("max_per_device")
    if requested != "auto":
        return _positive_int(requested, "batch.accumulation")
    if cap is None:
        return 1
    cap = _positive_int(cap, "batch.max_per_device")
    # Smallest accumulation that splits the global batch evenly with no device above the cap.
    for accumulation in range(max(1, math.ceil(global_size / (world * cap))), global_size // world + 1):
        if global_size % (world * accumulation) == 0 and global_size // (world * accumulation) <= cap:
            return accumulation
    raise UserError(
        f"batch.global_size={global_size} cannot be split over {world} processes with at most "
        f"batch.max_per_device={cap} each; use a global size that is a multiple of {world}"
    )


def _task(cfg: DictConfig, hw: HardwarePlan) -> TaskPlan:
    batch, optim = cfg.batch, cfg.optim
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
    try:
        base_lr = float(optim.lr)
    except (TypeError, ValueError):
        raise UserError(f"optim.lr={optim.lr} is not a number; use e.g. optim.lr=1e-3") from None
    if not base_lr > 0:
        raise UserError(f"optim.lr={optim.lr} must be positive")
    scaling = optim.get("lr_scaling", "none")
    if scaling not in LR_SCALING:
        raise UserError(f"optim.lr_scaling={scaling} is not a rule; use none, linear or sqrt")
    reference = _positive_int(batch.get("reference_size") or global_size, "batch.reference_size")
    ratio = global_size / reference
    lr = base_lr * {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[scaling]
    # Only the tensor loader needs no workers; a data module without a `loader` setting gets them.
    tensor_loader = (cfg.get("data") or {}).get("loader") == "tensor"
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


def make_plan(cfg: DictConfig, machine: Machine) -> Plan:
    """Resolve the three layers from a composed config; `auto` values are read off `machine`."""
    cfg = plain(cfg)
    metric = str(cfg.get("objective", {}).get("metric", "val/acc"))
    if metric.startswith("test/"):
        raise UserError(
            f"objective.metric={metric} is a test metric; tune on validation, e.g. objective.metric=val/acc"
        )
    if isinstance(cfg.get("seed"), bool) or not isinstance(cfg.get("seed"), int):
        raise UserError(f"seed={cfg.get('seed')} is not an integer; use e.g. seed=42")
    hw = _hardware(cfg.hardware, machine)
    return Plan(hardware=hw, framework=_framework(cfg, hw, machine), task=_task(cfg, hw))


# Hardware fields a job that runs on another machine must name: this machine cannot answer for them.
ELSEWHERE_FIELDS = ("accelerator", "devices", "cpus_per_task", "mem_gb")


def plan_elsewhere(cfg: DictConfig) -> Plan:
    """The plan of a job that runs on another machine (a SLURM node, a cloud instance): every resource
    comes from the config, none is read off the submitting machine."""
    hw = cfg.hardware
    auto = [f"hardware.{key}" for key in ELSEWHERE_FIELDS if hw.get(key, "auto") in ("auto", -1)]
    if auto:
        raise UserError(
            f"{', '.join(auto)} cannot be auto for a job that runs on another machine; pick a profile such as "
            f"hardware=1gpu or hardware=8gpu, or set {'=..., '.join(auto)}=..."
        )
    return make_plan(cfg, Machine())


def check_plan(plan: Plan, machine: Machine) -> None:
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
    if hw.num_nodes > 1 and external_launcher() is None:
        raise UserError(
            f"hardware.num_nodes={hw.num_nodes} needs a launcher that starts every node: submit with "
            "hydra/launcher=slurm or start each node with torchrun --nnodes; or use hardware.num_nodes=1"
        )
    if hw.accelerator == "cpu" and fw.precision in ("16-mixed", "16-true"):
        raise UserError(
            f"precision={fw.precision} needs a CUDA GPU; on CPU use precision=bf16-mixed or precision=32-true"
        )
    if hw.accelerator == "gpu" and fw.precision.startswith("bf16") and not machine.bf16:
        raise UserError(
            f"precision={fw.precision} but {machine.gpu_name or 'this GPU'} has no bfloat16 support; use precision=16-mixed"
        )


def apply_plan(plan: Plan, seed: int) -> None:
    """Put the plan's process-wide settings in force: environment knobs, matmul precision, seeds."""
    import pytorch_lightning as pl
    import torch

    os.environ.update(plan.framework.env)
    if plan.framework.matmul_precision:
        torch.set_float32_matmul_precision(plan.framework.matmul_precision)
    pl.seed_everything(seed, workers=True, verbose=False)
