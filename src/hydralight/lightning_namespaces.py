"""Both Lightning namespaces in one process: `lightning.pytorch` is `pytorch_lightning`, `lightning.fabric` is
`lightning_fabric`.

Lightning ships the same code twice, as the `lightning` package (`lightning.pytorch`, Lightning's own docs and
lightning-hydra-template) and as `pytorch_lightning`, and each one's Trainer refuses the other's modules and
callbacks. The project trains with `pytorch_lightning`; once `install()` has run, a user's
`from lightning.pytorch import LightningModule` (or `import lightning as L; L.LightningModule`) gets the very
classes of `pytorch_lightning`, so modules, data modules and callbacks of either namespace train together,
unchanged. Written by hand: Python's import system has no alias of one package for another, and a meta path
finder is the supported way to give one.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

# Each namespace of the `lightning` package and the package that holds the same code.
ALIASES = {"lightning.pytorch": "pytorch_lightning", "lightning.fabric": "lightning_fabric"}
# What `lightning/__init__.py` offers at its top level.
TOP_LEVEL = {
    "LightningModule": "pytorch_lightning",
    "LightningDataModule": "pytorch_lightning",
    "Trainer": "pytorch_lightning",
    "Callback": "pytorch_lightning",
    "seed_everything": "pytorch_lightning",
    "Fabric": "lightning_fabric",
}


def _real_name(name: str) -> str | None:
    for alias, real in ALIASES.items():
        if name == alias or name.startswith(alias + "."):
            return real + name[len(alias) :]
    return None


class _LightningTop(types.ModuleType):
    """The `lightning` package: its namespaces and top-level names, read from the packages that hold them."""

    def __getattr__(self, name: str) -> Any:
        if name in ("pytorch", "fabric"):
            return importlib.import_module(f"lightning.{name}")
        if name in TOP_LEVEL:
            return getattr(importlib.import_module(TOP_LEVEL[name]), name)
        if name == "__version__":
            return importlib.import_module("pytorch_lightning").__version__
        raise AttributeError(f"module 'lightning' has no attribute {name!r}")


class _Aliases(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == "lightning":
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        if _real_name(fullname) is not None:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        if spec.name == "lightning":
            return _LightningTop("lightning")
        real = importlib.import_module(str(_real_name(spec.name)))
        self._specs[spec.name] = real.__spec__  # the import system sets __spec__ of what we return: put it back
        return real

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__name__ == "lightning":
            module.__path__ = []  # a package, so that `lightning.pytorch.callbacks` is looked up
        elif (spec := self._specs.pop(str(module.__spec__.name) if module.__spec__ else "", None)) is not None:
            module.__spec__ = spec

    def __init__(self) -> None:
        self._specs: dict[str, Any] = {}


def install() -> None:
    """Make `lightning`, `lightning.pytorch.*` and `lightning.fabric.*` imports resolve to `pytorch_lightning` and
    `lightning_fabric` in this process (idempotent; what was imported before stays as it was)."""
    if any(isinstance(finder, _Aliases) for finder in sys.meta_path):
        return
    if "lightning" in sys.modules and not isinstance(sys.modules["lightning"], _LightningTop):
        return  # the real package is in use already: a module of it is refused by name (training.modules)
    sys.meta_path.insert(0, _Aliases())
