"""Building the module a run trains: any LightningModule named by `model._target_` (the built-in ones are
built the same way), given the plan's values and the data's sizes its constructor names, with the project's keyed
layers put in."""

from __future__ import annotations

import inspect
from collections.abc import Collection
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.utilities.model_helpers import is_overridden
from torch import nn

from hydralight.config.binding import bind, import_target, instantiate
from hydralight.config.plan import ModelPlan, RunPlan
from hydralight.errors import UserError


def module_class(spec: dict[str, Any]) -> type[pl.LightningModule]:
    """The LightningModule class `model._target_` names; one line for anything else."""
    target = import_target(str(spec.get("_target_")), "model._target_")
    if inspect.isclass(target) and issubclass(target, pl.LightningModule):
        return target
    path = spec.get("_target_")
    if inspect.isclass(target) and any(k.__module__.startswith("lightning.") for k in target.__mro__):
        raise UserError(
            f"model._target_={path} is a LightningModule of the `lightning` package, imported in this process before "
            "hydralight could map `lightning.pytorch` to `pytorch_lightning` (the same code, whose Trainer runs it); "
            "import hydralight first, or write its imports as `pytorch_lightning`"
        )
    if inspect.isclass(target) and issubclass(target, nn.Module):
        raise UserError(
            f"model._target_={path} is a torch nn.Module, not a LightningModule: wrap it in a LightningModule of your "
            "own, or give it as the network of a model option that takes one (`--cfg job` shows its keys)"
        )
    raise UserError(f"model._target_={path} is not a LightningModule class; name the class of your module")


def origin(model: ModelPlan) -> str | None:
    """How the model's config came to be, for a refused argument: a `_target_` replaced on the command line
    keeps the arguments of the option it replaced."""
    if model.replaced:
        return f"model={model.option or '?'}, whose {model.replaced} the command line replaced"
    return None


def constructor_kwargs(model: ModelPlan, sizes: dict[str, Any], pending: Collection[str] = ()) -> dict[str, Any]:
    """What the module's constructor gets from the plan and the data: the values it names (checked before
    anything is built: an argument it does not take, one it cannot do without, a plan value set for it and not
    taken, are one line). `pending`: the sizes the data will state, when it is not read (`plan=true`)."""
    cls = module_class(model.spec)
    offered = {**model.offered, **sizes}
    for key, size in sizes.items():  # the data decides its sizes: another value would fail inside the first step
        given = model.spec.get(key)
        if given is not None and given != (list(size) if isinstance(size, tuple) else size) and given != size:
            raise UserError(
                f"model.{key}={given} differs from the {key} the data states ({size}); drop model.{key}: "
                "the module gets it from the data"
            )
    # Its nested targets (a network): Hydra builds them from their own config first, unless the module
    # builds them itself (`_recursive_: false`) and may give them more.
    _check_nested(model.spec, "model", origin(model), complete=model.spec.get("_recursive_") is not False)
    return bind(cls, model.spec, offered, "model", explicit=model.explicit, origin=origin(model), pending=pending)


def _check_nested(spec: dict[str, Any], key: str, came: str | None, complete: bool) -> None:
    """The `_target_`s nested in `spec`, at any depth, each checked against its constructor as `bind` checks the
    module's (`complete`: what its config gives is all it gets, as when Hydra builds it)."""
    for name, nested in spec.items():
        if not isinstance(nested, dict):
            continue
        where = f"{key}.{name}"
        if "_target_" in nested and not nested.get("_partial_"):
            target = import_target(str(nested["_target_"]), f"{where}._target_")
            bind(target, nested, {}, where, origin=came, pending=() if complete else None)
        _check_nested(nested, where, came, complete)


def check_constructors(plan: RunPlan) -> None:
    """What the constructors of the data module and the module (and their nested targets) take, checked as the
    run will call them, before any data is read or downloaded (the sizes the data states come with it)."""
    from hydralight.data.contract import datamodule_kwargs, size_names

    datamodule_kwargs(plan.data.spec, plan.data.offered, plan.data.explicit)
    if plan.resume.mode == "train":  # mode=eval/predict: the module the checkpoint holds, checked with it
        constructor_kwargs(plan.model, {}, pending=size_names(plan.data.spec))


def build_module(model: ModelPlan, sizes: dict[str, Any]) -> pl.LightningModule:
    """The module of the plan. Nested `_target_`s of its config are built by Hydra first (a module that
    takes an `nn.Module` or a `_partial_` optimizer gets them built); a module whose config says
    `_recursive_: false` builds them itself (sized by the data, as the built-in one does)."""
    return instantiate(model.spec, **constructor_kwargs(model, sizes))


def validates(module: pl.LightningModule) -> bool:
    """Whether the module has a validation step (an objective to choose checkpoints and tune on)."""
    return is_overridden("validation_step", module)


def tests(module: pl.LightningModule, data: Any) -> bool:
    """Whether there is a test stage: a test step, and test data from the data module (or the module)."""
    source = data if isinstance(data, pl.LightningDataModule) else module
    return is_overridden("test_step", module) and is_overridden("test_dataloader", source)
