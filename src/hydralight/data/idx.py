"""Data sets stored as IDX files in torchvision's layout (`<data_dir>/<Name>/raw/*-ubyte`): MNIST and its
kin. Files are checked (magic number, header, length, labels) before torchvision reads them, fetched
through torchvision under a lock when missing, and kept in memory as one uint8 tensor per split."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock
from torch.utils.data import Dataset

from hydralight.data.images import ImageDataModule
from hydralight.errors import UserError

# File name -> (IDX magic number, number of dimensions); the magic encodes uint8 data and the rank.
IDX_FILES = {
    "train-images-idx3-ubyte": (2051, 3),
    "train-labels-idx1-ubyte": (2049, 1),
    "t10k-images-idx3-ubyte": (2051, 3),
    "t10k-labels-idx1-ubyte": (2049, 1),
}


class IdxDataModule(ImageDataModule):
    """A 10-class, 28x28 grey-level IDX data set read through torchvision's class `name`.

    A subclass sets `name` (torchvision's dataset class, also its folder), `described` (the name with
    its article, for messages), `channel_mean` and `channel_std` (of its training images).
    """

    name = ""
    described = ""
    channel_mean: tuple[float, ...] = ()
    channel_std: tuple[float, ...] = ()
    image_size = (28, 28)  # what its image files must hold (an IDX header can say any size)

    def __init__(self, data_dir: str, download: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.data_dir = str(data_dir)
        self.download = download

    @property
    def num_classes(self) -> int:
        return 10

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (1, 28, 28)

    @property
    def mean(self) -> tuple[float, ...]:
        return self.channel_mean

    @property
    def std(self) -> tuple[float, ...]:
        return self.channel_std

    @classmethod
    def raw_dir(cls, data_dir: str | os.PathLike[str]) -> Path:
        return Path(data_dir) / cls.name / "raw"

    @classmethod
    def check_idx_file(cls, path: Path) -> tuple[int, ...]:
        """Validate an IDX file's magic number and length before torchvision reads it; return its shape."""
        magic, ndim = IDX_FILES[path.name]
        size = path.stat().st_size
        with path.open("rb") as f:
            header = f.read(4 + 4 * ndim)
        if len(header) < 4 or int.from_bytes(header[:4], "big") != magic:
            found = int.from_bytes(header[:4], "big") if len(header) >= 4 else "nothing"
            raise UserError(
                f"{path} is not {cls.described} IDX file (magic number {found}, expected {magic}); "
                "delete it so it is downloaded again, or point DATA_DIR at a good copy"
            )
        if len(header) < 4 + 4 * ndim:
            raise UserError(f"{path} is truncated inside its header; delete it so it is downloaded again")
        shape = tuple(int.from_bytes(header[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
        expected = len(header) + int(torch.tensor(shape).prod())
        if size != expected:
            raise UserError(
                f"{path} has {size} bytes but its header {list(shape)} needs {expected}: the file is truncated "
                "or corrupt; delete it so it is downloaded again, or point DATA_DIR at a good copy"
            )
        if ndim == 3 and tuple(shape[1:]) != cls.image_size:  # a valid length with other sizes: another data set
            raise UserError(
                f"{path} holds images of {shape[1]}x{shape[2]} where {cls.name}'s are "
                f"{cls.image_size[0]}x{cls.image_size[1]}; it is not {cls.described} file: replace it with one, "
                "or point DATA_DIR at a good copy"
            )
        return shape

    @classmethod
    def read_split(cls, data_dir: str | os.PathLike[str], train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Images (N, 28, 28) uint8 and labels (N,) int64 of one split, read by torchvision after checks."""
        prefix = "train" if train else "t10k"
        images = cls.raw_dir(data_dir) / f"{prefix}-images-idx3-ubyte"
        labels = cls.raw_dir(data_dir) / f"{prefix}-labels-idx1-ubyte"
        n_images = cls.check_idx_file(images)[0]
        n_labels = cls.check_idx_file(labels)[0]
        if n_images != n_labels:
            raise UserError(f"{images} holds {n_images} images but {labels} holds {n_labels} labels; replace the pair")
        ds = cls._torchvision(data_dir, train)
        bad = (ds.targets < 0) | (ds.targets >= 10)
        if bool(bad.any()):
            raise UserError(f"{labels} has label {int(ds.targets[bad][0])} outside 0-9; the file is corrupt")
        return ds.data, ds.targets.long()

    @classmethod
    def _torchvision(cls, data_dir: str | os.PathLike[str], train: bool, **kwargs: Any) -> Any:
        import torchvision.datasets

        return getattr(torchvision.datasets, cls.name)(str(data_dir), train=train, **kwargs)

    def files_present(self) -> bool:
        return all((self.raw_dir(self.data_dir) / name).is_file() for name in IDX_FILES)

    def _lock_path(self) -> Path:
        return Path(self.data_dir) / f"{self.name}.lock"

    def _lock(self) -> Any:
        """The data folder's lock, taken by whoever checks or fetches the files.

        A folder whose files are complete and where no lock was ever taken is a provisioned copy
        (possibly read-only): nothing can be half-written there, and nothing is written into it.
        """
        lock = self._lock_path()
        if not lock.exists() and self.files_present():
            return contextlib.nullcontext()
        lock.parent.mkdir(parents=True, exist_ok=True)
        return FileLock(str(lock))

    def prepare_data(self) -> None:
        """Download through torchvision when files are missing (Lightning calls this on one rank per node).

        Several jobs of a sweep may share the folder: one downloads under the lock, the others wait
        and then find the files complete. Nothing is written before a download starts, and a download that
        fails takes away the folders and lock it made: a refused run leaves the data folder as it was.
        """
        # A lock file means a download was started there (maybe running now): wait for it, then look.
        if self.files_present() or self._lock_path().exists():
            with self._lock():
                if self.files_present():
                    for name in IDX_FILES:  # headers and lengths: cheap, and a bad file is named now
                        self.check_idx_file(self.raw_dir(self.data_dir) / name)
                    self.check_sizes(self.train_size())
                    return
        where = self.raw_dir(self.data_dir)
        missing = [name for name in IDX_FILES if not (where / name).is_file()]
        # Some there: the ones that are not are what to look for.
        shown = f"{where} (missing {', '.join(missing)})" if len(missing) < len(IDX_FILES) else str(where)
        fix = (
            f"set DATA_DIR (or data.data_dir) to a folder holding {self.name}/raw/, "
            f"or connect to the internet to download into {self.data_dir}"
        )
        if not self.download:
            raise UserError(f"{self.name} not found in {shown} and data.download=false; {fix}")
        made = self._download_would_make()
        try:
            # torchvision prints each failed mirror; the one line that matters is ours below.
            with self._lock(), contextlib.redirect_stdout(io.StringIO()):
                if not self.files_present():
                    self._torchvision(self.data_dir, True, download=True)
                    self._torchvision(self.data_dir, False, download=True)
        except (OSError, RuntimeError) as err:  # RuntimeError: torchvision's "Error downloading ..." after every mirror
            for path in made:
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
            reason = " ".join(str(err).split())[:400]  # torchvision's: the file, then each mirror and its error
            raise UserError(f"{self.name} not found in {shown} and the download failed ({reason}); {fix}") from None

    def _download_would_make(self) -> list[Path]:
        """What a download creates that is not there yet: the outermost missing folder of the data folder,
        the data set's own folder, and the lock."""
        folder = Path(self.data_dir).absolute()
        missing = [p for p in (folder, *folder.parents) if not p.exists()]
        candidates = [missing[-1]] if missing else [folder / self.name, self._lock_path().absolute()]
        return [p for p in candidates if not p.exists()]

    def train_size(self) -> int:
        return self.check_idx_file(self.raw_dir(self.data_dir) / "train-labels-idx1-ubyte")[0]

    def load_tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        images, labels = self.read_split(self.data_dir, train=True)
        test_images, test_labels = self.read_split(self.data_dir, train=False)
        return images.unsqueeze(1), labels, test_images.unsqueeze(1), test_labels  # channel first, still uint8

    def per_sample_datasets(self) -> tuple[Dataset, Dataset]:
        from torchvision import transforms

        self.read_split(self.data_dir, train=True)  # the same checks as the tensor loader's
        self.read_split(self.data_dir, train=False)
        tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize(self.mean, self.std)])
        return (
            self._torchvision(self.data_dir, True, download=False, transform=tf),
            self._torchvision(self.data_dir, False, download=False, transform=tf),
        )
