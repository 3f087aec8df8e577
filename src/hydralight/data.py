"""MNIST as a LightningDataModule: torchvision's reader and downloader, checked files, two loaders."""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from filelock import FileLock
from torch.utils.data import DataLoader, Dataset, Subset

from hydralight.errors import UserError
from hydralight.invariance import keyed_shift, sample_keys
from hydralight.sampling import GlobalBatchSampler, ShardSampler

MEAN, STD = 0.1307, 0.3081
NUM_CLASSES = 10
# File name -> (IDX magic number, number of dimensions); the magic encodes uint8 data and the rank.
IDX_FILES = {
    "train-images-idx3-ubyte": (2051, 3),
    "train-labels-idx1-ubyte": (2049, 1),
    "t10k-images-idx3-ubyte": (2051, 3),
    "t10k-labels-idx1-ubyte": (2049, 1),
}


def raw_dir(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / "MNIST" / "raw"


def check_idx_file(path: Path) -> tuple[int, ...]:
    """Validate an IDX file's magic number and length before torchvision reads it; return its shape."""
    magic, ndim = IDX_FILES[path.name]
    size = path.stat().st_size
    with path.open("rb") as f:
        header = f.read(4 + 4 * ndim)
    if len(header) < 4 or int.from_bytes(header[:4], "big") != magic:
        found = int.from_bytes(header[:4], "big") if len(header) >= 4 else "nothing"
        raise UserError(
            f"{path} is not an MNIST IDX file (magic number {found}, expected {magic}); "
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
    return shape


def load_split(data_dir: str | os.PathLike[str], train: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Images (N, 28, 28) uint8 and labels (N,) int64 of one split, read by torchvision after checks."""
    from torchvision.datasets import MNIST

    prefix = "train" if train else "t10k"
    images = raw_dir(data_dir) / f"{prefix}-images-idx3-ubyte"
    labels = raw_dir(data_dir) / f"{prefix}-labels-idx1-ubyte"
    n_images = check_idx_file(images)[0]
    n_labels = check_idx_file(labels)[0]
    if n_images != n_labels:
        raise UserError(f"{images} holds {n_images} images but {labels} holds {n_labels} labels; replace the pair")
    ds = MNIST(str(data_dir), train=train, download=False)
    bad = (ds.targets < 0) | (ds.targets >= NUM_CLASSES)
    if bool(bad.any()):
        raise UserError(f"{labels} has label {int(ds.targets[bad][0])} outside 0-9; the file is corrupt")
    return ds.data, ds.targets.long()


class TensorImages(Dataset):
    """A whole split as one uint8 tensor; a batch is one index operation, not N `__getitem__` calls."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images = images.unsqueeze(1)  # (N, 1, 28, 28): channel first, still uint8
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[index], self.labels[index]

    def __getitems__(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        indices = torch.as_tensor(indices, device=self.labels.device)
        return self.images[indices], self.labels[indices], indices

    def to(self, device: torch.device) -> TensorImages:
        return TensorImages(self.images.squeeze(1).to(device), self.labels.to(device))


class WithIds(Dataset):
    """(x, y, id) per sample: the id (the position in the split) keys the sample's own randomness."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[Any, Any, int]:
        x, y = self.dataset[index]
        return x, y, index


class ResumableLoader(DataLoader):
    """A training DataLoader that Lightning checkpoints mid-epoch: its state is the position in the
    global sample order, so a resumed run (with any number of processes) neither repeats nor skips."""

    def __init__(self, *args: Any, progress: Callable[[], int], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.progress = progress  # micro-batches trained so far in the current epoch

    def state_dict(self) -> dict[str, int]:
        return self.batch_sampler.position(self.progress())

    def load_state_dict(self, state: dict[str, int]) -> None:
        try:
            self.batch_sampler.resume_at(state)
        except ValueError as err:
            raise UserError(f"cannot resume here: {err}") from None


def _whole_batch(batch: Any) -> Any:
    """collate_fn for `__getitems__` datasets: the batch is already stacked."""
    return batch


class MNISTDataModule(pl.LightningDataModule):
    """MNIST train/val/test with a seeded 55,000/5,000 split and hardware-independent batching.

    `loader="tensor"` keeps each split in memory (on the GPU when training there) and normalizes on
    the device; `loader="torchvision"` is the classic per-sample Dataset + DataLoader with workers.
    Batches are (x, y, ids); `max_shift` > 0 translates training images by up to that many pixels, drawn
    per sample and epoch (the same on any number of processes).
    """

    # Batches carry sample ids, so per-sample randomness is keyed by sample (see hydralight.invariance).
    sample_ids = True

    def __init__(
        self,
        data_dir: str,
        loader: str = "tensor",
        val_size: int = 5000,
        download: bool = True,
        global_size: int = 128,
        accumulation: int = 1,
        eval_size: int = 1000,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        drop_last: bool = True,
        seed: int = 0,
        max_shift: int = 0,
    ) -> None:
        super().__init__()
        if loader not in ("tensor", "torchvision"):
            raise UserError(f"data.loader={loader} is not a loader; use data.loader=tensor or data.loader=torchvision")
        self.data_dir = str(data_dir)
        self.loader = loader
        self.val_size = val_size
        self.download = download
        self.global_size = global_size
        self.accumulation = accumulation
        self.eval_size = eval_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers
        self.drop_last = drop_last
        self.seed = seed
        self.max_shift = max_shift
        self.splits: dict[str, Dataset] = {}

    def files_present(self) -> bool:
        return all((raw_dir(self.data_dir) / name).is_file() for name in IDX_FILES)

    def _lock(self) -> Any:
        """The data folder's lock, taken by whoever checks or fetches the files.

        A folder whose files are complete and where no lock was ever taken is a provisioned copy
        (possibly read-only): nothing can be half-written there, and nothing is written into it.
        """
        folder = Path(self.data_dir)
        lock = folder / "MNIST.lock"
        if not lock.exists() and self.files_present():
            return contextlib.nullcontext()
        folder.mkdir(parents=True, exist_ok=True)
        return FileLock(str(lock))

    def prepare_data(self) -> None:
        """Download through torchvision when files are missing (Lightning calls this on one rank per node).

        Several jobs of a sweep may share the folder: one downloads under the lock, the others wait
        and then find the files complete.
        """
        with self._lock():
            if self.files_present():
                for name in IDX_FILES:  # headers and lengths: cheap, and a bad file is named now
                    check_idx_file(raw_dir(self.data_dir) / name)
                self._check_split(check_idx_file(raw_dir(self.data_dir) / "train-labels-idx1-ubyte")[0])
                return
        where = raw_dir(self.data_dir)
        fix = f"set DATA_DIR (or data.data_dir) to a folder holding MNIST/raw/, or connect to the internet to download into {self.data_dir}"
        if not self.download:
            raise UserError(f"MNIST not found in {where} and data.download=false; {fix}")
        from torchvision.datasets import MNIST

        try:
            Path(self.data_dir).mkdir(parents=True, exist_ok=True)
            # torchvision prints each failed mirror; the one line that matters is ours below.
            with self._lock(), contextlib.redirect_stdout(io.StringIO()):
                if not self.files_present():
                    MNIST(self.data_dir, train=True, download=True)
                    MNIST(self.data_dir, train=False, download=True)
        except OSError as err:
            raise UserError(f"MNIST not found in {where} and the download failed ({err}); {fix}") from None
        except RuntimeError as err:  # torchvision: "Error downloading ..." after every mirror failed
            raise UserError(
                f"MNIST not found in {where} and the download failed ({str(err).splitlines()[0]}); {fix}"
            ) from None

    def _check_split(self, n_train: int) -> None:
        """The validation split must leave at least one global batch to train on."""
        if not 0 < self.val_size < n_train:
            raise UserError(f"data.val_size={self.val_size} must be between 1 and {n_train - 1}")
        left = n_train - self.val_size
        if self.drop_last and left < self.global_size:
            raise UserError(
                f"data.val_size={self.val_size} leaves {left} training samples, fewer than one global batch "
                f"(batch.global_size={self.global_size}); lower data.val_size or batch.global_size"
            )

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        self.prepare_data()  # a no-op when the files are there; waits for a download in progress
        images, labels = load_split(self.data_dir, train=True)
        self._check_split(len(labels))
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(self.seed))
        parts = {"train": order[self.val_size :], "val": order[: self.val_size]}
        test_images, test_labels = load_split(self.data_dir, train=False)
        if self.loader == "tensor":
            device = self._device()
            self.splits = {name: TensorImages(images[idx], labels[idx]).to(device) for name, idx in parts.items()}
            self.splits["test"] = TensorImages(test_images, test_labels).to(device)
        else:
            from torchvision import transforms
            from torchvision.datasets import MNIST

            tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize((MEAN,), (STD,))])
            train = MNIST(self.data_dir, train=True, download=False, transform=tf)
            self.splits = {name: WithIds(Subset(train, idx)) for name, idx in parts.items()}
            self.splits["test"] = WithIds(MNIST(self.data_dir, train=False, download=False, transform=tf))

    def _device(self) -> torch.device:
        # The tensor loader keeps data where the model runs, so batches never cross the PCIe bus.
        trainer = getattr(self, "trainer", None)
        return trainer.strategy.root_device if trainer is not None else torch.device("cpu")

    def _rank_world(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def _loader(
        self, dataset: Dataset, batch_sampler: Any, loader_class: type = DataLoader, **extra: Any
    ) -> DataLoader:
        # An own generator: starting an iterator then draws nothing from the global RNG, which stays
        # the model's alone (dropout), so a resumed run draws exactly what an uninterrupted one does.
        extra["generator"] = torch.Generator().manual_seed(self.seed)
        if self.loader == "tensor":
            return loader_class(dataset, batch_sampler=batch_sampler, collate_fn=_whole_batch, **extra)
        return loader_class(
            dataset,
            batch_sampler=batch_sampler,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.persistent_workers and self.num_workers > 0,
            **extra,
        )

    def _trained_micro_batches(self) -> int:
        return self.trainer.fit_loop.epoch_loop.batch_progress.current.processed

    def train_dataloader(self) -> DataLoader:
        rank, world = self._rank_world()
        sampler = GlobalBatchSampler(
            len(self.splits["train"]),
            self.global_size,
            accumulation=self.accumulation,
            rank=rank,
            world_size=world,
            seed=self.seed,
            drop_last=self.drop_last,
        )
        return self._loader(self.splits["train"], sampler, ResumableLoader, progress=self._trained_micro_batches)

    def _eval_loader(self, split: str) -> DataLoader:
        rank, world = self._rank_world()
        return self._loader(self.splits[split], ShardSampler(len(self.splits[split]), self.eval_size, rank, world))

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        x, y, ids = batch
        if x.dtype == torch.uint8:  # tensor loader: normalize on the device, after the cheap uint8 copy
            x = x.float().div_(255.0).sub_(MEAN).div_(STD)
        trainer = getattr(self, "trainer", None)
        if self.max_shift and trainer is not None and trainer.training:
            keys = sample_keys(self.seed, trainer.current_epoch, ids)
            x = keyed_shift(x, keys, self.max_shift, fill=-MEAN / STD)  # the background pixel, normalized
        return x, y, ids
