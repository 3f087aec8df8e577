"""Typed configs of the built-in data options (data=mnist, fashion_mnist, imagefolder), checked when a config
is composed. No torch imports: the command line is checked before torch loads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hydralight.config.schema import choice

Loader = choice("Loader", ("tensor", "torchvision"))
FolderLoader = choice("FolderLoader", ("auto", "tensor", "torchvision"))
ImageMode = choice("ImageMode", ("L", "LA", "RGB", "RGBA"))


@dataclass
class MNISTOptions:
    _target_: str = "hydralight.data.MNISTDataModule"
    data_dir: str = "data"
    loader: Loader = Loader.tensor  # type: ignore[attr-defined]
    val_size: int = 5000
    download: bool = True
    max_shift: int = 0


@dataclass
class ImageFolderOptions:
    _target_: str = "hydralight.data.ImageFolderDataModule"
    root: str | None = None
    cache_dir: str | None = None
    size: Any = None  # an int or [height, width]
    mode: ImageMode | None = None
    loader: FolderLoader = FolderLoader.auto  # type: ignore[attr-defined]
    max_memory_gb: float = 4.0
    val_size: float = 0.1  # a fraction below 1, or a number of images
    skip_bad: bool = False
    max_shift: int = 0


# `- /schema@_here_: <name>` in an option's defaults.
SCHEMAS = {"mnist": MNISTOptions, "imagefolder": ImageFolderOptions}
