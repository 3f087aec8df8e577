"""Datasets and the loader of the built-in data modules: whole splits as tensors, sample ids, resumable order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from hydralight.data.sampling import GlobalBatchSampler
from hydralight.errors import UserError


class TensorImages(Dataset):
    """A whole split as one uint8 (N, C, H, W) tensor; a batch is one index operation, not N `__getitem__` calls."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images = images
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[index], self.labels[index]

    def __getitems__(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        indices = torch.as_tensor(indices, device=self.labels.device)
        return self.images[indices], self.labels[indices], indices

    def to(self, device: torch.device) -> TensorImages:
        return TensorImages(self.images.to(device), self.labels.to(device))


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

    def __init__(
        self, *args: Any, progress: Callable[[], int], rebase: Callable[[int, int], None] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.progress = progress  # micro-batches trained so far in the current epoch
        self.rebase = rebase  # sets that count (the loop's) for an epoch, when a continuation accumulates otherwise

    def _global_batches(self) -> GlobalBatchSampler:
        sampler = self.batch_sampler
        assert isinstance(sampler, GlobalBatchSampler), f"a ResumableLoader needs a GlobalBatchSampler, not {sampler}"
        return sampler

    def state_dict(self) -> dict[str, int]:
        return self._global_batches().position(self.progress())

    def load_state_dict(self, state: dict[str, int]) -> None:
        sampler = self._global_batches()
        try:
            sampler.resume_at(state)
        except ValueError as err:
            raise UserError(f"cannot resume here: {err}") from None
        # The loop counts micro-batches of the accumulation that saved the state: under another one its steps
        # would start mid-way (a first step of part of a global batch, every later one across two).
        done = state["samples"] // sampler.global_size * sampler.accumulation
        if self.rebase is not None and done != self.progress():
            self.rebase(done, state["epoch"])


def whole_batch(batch: Any) -> Any:
    """collate_fn for `__getitems__` datasets: the batch is already stacked."""
    return batch
