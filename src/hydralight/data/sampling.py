"""Batch samplers that make training independent of the number of processes.

Lightning's DistributedSampler shuffles per world size and pads the last batch with repeats, so a run
on 2 GPUs sees other samples than on 1 and evaluation counts some samples twice. Here one seeded
permutation defines the global batches; each rank takes its contiguous share of every global batch,
and evaluation shares are disjoint and unpadded.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class GlobalBatchSampler(Sampler[torch.Tensor]):
    """Yields this rank's micro-batches (index tensors) of each global batch, epoch by epoch.

    One optimizer step consumes `global_size` samples of the epoch's permutation: rank r takes the
    r-th of `world_size` equal slices and splits it into `accumulation` micro-batches.
    """

    def __init__(
        self,
        num_samples: int,
        global_size: int,
        accumulation: int = 1,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
    ) -> None:
        if global_size % (world_size * accumulation):
            raise ValueError(
                f"global batch {global_size} is not divisible by world size {world_size} x accumulation {accumulation}"
            )
        if num_samples < global_size and drop_last:
            raise ValueError(f"{num_samples} samples cannot fill one global batch of {global_size}")
        self.num_samples = num_samples
        self.global_size = global_size
        self.accumulation = accumulation
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.epoch = 0
        # (epoch, micro-batches already trained in it), set when resuming inside an epoch.
        self._resume: tuple[int, int] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    @property
    def sampler(self) -> GlobalBatchSampler:
        # Lightning calls `set_epoch` on `dataloader.sampler` and `dataloader.batch_sampler.sampler` only:
        # without this, every epoch would replay epoch 0's order.
        return self

    def steps_per_epoch(self) -> int:
        full, rest = divmod(self.num_samples, self.global_size)
        # A partial last batch is kept only if every micro-batch of every rank gets a sample.
        return full + int(not self.drop_last and rest >= self.world_size * self.accumulation)

    def order(self) -> torch.Tensor:
        """The epoch's global sample order, identical on every rank and for every world size."""
        if not self.shuffle:
            return torch.arange(self.num_samples)
        gen = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.num_samples, generator=gen)

    def position(self, micro_batches_done: int) -> dict[str, int]:
        """Where training stands in the global order: independent of the world size that got there."""
        return {
            "epoch": self.epoch,
            "samples": micro_batches_done // self.accumulation * self.global_size,
            "global_size": self.global_size,
        }

    def resume_at(self, position: dict[str, int]) -> None:
        """Continue the epoch after `position` (from `position`, possibly saved with another world size)."""
        if position.get("global_size") != self.global_size:
            raise ValueError(
                f"the checkpoint was trained with a global batch of {position.get('global_size')}, "
                f"this run uses {self.global_size}; continue with batch.global_size={position.get('global_size')}, "
                "or start a new run from its weights with init_from=<that checkpoint> resume=never"
            )
        self._resume = (position["epoch"], position["samples"] // self.global_size * self.accumulation)

    def __iter__(self) -> Iterator[torch.Tensor]:
        skip = 0
        if self._resume is not None and self._resume[0] == self.epoch:
            skip = self._resume[1]
        self._resume = None
        order = self.order()
        produced = 0
        for step in range(self.steps_per_epoch()):
            batch = order[step * self.global_size : (step + 1) * self.global_size]
            share = torch.tensor_split(batch, self.world_size)[self.rank]
            for micro in torch.tensor_split(share, self.accumulation):
                if produced >= skip:
                    yield micro
                produced += 1

    def __len__(self) -> int:
        # The full epoch, also when resuming: Lightning counts the batches already done itself.
        return self.steps_per_epoch() * self.accumulation


class ShardSampler(Sampler[torch.Tensor]):
    """Evaluation batches over this rank's share, every sample counted exactly once. The share is interleaved
    (rank r takes samples r, r + world, ...), so the first k batches of every rank together are the first
    k x world batches of 1 process: an evaluation limit scores the same samples on any number of processes."""

    def __init__(self, num_samples: int, batch_size: int, rank: int = 0, world_size: int = 1) -> None:
        if num_samples < world_size:
            raise ValueError(f"{num_samples} samples cannot be shared by {world_size} processes")
        shard = torch.arange(rank, num_samples, world_size)
        self.batches = list(torch.split(shard, batch_size))

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)
