"""The run plan: every decision of a run, resolved once from the composed config and the machine before
anything is written, and read by every builder through its own slice.

- hardware, framework, task: the resources (devices, nodes, CPUs, memory; strategy, backend, precision;
  global and per-device batch, accumulation, learning rate, loader workers), each layer depending on the
  one before: the world size fixes the per-device batch, the accelerator the backend and precisions;
- model, data: the module and the data module to build, and the plan's values their constructors get
  by the names they take;
- trainer, callbacks, loggers: what Lightning is given;
- paths, resume, objective: where the run writes, what it continues from, what it is judged by.

Plain data (frozen dataclasses of dicts, lists and numbers): the plan is saved in the run dir and the
extra ranks of a job run exactly that plan.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import timedelta
from typing import Any


@dataclass(frozen=True)
class Machine:
    """What a machine offers; read off this machine by the training layer, injected in tests to plan for
    machines we do not have."""

    gpus: int = 0
    gpu_name: str | None = None
    bf16: bool = False
    tf32: bool = False
    cpu_cores: int = 1
    memory_gb: float = 0.0


@dataclass(frozen=True)
class HardwarePlan:
    accelerator: str  # cpu | gpu
    devices: int  # processes (devices) per node
    num_nodes: int
    world_size: int
    cpus_per_task: int
    mem_gb: float  # host memory per node
    gpus_per_node: int

    def slurm_resources(self, one_task: bool = False) -> dict[str, Any]:
        """The launcher's resource request of one job (sbatch --nodes, --ntasks-per-node, --gpus-per-node,
        --cpus-per-task, --mem). `one_task`: a single process that starts the other ranks itself."""
        tasks = 1 if one_task else self.devices
        return {
            "nodes": self.num_nodes,
            "tasks_per_node": tasks,
            "gpus_per_node": self.gpus_per_node or None,
            "cpus_per_task": self.cpus_per_task * self.devices // tasks,
            "mem_gb": math.ceil(self.mem_gb) or None,
        }

    def dstack_resources(self, shm_size_gb: int) -> dict[str, Any]:
        """dstack's `resources:` of one node: at least what the plan asks for."""
        return {
            "gpu": self.gpus_per_node,
            "cpu": f"{self.cpus_per_task * self.devices}..",
            "memory": f"{math.ceil(self.mem_gb)}GB..",
            "shm_size": f"{shm_size_gb}GB",
        }


@dataclass(frozen=True)
class FrameworkPlan:
    strategy: str  # auto (single process) | ddp | ddp_spawn | fsdp
    backend: str | None  # process-group backend; None for a single process
    precision: str
    matmul_precision: str | None  # torch.set_float32_matmul_precision, on GPUs with TF32
    sync_batchnorm: bool = False  # BatchNorm statistics over all ranks
    find_unused_parameters: bool = False
    timeout_s: int = 1800  # collective operations give up after this long
    env: dict[str, str] = field(default_factory=dict)
    # fsdp: the submodules sharded before the root, and the checkpoint form (full: one file; sharded: a folder).
    shard: list[str] = field(default_factory=list)
    checkpoint: str = "full"


@dataclass(frozen=True)
class TaskPlan:
    global_size: int
    per_device_size: int
    accumulation: int
    eval_size: int
    base_lr: float | None  # None: the module decides its own rate, under a name the plan cannot read
    lr_scaling: str
    lr: float | None
    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    drop_last: bool


@dataclass(frozen=True)
class ModelPlan:
    """The LightningModule to train (a built-in one or your own): `spec` is its `_target_` and its own
    arguments; `offered` the plan's values its constructor gets when it names them."""

    spec: dict[str, Any]
    offered: dict[str, Any]
    # Offered values the user set himself (their config keys): refused when the constructor does not take them.
    explicit: dict[str, str] = field(default_factory=dict)
    invariant_dropout: bool = True
    sync_batchnorm: bool = False  # as configured (the framework's applies it when there are several processes)
    # For messages: the model option chosen (model=cnn), and a `_target_` the command line replaced in it.
    option: str | None = None
    replaced: str | None = None

    @property
    def lr_offered(self) -> bool:
        """Whether the module gets the plan's learning rate (as `lr`, or inside the optimizer it is offered)."""
        return "lr" in self.offered or "lr" in (self.offered.get("optimizer") or {})


# Each setting the core may pass, and where a user sets it instead of in `data.*`.
OWNERS = {
    "global_size": "batch.global_size",
    "batch_size": "batch.global_size (the per-device batch follows from it)",
    "accumulation": "batch.accumulation or batch.max_per_device",
    "eval_size": "batch.eval_size",
    "num_workers": "batch.num_workers",
    "pin_memory": "batch.pin_memory",
    "persistent_workers": "batch.num_workers",
    "drop_last": "batch.drop_last",
    "seed": "seed",
}


@dataclass(frozen=True)
class DataPlan:
    """The LightningDataModule: its `_target_` and own arguments, and the planned loader settings its
    constructor gets when it names them."""

    spec: dict[str, Any]
    offered: dict[str, Any]
    # Planned settings the command line set (name -> the override): refused when the constructor does not take them.
    explicit: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PathsPlan:
    run_dir: str
    sweep_dir: str | None = None  # the sweep this run is a job of
    job_name: str | None = None  # the job's overrides in one word (Hydra's override_dirname)
    overrides: list[str] = field(default_factory=list)  # the command line's, as given


@dataclass(frozen=True)
class ResumePlan:
    """What the run starts from, decided from the run dir's files before anything is written."""

    mode: str  # train | eval
    policy: str  # auto | never
    continue_from: str | None = None  # the checkpoint `fit` continues from
    own: bool = False  # continue_from is this run's own last.ckpt
    ckpt_path: str | None = None  # as given: the checkpoint a train run starts from, or the one eval tests
    init_from: str | None = None  # weights only
    finished: dict[str, Any] | None = None  # results of this very run, already finished: nothing to do
    # The run dir holds a finished run (its config may differ): read once, before this attempt's record replaces
    # it, and carried to every rank in the plan.
    finished_before: bool = False


@dataclass(frozen=True)
class ObjectivePlan:
    metric: str
    direction: str  # max | min


@dataclass(frozen=True)
class RunPlan:
    seed: int
    hardware: HardwarePlan
    framework: FrameworkPlan
    task: TaskPlan
    model: ModelPlan
    data: DataPlan
    trainer: dict[str, Any]  # Lightning Trainer arguments, the planned ones included
    callbacks: dict[str, dict[str, Any]]
    loggers: dict[str, dict[str, Any]]
    paths: PathsPlan
    resume: ResumePlan
    objective: ObjectivePlan
    config: dict[str, Any]  # the composed config it was resolved from (config.yaml)

    # -- the resources' consumers ----------------------------------------------------------------

    def trainer_kwargs(self, shards_by_rank: bool = True) -> dict[str, Any]:
        """Every Trainer argument but the strategy, plugins, callbacks and loggers; `shards_by_rank`: the data
        module's loaders take each rank's share themselves (hydralight.data.contract.shards_by_rank)."""
        # Our samplers shard by rank themselves; Lightning's DistributedSampler would re-shuffle and pad.
        # A data module without them needs it, or every rank would train on every sample.
        return {**self.trainer, "use_distributed_sampler": not shards_by_rank}

    def strategy_kwargs(self) -> dict[str, Any] | None:
        """The DDP or FSDP strategy's arguments; None for a single process."""
        fw = self.framework
        shard, checkpoint = list(fw.shard), fw.checkpoint  # fsdp's; the plan refuses them for the others
        if fw.strategy == "auto":
            return None
        common = {"process_group_backend": fw.backend, "timeout": timedelta(seconds=fw.timeout_s)}
        if fw.strategy == "fsdp":
            return {**common, "shard": shard, "sharded_checkpoint": checkpoint == "sharded"}
        return {**common, "find_unused_parameters": fw.find_unused_parameters}

    @property
    def global_batchnorm(self) -> bool:
        """BatchNorm over every rank's micro-batch by the project's own layer: torch's SyncBatchNorm runs on GPUs only."""
        return self.framework.sync_batchnorm and self.hardware.accelerator == "cpu"

    def replace(self, **changes: Any) -> RunPlan:
        """A copy with some slices replaced (the plan itself never changes)."""
        return replace(self, **changes)

    # -- records and display --------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunPlan:
        """The plan a run saved (the extra ranks of a job read it)."""
        kinds = {
            "hardware": HardwarePlan, "framework": FrameworkPlan, "task": TaskPlan, "model": ModelPlan,
            "data": DataPlan, "paths": PathsPlan, "resume": ResumePlan, "objective": ObjectivePlan,
        }  # fmt: skip
        return cls(**{f.name: kinds[f.name](**data[f.name]) if f.name in kinds else data[f.name] for f in fields(cls)})

    def rows(self) -> list[tuple[str, str, str]]:
        """(layer, setting, value) rows for display: the three resource layers, then what the run builds."""
        rows = [
            (layer, key, "-" if value is None or value == {} else str(value))
            for layer, part in (("hardware", self.hardware), ("framework", self.framework), ("task", self.task))
            for key, value in asdict(part).items()
        ]
        if not self.model.lr_offered:  # the module keeps its own learning rate
            rows = [(layer, key, f"{value} (the module's own)" if key == "lr" else value) for layer, key, value in rows]
        if self.framework.strategy == "fsdp":
            rows.append(("framework", "state per device", self.state_per_device()))
        resume = self.resume.continue_from or self.resume.init_from or "-"
        rows += [
            ("run", "model", str(self.model.spec.get("_target_"))),
            ("run", "data", str(self.data.spec.get("_target_"))),
            ("run", "objective", f"{self.objective.direction} {self.objective.metric}"),
            ("run", "mode", self.resume.mode),
            ("run", "starts from", resume),
            ("run", "run dir", self.paths.run_dir),
        ]
        return rows

    def state_per_device(self) -> str:
        """What each device holds of the parameters and optimizer state under fsdp, beside DDP's full copy. The
        sizes come from the module, built only when the run starts (it logs them in bytes); here the shares."""
        world = self.hardware.world_size
        units = "".join(f"{name}.*, " for name in self.framework.shard) or "each child, "
        return (
            f"params + optimizer state: 1/{world} of each unit ({units}the root) per device; DDP: a full copy on "
            f"each (MB of both logged after step 1; a module's own configure_model picks its units)"
        )

    def table(self) -> str:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="Run plan")
        for col in ("layer", "setting", "value"):
            table.add_column(col)
        previous = None
        for layer, key, value in self.rows():
            table.add_row(layer if layer != previous else "", key, value)
            previous = layer
        console = Console(width=110, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
        console.print(table)
        return console.export_text()
