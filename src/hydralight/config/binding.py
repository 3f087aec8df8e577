"""How a `_target_` gets what the run plan offers: by the names its constructor takes.

A module, a network, a data module or a callback names the plan's values it wants in its `__init__`
(`lr`, `num_classes`, `batch_size`, `run_dir`, ...) and gets exactly those; its own arguments come from
its config. An argument of the config that the constructor does not take is refused in one line, as is a
value the user set for the plan that the constructor does not take (it would be silently ignored).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Collection, Mapping
from typing import Any

from hydralight.errors import UserError

# Base classes whose `__init__(*args, **kwargs)` takes no argument of a subclass's config: a subclass that
# passes **kwargs on to them takes no more than it names.
GENERIC_BASES = {
    "builtins.object",
    "torch.nn.modules.module.Module",
    "pytorch_lightning.core.module.LightningModule",
    "pytorch_lightning.core.datamodule.LightningDataModule",
    "lightning.pytorch.core.module.LightningModule",
    "lightning.pytorch.core.datamodule.LightningDataModule",
}


def import_target(path: str, key: str) -> Any:
    """The object `path` names (a class or function), or one line saying why it cannot be imported."""
    import logging

    from hydra.utils import get_object

    said = logging.getLogger("hydra.utils")
    was, said.disabled = said.disabled, True  # its own lines before ours: the refusal below is the one line
    try:
        return get_object(str(path))
    except Exception as err:  # ImportError, AttributeError, or whatever the module raises on import
        module, _, name = str(path).rpartition(".")
        lacks = False
        with contextlib.suppress(Exception):  # the module is there and the name is not: say that, not Python's
            lacks = bool(module) and not hasattr(importlib.import_module(module), name)  # guess (not a package)
        if lacks:
            raise UserError(f"{key}={path} cannot be imported: {module} has no {name}; check the name") from None
        cause = err.__cause__ or err
        reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        raise UserError(
            f"{key}={path} cannot be imported ({type(cause).__name__}: {reason[:200]}); check the module path, "
            "and that its package is installed or on PYTHONPATH"
        ) from None
    finally:
        said.disabled = was


def accepted_arguments(target: Any) -> tuple[set[str], bool]:
    """The argument names `target(...)` takes by keyword, and whether it takes any other (**kwargs that do
    not end in a framework base class): for a class, through `**kwargs` passed on to its bases."""
    if not inspect.isclass(target):
        try:
            params = inspect.signature(target).parameters.values()
        except (TypeError, ValueError):  # builtins without a signature
            return set(), True
        names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        return names, any(p.kind is p.VAR_KEYWORD for p in params)
    taken: set[str] = set()
    for klass in target.__mro__:
        if "__init__" not in vars(klass):
            continue
        if f"{klass.__module__}.{klass.__qualname__}" in GENERIC_BASES:
            return taken, False
        init = list(inspect.signature(vars(klass)["__init__"]).parameters.values())
        taken |= {p.name for p in init if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - {"self"}
        if not any(p.kind is p.VAR_KEYWORD for p in init):
            return taken, False
    return taken, True


def bind(
    target: Any,
    spec: Mapping[str, Any],
    offered: Mapping[str, Any],
    key: str,
    explicit: Mapping[str, str] | None = None,
    through_kwargs: tuple[str, ...] = (),
    origin: str | None = None,
    pending: Collection[str] | None = (),
) -> dict[str, Any]:
    """The offered values `target` takes (those its config sets itself are left to it).

    `key`: where the spec sits in the config (`model`, `model.<key>`, `data`), for messages. `explicit`: offered
    values the user set (value name -> the override that set it), refused when not taken. `through_kwargs`: offered values
    passed to a target that takes **kwargs without naming them (torchvision's model builders pass
    `num_classes` on). `origin`: how the spec came to be, named when one of its arguments is refused (a
    `_target_` replaced on the command line keeps the arguments of the one it replaced). `pending`: values that
    come later (the data's sizes, when the plan is only printed); None: the target is called with more than
    this (a `_partial_` optimizer gets its parameters), so an argument without a default is no one's to refuse.
    """
    names, open_ = accepted_arguments(target)
    name = getattr(target, "__qualname__", str(target))
    if not open_:
        for arg in spec:
            if not arg.startswith("_") and arg not in names:
                came = f"; it came from {origin}" if origin else ""
                raise UserError(
                    f"{key}.{arg} is not an argument of {name} (it takes {', '.join(sorted(names)) or 'none'}){came}; "
                    f"drop it (leave {key}.{arg}=... off the command line, or ~{key}.{arg} where a config sets it), "
                    "or fix its name"
                )
    _check_annotated_types(target, spec, key, name)
    given = {k: v for k, v in offered.items() if k not in spec and (k in names or (open_ and k in through_kwargs))}
    for value_name, override in (explicit or {}).items():
        if value_name in spec:
            raise UserError(
                f"{override} is given, but {key}.{value_name} in its own config decides its {value_name}; "
                f"set {key}.{value_name} instead"
            )
        if value_name not in given:
            # Its config may hold the value one level down (a template's `optimizer: {_partial_: true, lr: ...}`).
            inner = next((f"{key}.{k}.{value_name}" for k, v in spec.items() if isinstance(v, Mapping)
                          and value_name in v), None)  # fmt: skip
            fix = f"set {inner} instead" if inner else f"drop {override} (the module decides its {value_name} itself)"
            raise UserError(
                f"{override} is given, but {name} takes no {value_name} argument, so it would be ignored; {fix}"
            )
    if pending is not None and "_args_" not in spec:
        missing = [
            arg for arg in required_arguments(target) if arg not in spec and arg not in given and arg not in pending
        ]
        if missing:
            came = f" (its config came from {origin})" if origin else ""
            raise UserError(
                f"{name} needs {', '.join(missing)}, which {key} does not give and the run does not offer{came}; "
                f"add +{key}.{missing[0]}=<value>, or give the argument a default"
            )
    return given


def check_values(spec: Mapping[str, Any], key: str, skip: Collection[str] = ()) -> None:
    """Each value of `spec` (a config with a `_target_`) and of the `_target_`s nested in it, at any depth, checked
    against what its constructor's annotation (or number or bool default) asks for, and nothing else: what a
    sweep can check of every value it sweeps before its first job, without the plan each job makes."""
    if "_target_" in spec and not spec.get("_partial_"):
        target = import_target(str(spec["_target_"]), f"{key}._target_")
        values = {k: v for k, v in spec.items() if k not in skip and not isinstance(v, Mapping)}
        _check_annotated_types(target, values, key, getattr(target, "__qualname__", str(target)))
    for name, nested in spec.items():
        if isinstance(nested, Mapping):
            check_values(nested, f"{key}.{name}")


def required_arguments(target: Any) -> list[str]:
    """The arguments `target(...)` cannot be called without (only its own `__init__`: what it passes on to its
    bases it may fill itself)."""
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in params if p.kind in kinds and p.default is inspect.Parameter.empty]


# What a constructor's annotation asks for, where a string that does not read as one is certainly wrong.
_SCALARS: dict[Any, tuple[str, Any]] = {
    int: ("an integer", int),
    float: ("a number", float),
    bool: ("true or false", lambda v: {"true": True, "false": False}[v.lower()]),
}
# Objects a config gives as a `_target_` (a network, an optimizer), never as a word.
_OBJECTS = {
    "torch.nn.modules.module.Module": "a torch nn.Module",
    "torch.optim.optimizer.Optimizer": "a torch optimizer",
    "torch.optim.lr_scheduler.LRScheduler": "a torch learning-rate scheduler",
}


def _check_annotated_types(target: Any, spec: Mapping[str, Any], key: str, name: str) -> None:
    """Refuse a value that cannot be what the constructor's annotation asks for (`model.hidden=abc` or `=1.5` for
    `hidden: int`, a word for a list or for a network): Python would take it, and the run would fail deep inside
    training."""
    try:
        params = inspect.signature(target, eval_str=True).parameters
    except Exception:  # no signature, or annotations that do not evaluate: nothing to check against
        return
    for arg, value in spec.items():
        if arg in params and value is None and params[arg].default is not None and not _takes_none(params[arg]):
            wanted = _not_of(params[arg].annotation, _NULL)
            if wanted is not None:  # an annotation without None, and no None default: null is no value for it
                raise UserError(f"{key}.{arg}=null is no value for {name}'s {arg}: {wanted[1]}; give {wanted[0]}")
        if arg in params and not isinstance(value, dict) and value is not None:
            wrong = _not_of(_annotation(params[arg]), value)
            if wrong is not None:
                said, asked = wrong
                if params[arg].annotation is inspect.Parameter.empty:
                    asked = f"unannotated, default {params[arg].default!r}"
                raise UserError(f"{key}.{arg}={value} is not {said}, which {name} takes ({arg}: {asked}); give {said}")


def _annotation(param: inspect.Parameter) -> Any:
    """What an argument asks for: its annotation, or for an unannotated one with a number or a bool default, that
    kind (`width=32` takes a number, so `width=abc` is wrong; an int default takes a float, as Python would)."""
    if param.annotation is not inspect.Parameter.empty or param.default is None:
        return param.annotation
    kind = type(param.default)
    return {bool: bool, int: float | int, float: float | int}.get(kind, inspect.Parameter.empty)


def _not_of(annotation: Any, value: Any) -> tuple[str, str] | None:
    """(what was asked, the annotation as written) when `value` cannot be what `annotation` asks for; None when it
    can or when the annotation says too little to tell."""
    import collections.abc
    import types
    import typing

    kinds = [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):  # `float | None`, `float | Tensor`
        kinds = [k for k in typing.get_args(annotation) if k is not type(None)]
    if value is _NULL and kinds == [str]:
        return "a string", "str"  # `data_dir=null` for `data_dir: str`
    if any(k is str or k is Any or not (inspect.isclass(k) or typing.get_origin(k)) for k in kinds):
        return None  # a word is welcome, or the annotation is not a plain type
    asked = " | ".join(k.__name__ if inspect.isclass(k) else str(k).replace("typing.", "") for k in kinds)
    scalars = [k for k in kinds if k in _SCALARS]
    sequences = (list, tuple, collections.abc.Sequence)
    if value is _NULL:  # what to say instead of null, when the annotation tells
        if scalars:
            return _SCALARS[scalars[0]][0], asked
        # (An object, such as a scheduler, is often optional in a module's code whatever its annotation says.)
        return ("a list", asked) if all((typing.get_origin(k) or k) in sequences for k in kinds) else None
    if scalars:
        if isinstance(value, list | tuple | dict) and len(scalars) == len(kinds):
            return _SCALARS[scalars[0]][0], asked  # `width=[1]` for an int
        if isinstance(value, str):
            readable = False
            for kind in scalars:
                with contextlib.suppress(ValueError, KeyError):
                    _SCALARS[kind][1](value)
                    readable = True
            return None if readable else (_SCALARS[scalars[0]][0], asked)
        if isinstance(value, bool) and bool not in scalars and len(scalars) == len(kinds):
            return _SCALARS[scalars[0]][0], asked  # `hidden=true` for an int
        if isinstance(value, float) and scalars == [int] and len(kinds) == 1:
            return _SCALARS[int][0], asked  # `hidden=1.5` (or 2.0) for an int
        return None
    if all((typing.get_origin(k) or k) in sequences for k in kinds):
        if isinstance(value, str | int | float):
            return "a list", asked  # `split=abc` for a `tuple[int, int, int]`
        if isinstance(value, list | tuple) and len(kinds) == 1:
            return _not_in(kinds[0], value, asked)
    if isinstance(value, str):
        said = next((what for what in map(_object_of, kinds) if what), None)
        if said is not None:
            return f"{said} (a config with a _target_)", asked
    return None


def _object_of(kind: Any) -> str | None:
    """What `kind` is among the objects a config gives as a `_target_` (`_OBJECTS`), if it is one."""
    mro = {f"{c.__module__}.{c.__qualname__}" for c in getattr(kind, "__mro__", ())}
    return next((what for base, what in _OBJECTS.items() if base in mro), None)


_NULL = object()  # stands for a null value in `_not_of`: what the annotation asks instead


def _takes_none(param: inspect.Parameter) -> bool:
    """Whether an argument's annotation names None (`int | None`, `Optional[int]`)."""
    import types
    import typing

    wanted = param.annotation
    return typing.get_origin(wanted) in (typing.Union, types.UnionType) and type(None) in typing.get_args(wanted)


def _not_in(annotation: Any, items: list[Any] | tuple[Any, ...], asked: str) -> tuple[str, str] | None:
    """An element of a list that cannot be what `list[int]` or `tuple[int, int, int]` asks for each place."""
    import typing

    inner = typing.get_args(annotation)
    if len(inner) == 2 and inner[1] is Ellipsis:  # tuple[int, ...]
        inner = (inner[0],)
    if len(inner) > 1 and len(inner) != len(items):
        return f"a list of {len(inner)} values", asked
    for place, item in enumerate(items):
        kind = inner[place] if len(inner) > 1 else (inner[0] if inner else None)
        wrong = _not_of(kind, item) if kind is not None and not isinstance(item, dict) else None
        if wrong is not None:
            return f"a list whose values are each {wrong[0]} ({item} is not)", asked
    return None


def instantiate(spec: Mapping[str, Any], **given: Any) -> Any:
    """Hydra's `instantiate` of `spec` with the `given` values, containers converted to plain ones unless the spec
    asks otherwise (its own `_convert_`, as Hydra reads it); a UserError its target raises stays one line (Hydra
    would wrap it in an error of its own)."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate as hydra_instantiate

    try:
        return hydra_instantiate(dict(spec), **given, _convert_=spec.get("_convert_", "all"))
    except InstantiationException as err:
        cause = err.__cause__
        if isinstance(cause, UserError):
            raise cause from None
        if cause is None:
            raise
        # The user's own class refused its arguments: one line naming it (the traceback with HYDRA_FULL_ERROR=1).
        raise UserError(
            f"{spec.get('_target_')} could not be built from its config: {type(cause).__name__}: {cause}; "
            "check the values given to it (HYDRA_FULL_ERROR=1 shows the traceback)"
        ) from cause
