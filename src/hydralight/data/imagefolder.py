"""Your own images in class folders: `root/train/<class>/*` and `root/test/<class>/*`, classes from the
folder names (sorted), validation carved from train.

Small data sets (up to `max_memory_gb` decoded) are decoded once into one uint8 tensor per split, cached
on disk for the next runs and jobs, and then train as the built-in data sets do (the tensor loader, the same
samplers, keyed augmentation and resume). Larger ones are decoded per sample by DataLoader workers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset
from torchvision.datasets.folder import has_file_allowed_extension, make_dataset

from hydralight.data.decode_cache import cached
from hydralight.data.files import CHANNELS, IMAGE_FILES, BadImage, decode
from hydralight.data.images import ImageDataModule
from hydralight.errors import UserError, run_config_check

log = logging.getLogger(__name__)

# Bump when the cache's content changes meaning: older caches are then rebuilt.
CACHE_FORMAT = 1
STATS_SAMPLES = 2000  # images the per-sample loader's mean/std are measured on


@dataclass(frozen=True)
class Listing:
    classes: list[str]
    train: list[tuple[Path, int]]
    test: list[tuple[Path, int]]


def default_cache_dir() -> Path:
    """The per-user cache (`$XDG_CACHE_HOME/hydralight`, else `~/.cache/hydralight`): never inside the data,
    which is often shared or read-only."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hydralight"


def class_folders(split_dir: Path) -> list[str]:
    """The class names of a split: its sub-folders, sorted, hidden ones left out."""
    return sorted(e.name for e in os.scandir(split_dir) if e.is_dir() and not e.name.startswith("."))


def image_files(split_dir: Path, classes: list[str], names: list[str], hidden: list[str]) -> list[tuple[Path, int]]:
    """The images of the class folders `names` of a split (sub-folders included) with their labels (the index
    in `classes`), listed by torchvision's class-folder listing. Files under a hidden name at any depth (a
    notebook's `.ipynb_checkpoints`, `.DS_Store`) are left out and added to `hidden`."""

    def wanted(path: str) -> bool:
        if any(part.startswith(".") for part in Path(path).relative_to(split_dir).parts):
            hidden.append(path)
            return False
        return has_file_allowed_extension(path, IMAGE_FILES)

    labels = {name: classes.index(name) for name in names}
    found = make_dataset(split_dir, labels, is_valid_file=wanted, allow_empty=True)
    return [(Path(path), label) for path, label in found]


def list_images(root: Path) -> Listing:
    """Every image of `root/train` and `root/test` with its label; a layout that cannot train is refused."""
    where = {}
    for split in ("train", "test"):
        where[split] = root / split
        if not where[split].is_dir():
            raise UserError(
                f"{root} has no {split}/ folder; data=imagefolder reads {root}/train/<class>/* and {root}/test/<class>/*"
            )
    classes = class_folders(where["train"])
    files: dict[str, list[tuple[Path, int]]] = {}
    hidden: list[str] = []
    for split, folder in where.items():
        names = class_folders(folder)
        hidden += [str(e.path) for e in os.scandir(folder) if e.name.startswith(".")]
        if not names:
            raise UserError(f"{folder} holds no class folders; put each class's images in {folder}/<class>/")
        if unknown := [name for name in names if name not in classes]:
            raise UserError(
                f"{folder / unknown[0]} is a class that {where['train']} does not have; "
                f"add {where['train'] / unknown[0]}/ with its training images, or remove it from {split}/"
            )
        files[split] = image_files(folder, classes, names, hidden)
        if empty := sorted(set(names) - {classes[label] for _, label in files[split]}):
            raise UserError(
                f"{folder / empty[0]} holds no images ({', '.join(IMAGE_FILES)}); add some or remove the folder"
            )
    if hidden:
        log.info(f"left out {len(hidden)} hidden files and folders under {root} (such as {hidden[0]})")
    return Listing(classes, files["train"], files["test"])


def channel_stats(images: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and standard deviation of uint8 (N, C, H, W) images, scaled to [0, 1]."""
    total = torch.zeros(images.shape[1], dtype=torch.float64)
    squares = torch.zeros_like(total)
    for chunk in images.split(1024):  # float64 of the whole set at once could be 8x its memory
        values = chunk.to(torch.float64).div_(255.0)
        total += values.sum((0, 2, 3))
        squares += values.square().sum((0, 2, 3))
    count = images.shape[0] * images.shape[2] * images.shape[3]
    mean = total / count
    # A channel that never changes (a constant alpha) would divide by zero: one grey level at least.
    std = (squares / count - mean.square()).clamp_min(0).sqrt().clamp_min(1 / 255)
    return tuple(mean.tolist()), tuple(std.tolist())


@dataclass(frozen=True)
class ImageSpec:
    """What every image becomes: converted to `mode` and resized to `size` when set, and then of `shape`."""

    mode: str | None
    size: tuple[int, int] | None
    shape: tuple[int, int, int]
    first: Path  # the image the shape was read from, named when another one differs

    def decode(self, path: Path) -> torch.Tensor:
        """One image, refused (naming it) when its size or channels differ from the others'."""
        image = decode(path, self.mode, self.size)
        if tuple(image.shape) != self.shape:
            c, h, w = self.shape
            fix = "data.size=[H,W] to resize every image" if image.shape[1:] != (h, w) else "data.mode to convert"
            raise UserError(
                f"{path} is {image.shape[0]}x{image.shape[1]}x{image.shape[2]} (channels x height x width) but "
                f"{self.first} is {c}x{h}x{w}; set {fix} to one shape"
            )
        return image


class FolderImages(Dataset):
    """The per-sample loader's Dataset: each image decoded, checked and normalized when asked for."""

    def __init__(
        self, spec: ImageSpec, files: list[tuple[Path, int]], mean: Sequence[float], std: Sequence[float]
    ) -> None:
        self.spec, self.files = spec, files
        self.mean, self.std = list(mean), list(std)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        import torchvision.transforms.functional as TF

        path, label = self.files[index]
        try:
            image = self.spec.decode(path)
        except BadImage as err:
            raise UserError(f"{path} cannot be read as an image ({err}); replace or delete it") from None
        return TF.normalize(image.float().div_(255.0), self.mean, self.std), label


class ImageFolderDataModule(ImageDataModule):
    """Images in class folders, any size and channel count (see the module's docstring).

    `size` (an int or [H, W]) resizes every image; without it, all must have one size. `mode` (L, LA, RGB,
    RGBA) converts every image; without it, all must have one of those modes. `loader=auto` decodes into
    memory when the decoded images take at most `max_memory_gb`, else per sample with workers.
    `skip_bad` leaves out unreadable images (counted in the log) instead of refusing them. Mean and
    standard deviation per channel are measured on the training images and cached with them.
    """

    loaders = ("auto", "tensor", "torchvision")

    @classmethod
    def check_config(cls, config: dict[str, Any]) -> None:
        """Refuse values of its config before anything is built or launched (`plan=true` too)."""
        if not config.get("root"):
            raise ValueError("data=imagefolder needs data.root=PATH: a folder holding train/<class>/ and test/<class>/")
        mode = config.get("mode")
        if mode is not None and str(mode) not in CHANNELS:
            raise ValueError(f"data.mode={mode} is not an image mode; use one of {', '.join(CHANNELS)}")

    def __init__(
        self,
        root: str | None,
        cache_dir: str | None = None,
        size: int | Sequence[int] | None = None,
        mode: str | None = None,
        loader: str = "auto",
        max_memory_gb: float = 4.0,
        skip_bad: bool = False,
        val_size: int | float = 0.1,
        **kwargs: Any,
    ) -> None:
        super().__init__(loader=loader, val_size=val_size, **kwargs)
        run_config_check(self.check_config, {"root": root, "mode": mode})
        self.root = Path(str(root)).expanduser()
        if not self.root.is_dir():
            raise UserError(f"data.root={root} is not a folder; give the folder holding train/ and test/")
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
        self.size = _size(size)
        self.mode = None if mode is None else str(mode)
        self.max_memory_gb = max_memory_gb
        self.skip_bad = skip_bad
        self._content: dict[str, Any] | None = None
        self.cache_reused: bool | None = None  # after prepare_data: whether the decode cache was reused

    # The contract: cheap before setup (folder names, one image's header).
    @cached_property
    def classes(self) -> list[str]:
        return class_folders(self.root / "train") if (self.root / "train").is_dir() else self.listing.classes

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @cached_property
    def input_shape(self) -> tuple[int, int, int]:
        if self.mode is not None and self.size is not None:
            return (CHANNELS[self.mode], *self.size)
        from PIL import Image

        first = self.listing.train[0][0]
        try:
            with Image.open(first) as img:  # the header only: nothing is decoded
                mode, (width, height) = self.mode or img.mode, img.size
        except (OSError, SyntaxError, ValueError) as err:
            raise UserError(
                f"{first} cannot be read as an image ({type(err).__name__}: {err}); replace or delete it, or set "
                "data.mode and data.size so that no image has to be read to know the input shape"
            ) from None
        if mode not in CHANNELS:
            raise UserError(
                f"{first} has image mode {mode}; set data.mode to one of {', '.join(CHANNELS)} to convert every image"
            )
        return (CHANNELS[mode], *(self.size or (height, width)))

    @property
    def mean(self) -> tuple[float, ...]:
        return tuple(self.content()["mean"])

    @property
    def std(self) -> tuple[float, ...]:
        return tuple(self.content()["std"])

    @cached_property
    def listing(self) -> Listing:
        return list_images(self.root)

    def train_size(self) -> int:
        return len(self.listing.train)

    def test_names(self) -> list[str] | None:
        """The test images' paths; those left out as unreadable (`data.skip_bad`) are not in the split."""
        skipped = set(self.content().get("skipped", [])) if self.resolved_loader() == "tensor" else set()
        return [str(path) for path, _ in self.listing.test if str(path) not in skipped]

    def resolved_loader(self) -> str:
        if self.loader != "auto":
            return self.loader
        channels, height, width = self.input_shape
        decoded = (len(self.listing.train) + len(self.listing.test)) * channels * height * width
        return "tensor" if decoded <= self.max_memory_gb * 2**30 else "torchvision"

    @cached_property
    def spec(self) -> ImageSpec:
        return ImageSpec(self.mode, self.size, self.input_shape, self.listing.train[0][0])

    # Reading and the decode cache.
    def cache_file(self, kind: str) -> Path:
        """Where this folder's decoded images (or statistics) are kept: one file per folder and settings."""
        settings = json.dumps([str(self.root.resolve()), self.size, self.mode, self.skip_bad])
        name = f"{self.root.name}-{hashlib.sha256(settings.encode()).hexdigest()[:12]}-{kind}.pt"
        return self.cache_dir / "imagefolder" / name

    def cache_key(self, kind: str) -> str:
        """What the cache was built from: every file's path, size and modification time, and the settings."""
        entries = []
        for split, files in (("train", self.listing.train), ("test", self.listing.test)):
            for path, label in files:
                stat = path.stat()
                entries.append([split, str(path.relative_to(self.root)), label, stat.st_size, stat.st_mtime_ns])
        what = [CACHE_FORMAT, kind, self.size, self.mode, self.skip_bad, self.listing.classes, entries]
        return hashlib.sha256(json.dumps(what).encode()).hexdigest()

    def content(self) -> dict[str, Any]:
        """The cache's content, read (or built) once per process."""
        if self._content is None:
            kind = "tensors" if self.resolved_loader() == "tensor" else "stats"
            build = self._decode_all if kind == "tensors" else self._measure
            start = time.monotonic()
            self._content, self.cache_reused = cached(
                self.cache_file(kind), self.cache_key(kind), build, self._holds_what_it_claims
            )
            if self.cache_reused:
                log.info(
                    f"decoded images of {self.root} read from {self.cache_file(kind)} ({time.monotonic() - start:.2f} s)"
                )
            skipped = self._content.get("skipped", [])
            if skipped:
                log.warning(
                    f"left out {len(skipped)} unreadable images of {self.root} (data.skip_bad=true): {skipped[0]}, ..."
                )
        return self._content

    def prepare_data(self) -> None:
        """Decode into the cache (or measure the statistics) once; a bad file or layout is refused here."""
        self.content()
        self.check_sizes(self.train_size() - len(self.content().get("skipped_train", [])))

    def _decode_files(self, files: list[tuple[Path, int]]) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
        """Decoded images and labels of `files`, in order, with threads; bad files refused or left out."""

        def one(path: Path) -> torch.Tensor | BadImage:
            try:
                return self.spec.decode(path)
            except BadImage as err:
                return err

        images = torch.empty((len(files), *self.input_shape), dtype=torch.uint8)
        keep, skipped = torch.ones(len(files), dtype=torch.bool), []
        # PIL decodes with the interpreter lock released: threads decode in parallel, no processes needed.
        with ThreadPoolExecutor(max_workers=max(1, self.num_workers)) as pool:
            for i, ((path, _), result) in enumerate(zip(files, pool.map(one, [p for p, _ in files]), strict=True)):
                if isinstance(result, BadImage):
                    if not self.skip_bad:
                        raise UserError(
                            f"{path} cannot be read as an image ({result}); replace or delete it, "
                            "or set data.skip_bad=true to leave unreadable images out"
                        )
                    keep[i] = False
                    skipped.append(str(path))
                else:
                    images[i] = result
        labels = torch.tensor([label for _, label in files], dtype=torch.int64)
        if skipped:
            images, labels = images[keep], labels[keep]
        return images, labels, skipped

    def _holds_what_it_claims(self, content: dict[str, Any]) -> bool:
        """A cache read from disk against this folder: its classes, and for decoded images their shape, type,
        counts (the listing's, less the files it says it skipped) and labels in the classes' range."""
        if content.get("classes") != self.listing.classes or len(content.get("mean", [])) != self.input_shape[0]:
            return False
        if "train" not in content:
            return True  # statistics only
        skipped = len(content.get("skipped", []))
        for split in ("train", "test"):
            images, labels = content[split], content[f"{split}_labels"]
            if images.dtype != torch.uint8 or tuple(images.shape[1:]) != tuple(self.input_shape):
                return False
            if len(images) != len(labels) or (
                len(labels) and not 0 <= int(labels.min()) <= int(labels.max()) < len(self.listing.classes)
            ):
                return False
        return len(content["train"]) + len(content["test"]) + skipped == len(self.listing.train) + len(
            self.listing.test
        )

    def _decode_all(self) -> dict[str, Any]:
        log.info(f"decoding {len(self.listing.train) + len(self.listing.test)} images of {self.root}")
        train, train_labels, bad_train = self._decode_files(self.listing.train)
        test, test_labels, bad_test = self._decode_files(self.listing.test)
        if len(train) == 0:
            raise UserError(f"no image of {self.root / 'train'} could be read; check the files")
        mean, std = channel_stats(train)
        return {
            "classes": self.listing.classes,
            "train": train,
            "train_labels": train_labels,
            "test": test,
            "test_labels": test_labels,
            "mean": list(mean),
            "std": list(std),
            "skipped": bad_train + bad_test,
            "skipped_train": bad_train,
        }

    def _measure(self) -> dict[str, Any]:
        """Mean and standard deviation of the per-sample loader, from evenly spaced training images."""
        files = self.listing.train
        step = max(1, len(files) // STATS_SAMPLES)
        images, _, skipped = self._decode_files(files[::step][:STATS_SAMPLES])
        mean, std = channel_stats(images)
        return {"classes": self.listing.classes, "mean": list(mean), "std": list(std), "skipped": skipped}

    def load_tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        c = self.content()
        return c["train"], c["train_labels"], c["test"], c["test_labels"]

    def per_sample_datasets(self) -> tuple[Dataset, Dataset]:
        return tuple(
            FolderImages(self.spec, files, self.mean, self.std) for files in (self.listing.train, self.listing.test)
        )  # type: ignore[return-value]


def _size(size: Any) -> tuple[int, int] | None:
    """`data.size`: an int (square) or [H, W]; None keeps the images' own size."""
    if size is None:
        return None
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return (size, size)
    values = list(size) if isinstance(size, Sequence) and not isinstance(size, str) else []
    if len(values) == 2 and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        return (values[0], values[1])
    raise UserError(f"data.size={size} is not a size; use data.size=32 or data.size=[32,48] (height, width)")
