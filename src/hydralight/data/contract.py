"""The core's side of the data contract (see hydralight.data): which planned settings a data module gets,
by the arguments its constructor names; which sizes it states for the module; where its batches carry
sample ids; whether Lightning must shard its loaders."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hydralight.config.binding import accepted_arguments, bind, import_target, instantiate
from hydralight.errors import UserError

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
# Sizes a data module states for the module and its network when it knows them (before `setup()`).
SIZES = ("num_classes", "input_shape")


def shards_by_rank(datamodule: Any) -> bool:
    """Whether the data module's loaders give each rank its share themselves (the project's samplers);
    otherwise Lightning's DistributedSampler must, or every rank would train on every sample."""
    return bool(getattr(datamodule, "shards_by_rank", False))


def datamodule_kwargs(data: Mapping[str, Any], planned: Mapping[str, Any]) -> dict[str, Any]:
    """The planned settings (the seed included) that the constructor of `data._target_` takes by name.

    A data module that takes neither `global_size` nor `batch_size` is refused: the plan's batch would not
    reach it. A planned setting also written in `data.*` (a lightning-hydra-template data config sets
    `batch_size`, `num_workers`, `pin_memory`) gets the plan's value: `replaced_by_plan` says so.
    """
    target = import_target(str(data.get("_target_")), "data._target_")
    given = bind(target, {k: v for k, v in data.items() if k not in planned}, planned, "data")
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
        f"data.{key}={data[key]} in the data config is replaced by the plan's {planned[key]}; to change it, set "
        f"{OWNERS.get(key, key)}"
        for key in planned
        if key in data and key in names and data[key] != planned[key]
    ]


def build_datamodule(data: Mapping[str, Any], planned: Mapping[str, Any]) -> Any:
    """`data._target_` built with its own settings and the planned ones it takes; a UserError raised by
    its constructor stays one line (Hydra would wrap it in its own error)."""
    return instantiate(data, **datamodule_kwargs(data, planned))


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
