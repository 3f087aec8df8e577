"""What a file may name: the `_target_`s inside a checkpoint or a saved run config are data, never a licence to
run code.

A `_target_` is a callable Hydra will call, so a checkpoint of plain strings and dicts (it passes torch's
`weights_only=True`) could otherwise name `builtins.open` with a `file=` argument. A target read from a file is
built only when the user's own configs name it (this run's composed config, or any option on the config search
path: the shipped options and `./conf` of the folder run from), or when it is a torch module, optimizer or
schedule class (constructors that make tensors and nothing else). Interpolations (`${oc.env:...}`) read from a
file are refused too: they would copy environment values into the run's records.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

from hydralight.config.folders import SHIPPED_CONF, user_conf
from hydralight.errors import UserError

# Base classes whose constructors build parameters and buffers only: a file may name their subclasses that
# torch, torchvision and this project ship.
SAFE_BASES = frozenset(
    {"torch.nn.modules.module.Module", "torch.optim.optimizer.Optimizer", "torch.optim.lr_scheduler.LRScheduler"}
)
SAFE_PACKAGES = ("torch.", "torchvision.", "hydralight.")


def targets(value: Any, at: str = "") -> Iterator[tuple[str, Any]]:
    """Every `_target_` inside `value` (dicts and lists, at any depth, `_args_` included), with its key path."""
    if isinstance(value, dict):
        if "_target_" in value:
            yield (at or "_target_"), value["_target_"]
        for key, item in value.items():
            yield from targets(item, f"{at}.{key}" if at else str(key))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from targets(item, f"{at}[{i}]")


def _interpolations(value: Any, at: str = "") -> Iterator[str]:
    if isinstance(value, str) and "${" in value:
        yield at
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _interpolations(item, f"{at}.{key}" if at else str(key))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _interpolations(item, f"{at}[{i}]")


def _targets_in_folder(folder: Path) -> frozenset[str]:
    found: set[str] = set()
    for path in sorted(folder.rglob("*.yaml")):
        try:
            loaded = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError, UnicodeDecodeError):
            continue  # an option Hydra cannot read names nothing
        found |= {str(t) for _, t in targets(loaded)}
    return frozenset(found)


@functools.lru_cache(maxsize=1)
def _shipped_targets() -> frozenset[str]:
    return _targets_in_folder(SHIPPED_CONF)  # read once: the package's options do not change while it runs


def configured_targets(config: Any = None, folders: Iterable[Path] | None = None) -> set[str]:
    """The targets the user's own configs name: those of `config` (this run's, composed from the command line)
    and of every option in `folders` (the shipped ones and ./conf's)."""
    names = {str(t) for _, t in targets(config)} if config is not None else set()
    if folders is None:
        folders = [SHIPPED_CONF, *filter(None, [user_conf()])]
    for folder in folders:
        if folder == SHIPPED_CONF:
            names |= _shipped_targets()
        elif folder.is_dir():
            names |= _targets_in_folder(folder)
    return names


def _safe_class(name: str) -> bool:
    """A class of torch, torchvision or this project whose constructor only builds tensors."""
    if not name.startswith(SAFE_PACKAGES):
        return False
    from hydra.utils import get_object

    try:
        obj = get_object(name)
    except Exception:  # not importable: not trusted, and said as such below
        return False
    return inspect.isclass(obj) and any(f"{k.__module__}.{k.__qualname__}" in SAFE_BASES for k in obj.__mro__)


def check_trusted(value: Any, trusted: set[str], source: str) -> None:
    """Refuse, in one line and before anything is imported or built, a `_target_` in `value` (read from
    `source`) that neither the user's configs name nor is a safe class, and any interpolation in it."""
    for at in _interpolations(value):
        raise UserError(
            f"{source} holds an interpolation at {at} ('${{...}}'), which a saved config never does; it is not "
            "read: use a checkpoint or run dir this project wrote"
        )
    for at, target in targets(value):
        if not isinstance(target, str) or not target:
            raise UserError(
                f"{source} names no importable target at {at}; use a checkpoint or run dir this project wrote"
            )
        if target in trusted or _safe_class(target):
            continue
        raise UserError(
            f"{source} names {target} at {at}, which none of your configs names, so it is not built (a checkpoint "
            f"or run dir is data, not code); if you trust it, name it yourself ({at}._target_={target} on the "
            "command line, or an option in conf/)"
        )
