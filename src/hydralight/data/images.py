"""What the built-in data modules share: a seeded validation split, the project's samplers (the same
batches on any number of processes, exact mid-epoch resume), two loaders, and normalization and
keyed augmentation on the device. A subclass says its sizes and normalization and reads its files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from hydralight.data.files import decode_all, images_to_predict
from hydralight.data.loaders import ResumableLoader, TensorImages, WithIds, whole_batch
from hydralight.data.sampling import GlobalBatchSampler, ShardSampler
from hydralight.errors import UserError
from hydralight.keyed import keyed_shift, sample_keys
from hydralight.lightning_internals import micro_batches_done, set_micro_batches_done


class ImageDataModule(pl.LightningDataModule):
    """Image classification with train/val/test splits and hardware-independent batching.

    `loader="tensor"` keeps each split as one uint8 tensor (on the GPU when training there) and
    normalizes on the device; `loader="torchvision"` is the classic per-sample Dataset + DataLoader with
    workers. Batches are (x, y, ids) for a module that says `takes_sample_ids = True` (the built-in classifier),
    (x, y) for any other; `max_shift` > 0 translates training images by up to that many
    pixels, drawn per sample and epoch (the same on any number of processes).

    Subclasses provide `num_classes`, `input_shape`, `mean`, `std`, `train_size()` and either
    `load_tensors()` or `per_sample_datasets()` (or both).
    """

    # Batches carry sample ids, so per-sample randomness is keyed by sample (see hydralight.keyed).
    sample_ids = True
    # The loaders take each rank's share themselves: Lightning's DistributedSampler stays off.
    shards_by_rank = True
    loaders: tuple[str, ...] = ("tensor", "torchvision")

    def __init__(
        self,
        loader: str = "tensor",
        val_size: int | float = 5000,
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
        if loader not in self.loaders:
            choices = " or ".join(f"data.loader={name}" for name in self.loaders)
            raise UserError(f"data.loader={loader} is not a loader; use {choices}")
        self.loader = loader
        self.val_size = val_size
        self.global_size = global_size
        self.accumulation = accumulation
        self.eval_size = eval_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers
        self.drop_last = drop_last
        self.seed = seed
        self.max_shift = max_shift
        self.splits: dict[str, TensorImages | WithIds] = {}
        # `predict.source`'s images and labels (`predict_from`); None: predict on the test split.
        self.predict_files: list[tuple[Path, int]] | None = None
        self._normalizers: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    # The contract (see hydralight.data): sizes and normalization, readable before setup.
    @property
    def num_classes(self) -> int:
        raise NotImplementedError

    @property
    def input_shape(self) -> tuple[int, int, int]:
        raise NotImplementedError

    @property
    def mean(self) -> tuple[float, ...]:
        raise NotImplementedError

    @property
    def std(self) -> tuple[float, ...]:
        raise NotImplementedError

    # What a subclass reads.
    def train_size(self) -> int:
        """Samples in the training files (validation included), known cheaply."""
        raise NotImplementedError

    def load_tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Train images (N, C, H, W) uint8, train labels (N,) int64, then the same of the test split."""
        raise NotImplementedError

    def per_sample_datasets(self) -> tuple[Dataset, Dataset]:
        """Train and test as Datasets of (normalized float (C, H, W) image, label)."""
        raise NotImplementedError

    def class_names(self) -> list[str]:
        """The classes by name (a subclass that knows names says `classes`), else by number: 0, 1, ..."""
        return list(getattr(self, "classes", None) or (str(i) for i in range(self.num_classes)))

    def test_names(self) -> list[str] | None:
        """The test samples by name (their files), in the order of the test split; None: by position."""
        return None

    def predict_from(self, source: str) -> None:
        """Predict on the images under `source` instead of the test split: `source/<class>/*` (labelled when
        every folder is a class of this data) or any images under it (unlabelled), each converted and resized
        to the network's input shape."""
        self.predict_files = images_to_predict(source, self.class_names())

    def predict_names(self) -> list[str] | None:
        """The samples `predict_dataloader` yields, by name, in the order of their ids; None: by position."""
        if self.predict_files is not None:
            return [str(path) for path, _ in self.predict_files]
        return self.test_names()

    def resolved_loader(self) -> str:
        """The loader this run uses (a subclass may choose one by the data's size)."""
        return self.loader

    def val_count(self, n_train: int) -> int:
        """The validation split's size: `val_size` samples, or that fraction of them when below 1."""
        size = self.val_size
        if isinstance(size, float) and 0 < size < 1:
            return max(1, round(n_train * size))
        return int(size)

    def check_sizes(self, n_train: int) -> int:
        """The settings must fit the data: the validation split leaves at least one global batch to train on
        (returns the split's size), and a shift leaves part of each image in its frame."""
        height, width = self.input_shape[1:]
        if self.max_shift >= min(height, width):
            raise UserError(
                f"data.max_shift={self.max_shift} can move an image wholly out of its {height}x{width} frame "
                f"(a blank training image); shift by fewer than {min(height, width)} pixels (a few: data.max_shift=2)"
            )
        n_val = self.val_count(n_train)
        if not 0 < n_val < n_train:
            raise UserError(f"data.val_size={self.val_size} must be between 1 and {n_train - 1}")
        left = n_train - n_val
        if self.drop_last and left < self.global_size:
            raise UserError(
                f"data.val_size={self.val_size} leaves {left} training samples, fewer than one global batch "
                f"(batch.global_size={self.global_size}); lower data.val_size or batch.global_size"
            )
        return n_val

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        self.prepare_data()  # a no-op when the files are there; waits for a download in progress
        if self.resolved_loader() == "tensor":
            images, labels, test_images, test_labels = self.load_tensors()
            parts = self._parts(len(labels))
            device = self._device()
            self.splits = {name: TensorImages(images[idx], labels[idx]).to(device) for name, idx in parts.items()}
            self.splits["test"] = TensorImages(test_images, test_labels).to(device)
        else:
            train, test = self.per_sample_datasets()
            parts = self._parts(len(train))  # type: ignore[arg-type]
            self.splits = {name: WithIds(Subset(train, idx.tolist())) for name, idx in parts.items()}
            self.splits["test"] = WithIds(test)
        self.splits["predict"] = self.splits["test"] if self.predict_files is None else self._images_to_predict()

    def _images_to_predict(self) -> TensorImages:
        # Decoded whole, as uint8: batches are normalized on the device as the test split's are.
        files = [path for path, _ in self.predict_files or []]
        images = decode_all(files, self.input_shape, self.num_workers)
        labels = torch.tensor([label for _, label in self.predict_files or []], dtype=torch.int64)
        return TensorImages(images, labels).to(self._device())

    def _parts(self, n_train: int) -> dict[str, torch.Tensor]:
        n_val = self.check_sizes(n_train)
        order = torch.randperm(n_train, generator=torch.Generator().manual_seed(self.seed))
        return {"train": order[n_val:], "val": order[:n_val]}

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
        if isinstance(dataset, TensorImages):
            return loader_class(dataset, batch_sampler=batch_sampler, collate_fn=whole_batch, **extra)
        return loader_class(
            dataset,
            batch_sampler=batch_sampler,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.persistent_workers and self.num_workers > 0,
            **extra,
        )

    def _trained_micro_batches(self) -> int:
        trainer = self.trainer
        assert trainer is not None  # asked by the training loader, while the trainer runs
        return micro_batches_done(trainer)

    def train_dataloader(self) -> DataLoader:
        rank, world = self._rank_world()
        # trainer.overfit_batches: the same batches every epoch, in the data's order, as Lightning makes of a
        # shuffling loader (its check sees a loader with a batch sampler as sequential and leaves it alone).
        overfit = getattr(self, "trainer", None) is not None and self.trainer.overfit_batches > 0  # type: ignore[union-attr]
        sampler = GlobalBatchSampler(
            len(self.splits["train"]),
            self.global_size,
            accumulation=self.accumulation,
            rank=rank,
            world_size=world,
            seed=self.seed,
            shuffle=not overfit,
            drop_last=self.drop_last,
        )
        return self._loader(
            self.splits["train"], sampler, ResumableLoader, progress=self._trained_micro_batches,
            rebase=self._rebase_micro_batches,
        )  # fmt: skip

    def _rebase_micro_batches(self, done: int, epoch: int) -> None:
        assert self.trainer is not None  # a loader's state is loaded while the trainer runs
        if self.trainer.current_epoch == epoch:  # saved inside the epoch it continues (not at its end)
            set_micro_batches_done(self.trainer, done)

    def _eval_loader(self, split: str) -> DataLoader:
        rank, world = self._rank_world()
        return self._loader(self.splits[split], ShardSampler(len(self.splits[split]), self.eval_size, rank, world))

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self._eval_loader("predict")

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """uint8 images to float, per channel `(x / 255 - mean) / std`."""
        x = x.float().div_(255.0)
        if len(self.mean) == 1:  # Python scalars: bit for bit the numbers grey-level data always had here
            return x.sub_(self.mean[0]).div_(self.std[0])
        if x.device not in self._normalizers:  # made once per device: no host-to-device copy per batch
            shape = (-1, 1, 1)
            self._normalizers[x.device] = (
                torch.tensor(self.mean, device=x.device).view(shape),
                torch.tensor(self.std, device=x.device).view(shape),
            )
        mean, std = self._normalizers[x.device]
        return x.sub_(mean).div_(std)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        x, y, ids = batch
        trainer = getattr(self, "trainer", None)
        if x.dtype == torch.uint8:  # tensor loader: normalize on the device, after the cheap uint8 copy
            x = self.normalize(x)
        if self.max_shift and trainer is not None and trainer.training:
            keys = sample_keys(self.seed, trainer.current_epoch, ids)
            # Uncovered pixels take each channel's black, normalized; the same offsets for every channel.
            fills = [-m / s for m, s in zip(self.mean, self.std, strict=True)]
            shifted = [keyed_shift(x[:, c : c + 1], keys, self.max_shift, fill=f) for c, f in enumerate(fills)]
            x = shifted[0] if len(shifted) == 1 else torch.cat(shifted, dim=1)
        if trainer is not None:  # the dtype the precision gives float batches (64-true, bf16-true): Lightning converts
            x = trainer.precision_plugin.convert_input(x)  # before the transfer, when these images were uint8
        module = getattr(trainer, "lightning_module", None) if trainer is not None else None
        if module is not None and not getattr(module, "takes_sample_ids", False):
            return x, y  # a module written for (x, y) batches (lightning-hydra-template's unpacks two)
        return x, y, ids
