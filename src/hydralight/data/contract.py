"""The core's side of the data contract (see hydralight.data): which planned settings a data module
gets, by the arguments its constructor names, and whether Lightning must shard its loaders."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any

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


def shards_by_rank(datamodule: Any) -> bool:
    """Whether the data module's loaders give each rank its share themselves (the project's samplers);
    otherwise Lightning's DistributedSampler must, or every rank would train on every sample."""
    return bool(getattr(datamodule, "shards_by_rank", False))


def accepted_arguments(cls: type) -> set[str]:
    """The argument names `cls(...)` takes, through `**kwargs` passed on to the base classes' `__init__`."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(klass.__init__).parameters.values()
        names |= {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            break
    return names - {"self"}


def datamodule_kwargs(data: Mapping[str, Any], planned: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """The planned settings (and the seed) that the constructor of `data._target_` takes by name.

    A data module that takes neither `global_size` nor `batch_size` is refused: the plan's batch would not
    reach it. A planned setting also written in `data.*` is refused: the plan decides it.
    """
    target = str(data.get("_target_"))
    module, _, name = target.rpartition(".")
    try:
        params = accepted_arguments(getattr(importlib.import_module(module), name))
    except (ImportError, AttributeError, ValueError) as err:  # a misspelt module or class
        raise UserError(f"data._target_={target} cannot be imported ({type(err).__name__}: {err})") from None
    offered = {**planned, "seed": seed}
    for key in offered:
        if key in data and key in params:
            raise UserError(f"data.{key} is set by the plan; set {OWNERS.get(key, key)} instead")
    given = {key: value for key, value in offered.items() if key in params}
    if "global_size" not in given and "batch_size" not in given:
        raise UserError(
            f"the data module {target} takes neither batch_size nor global_size, so the planned batch "
            f"(batch.global_size={planned.get('global_size')}) cannot reach it; give its __init__ a "
            "batch_size argument (the per-device batch) and use it in its loaders"
        )
    return given


def build_datamodule(data: Mapping[str, Any], planned: Mapping[str, Any], seed: int) -> Any:
    """`data._target_` built with its own settings and the planned ones it takes; a UserError raised by
    its constructor stays one line (Hydra would wrap it in its own error)."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    kwargs = datamodule_kwargs(data, planned, seed)
    try:
        return instantiate(data, **kwargs)
    except InstantiationException as err:
        if isinstance(err.__cause__, UserError):
            raise err.__cause__ from None
        raise
