"""Image files: which files are images, one decoded into a uint8 tensor, and the images of a folder to predict on.

Shared by the image folder data module (its class folders) and every image module's `predict.source` (any
folder of images, with or without class folders).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torchvision.datasets.folder import IMG_EXTENSIONS, has_file_allowed_extension

from hydralight.errors import UserError

# Image modes a network can take as they are, and their channels; others (palette, 16-bit) need data.mode.
CHANNELS = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4}
# File endings read as images (torchvision's ImageFolder list); other files in the folders are ignored.
IMAGE_FILES = IMG_EXTENSIONS
# No label: an image to predict on that lies in no class folder.
UNLABELLED = -1


class BadImage(Exception):
    """A file that does not decode as an image."""


def decode(path: Path, mode: str | None, size: tuple[int, int] | None) -> torch.Tensor:
    """One image as uint8 (C, H, W): converted to `mode` and resized to `size` (H, W) when they are set."""
    import torchvision.transforms.functional as TF
    from PIL import Image

    try:
        with Image.open(path) as opened:
            img: Image.Image = opened
            if mode is not None and img.mode != mode:
                img = img.convert(mode)
            elif mode is None and img.mode not in CHANNELS:
                raise UserError(
                    f"{path} has image mode {img.mode}; set data.mode to one of {', '.join(CHANNELS)} "
                    "to convert every image to it"
                )
            if size is not None and img.size != (size[1], size[0]):
                img = TF.resize(img, list(size))
            return TF.pil_to_tensor(img)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise BadImage(f"{type(err).__name__}: {err}") from None


def images_to_predict(source: str, classes: list[str]) -> list[tuple[Path, int]]:
    """The images under `source`, sorted by path, with their labels: `source/<class>/*` when every folder in it
    is one of `classes` (the data's class names), else every image at any depth, unlabelled. Hidden files and
    folders, and anything that is no regular file, are left out."""
    root = Path(source).expanduser()
    if not root.is_dir():
        raise UserError(
            f"predict.source={source} is not a folder; give a folder of images (or leave predict.source out to "
            "predict on the test split)"
        )
    found = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [  # regular files only: a FIFO or a device named like an image would block its reader
            Path(folder) / n
            for n in names
            if not n.startswith(".") and has_file_allowed_extension(n, IMAGE_FILES) and (Path(folder) / n).is_file()
        ]
    if not found:
        raise UserError(f"predict.source={source} holds no images ({', '.join(IMAGE_FILES)})")
    found.sort()
    top = {path.relative_to(root).parts[0] for path in found if len(path.relative_to(root).parts) > 1}
    loose = any(len(path.relative_to(root).parts) == 1 for path in found)
    labelled = bool(top) and not loose and top <= set(classes)
    label = lambda path: classes.index(path.relative_to(root).parts[0]) if labelled else UNLABELLED  # noqa: E731
    return [(path, label(path)) for path in found]


def decode_all(files: list[Path], shape: tuple[int, int, int], threads: int) -> torch.Tensor:
    """`files` decoded as uint8 (N, C, H, W) of `shape`: each converted to the mode of its channels and resized;
    an unreadable file is refused, naming it."""
    modes = {channels: mode for mode, channels in CHANNELS.items()}
    channels, height, width = shape
    if channels not in modes:
        raise UserError(f"the network takes {channels} channels, which no image mode has ({', '.join(CHANNELS)})")
    images = torch.empty((len(files), *shape), dtype=torch.uint8)

    def one(path: Path) -> torch.Tensor | BadImage:
        try:
            return decode(path, modes[channels], (height, width))
        except BadImage as err:
            return err

    # PIL decodes with the interpreter lock released: threads decode in parallel, no processes needed.
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        for i, (path, image) in enumerate(zip(files, pool.map(one, files), strict=True)):
            if isinstance(image, BadImage):
                raise UserError(f"{path} cannot be read as an image ({image}); replace or delete it")
            images[i] = image
    return images
