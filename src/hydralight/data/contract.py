"""The core's side of the data contract (see hydralight.data): which planned settings a data module gets,
by the arguments its constructor names; which sizes it states for the module; where its batches carry
sample ids; whether Lightning must shard its loaders."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from hydralight.config.binding import accepted_arguments, bind, import_target, instantiate
from hydralight.config.plan import OWNERS
from hydralight.errors import UserError
from hydralight.rundir.launch import global_rank

# Sizes a data module states for the module and its network when it knows them (before `setup()`).
SIZES = ("num_classes", "input_shape")


def shards_by_rank(datamodule: Any) -> bool:
    """Whether the data module's loaders give each rank its share themselves (the project's samplers);
    otherwise Lightning's DistributedSampler must, or every rank would train on every sample."""
    return bool(getattr(datamodule, "shards_by_rank", False))


def datamodule_kwargs(
    data: Mapping[str, Any], planned: Mapping[str, Any], explicit: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The planned settings (the seed included) that the constructor of `data._target_` takes by name.

    A data module that takes neither `global_size` nor `batch_size` is refused: the plan's batch would not
    reach it. A planned setting also written in `data.*` (a lightning-hydra-template data config sets
    `batch_size`, `num_workers`, `pin_memory`) gets the plan's value: `replaced_by_plan` says so. A setting the
    command line gave (`explicit`: batch.drop_last=true) that the constructor does not take is refused.
    """
    target = import_target(str(data.get("_target_")), "data._target_")
    given = bind(target, {k: v for k, v in data.items() if k not in planned}, planned, "data", explicit)
    if "global_size" not in given and "batch_size" not in given:
        raise UserError(
            f"the data module {data.get('_target_')} takes neither batch_size nor global_size, so the planned batch "
            f"(batch.global_size={planned.get('global_size')}) cannot reach it; give its __init__ a "
            "batch_size argument (the per-device batch) and use it in its loaders"
        )
    return given


def replaced_by_plan(data: Mapping[str, Any], planned: Mapping[str, Any]) -> list[str]:
    """One line for each planned setting the data config gives another value than the plan's: the plan wins
    (its batch math holds on any hardware), and the line names where to change it."""
    target = import_target(str(data.get("_target_")), "data._target_")
    names, _ = accepted_arguments(target)
    return [
        f"data.{key}={data[key]} in the data config is replaced by the plan's "
        f"{'per-device batch of ' if key == 'batch_size' else ''}{planned[key]}; to change it, set "
        f"{OWNERS.get(key, key)}"
        for key in planned
        if key in data and key in names and data[key] != planned[key]
    ]


def last_batch_note(data: Mapping[str, Any], planned: Mapping[str, Any]) -> str | None:
    """A line when the plan drops each epoch's last, smaller batch (`batch.drop_last`, the default) and the data
    module takes no `drop_last`: its own loaders decide, and the plan's global batch may not hold for that step."""
    if not planned.get("drop_last"):
        return None
    names, _ = accepted_arguments(import_target(str(data.get("_target_")), "data._target_"))
    if "drop_last" in names:
        return None
    return (
        f"the data module {data.get('_target_')} takes no drop_last: its loaders decide whether an epoch's last, "
        "smaller batch trains (the plan's global batch does not hold for that step); give its __init__ a drop_last "
        "argument for its training loader to follow batch.drop_last"
    )


def build_datamodule(
    data: Mapping[str, Any], planned: Mapping[str, Any], explicit: Mapping[str, str] | None = None
) -> Any:
    """`data._target_` built with its own settings and the planned ones it takes; a UserError raised by
    its constructor stays one line (Hydra would wrap it in its own error)."""
    return instantiate(data, **datamodule_kwargs(data, planned, explicit))


def with_planned_batch(module: Any, data: Mapping[str, Any], planned: Mapping[str, Any], world_size: int) -> Any:
    """The data module, built again where needed so that its training loader yields the plan's batch per device
    (call it once the data is prepared).

    The rule for `batch_size` (a data module that takes it, not the project's `global_size`): it is what the
    module's training loader yields on each device. On several processes the module is first set up as one
    rank would be, and its loader's batch read: a module that divides `batch_size` by the world size itself
    (as lightning-hydra-template's does in `setup`) means a global batch by it, and is built again with the
    per-device batch times the world size, said in one `note:` line; any other batch is refused in one line.
    """
    kwargs = datamodule_kwargs(data, planned)
    if world_size == 1 or "batch_size" not in kwargs or "global_size" in kwargs:
        return module
    wanted = int(kwargs["batch_size"])
    seen = loader_batch_size(module, world_size)
    if seen == wanted:
        return module
    if seen is not None and seen * world_size != wanted:
        raise UserError(_batch_refusal(data, wanted, seen, world_size))
    # It divides by the world size (or its setup refused the per-device batch, as such a module refuses one the
    # world size does not divide): given the global batch, its loader must yield the planned one.
    divider = instantiate(data, **{**kwargs, "batch_size": wanted * world_size})
    again = loader_batch_size(divider, world_size)
    if seen is None and again != wanted:
        return module  # what its loaders yield is measured again at the first batch (training.guards)
    if again not in (None, wanted):
        raise UserError(_batch_refusal(data, wanted, again, world_size))
    if global_rank() == 0:
        gave = f"its loader gave {seen} per device" if seen is not None else "its setup refused it"
        print(
            f"note: the data module {data.get('_target_')} divides batch_size by the world size itself ({gave} "
            f"for batch_size={wanted}), so it is given batch_size={wanted * world_size}: each of the {world_size} "
            f"processes trains on the planned {wanted}",
            file=sys.stderr,
            flush=True,
        )
    return divider


def _batch_refusal(data: Mapping[str, Any], wanted: int, seen: int, world_size: int) -> str:
    return (
        f"the data module {data.get('_target_')} was given batch_size={wanted} (the per-device batch of the plan) "
        f"but its training loader yields batches of {seen} on each of {world_size} processes; build its loaders "
        "with batch_size as given (the project divides the global batch: batch.global_size)"
    )


def loader_batch_size(datamodule: Any, world_size: int) -> int | None:
    """The batch size of the data module's training loader when it is set up as this process's rank of
    `world_size` processes; None when that cannot be told before training (its `setup` asks its trainer for
    more than a stand-in answers, its loader has no batch size).

    The stand-in trainer answers what data modules ask of theirs in `setup`; the module is set up for real
    again by Lightning (modules keep what `setup` loaded, as Lightning calls it once per stage anyway)."""
    rank = global_rank()
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    stand_in = SimpleNamespace(
        world_size=world_size, global_rank=rank, local_rank=rank % devices, node_rank=rank // devices,
        num_devices=devices, num_nodes=max(1, world_size // devices), is_global_zero=rank == 0,
    )  # fmt: skip
    had = getattr(datamodule, "trainer", None)
    try:
        datamodule.trainer = stand_in
        datamodule.setup("fit")
        loader = datamodule.train_dataloader()
    except Exception:  # its own trainer's answers are needed: the first batch is measured instead
        return None
    finally:
        datamodule.trainer = had
    size = getattr(loader, "batch_size", None)
    if size is None:
        size = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    return int(size) if isinstance(size, int) else None


def size_names(data: Mapping[str, Any]) -> tuple[str, ...]:
    """The sizes the data module of `data._target_` may state, read from its class (no data is read)."""
    target = import_target(str(data.get("_target_")), "data._target_")
    return (*SIZES, *getattr(target, "sizes", ()))


def stated_sizes(datamodule: Any) -> dict[str, Any]:
    """The sizes a data module states (`num_classes`, `input_shape`, and any name it lists in `sizes`, such
    as a language model's `vocab_size`); those it does not state are left to the module's own defaults."""
    names = (*SIZES, *getattr(datamodule, "sizes", ()))
    return {key: getattr(datamodule, key) for key in names if hasattr(datamodule, key)}


def batch_sample_ids(batch: Any) -> Any:
    """The sample ids of a batch of a data module that says `sample_ids = True`: the last element of a tuple
    or list batch, or the `ids` entry of a dict batch; None when there are none."""
    if isinstance(batch, dict):
        return batch.get("ids")
    if isinstance(batch, tuple | list) and len(batch) >= 2:
        return batch[-1]
    return None
