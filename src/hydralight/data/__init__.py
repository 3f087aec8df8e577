"""Data sources of a run, and the contract between the core and a task's data module.

A data module (a `LightningDataModule` named by `data._target_`) provides, on any rank and before
`setup()` (from constants, file headers or folder listings: cheap, never a full decode):

- the sizes the module is built with, when it knows them: `num_classes: int` and `input_shape:
  tuple[int, int, int]` (C, H, W as the network receives it), and any other name it lists in `sizes`
  (a language model's `vocab_size`); a module (or the built-in classifier's network) gets each one its
  constructor names;
- train, val and test loaders; batches of any structure the module takes (the built-in classifier:
  `(x, y)` or `(x, y, ids)`); when the class says `sample_ids = True`, the last element of a tuple batch
  (or the `ids` entry of a dict batch) holds the sample ids that key per-sample randomness (dropout,
  augmentation); the built-in modules give them only to a LightningModule that says
  `takes_sample_ids = True` (the built-in classifier), and `(x, y)` to any other;
- `shards_by_rank: bool`: True when its loaders give each rank its own share of every batch
  themselves (the project's GlobalBatchSampler/ShardSampler: the same batches on any number of
  processes, exact mid-epoch resume); Lightning's DistributedSampler then stays off. False (or
  missing, as in an ordinary user data module): Lightning shards its loaders under DDP.

The core gives it, by constructor argument and only those its `__init__` names, what the resource
plan decided: `global_size`, `accumulation`, `eval_size` (the project's samplers) or `batch_size` (the
per-device micro-batch, for an ordinary data module), `num_workers`, `pin_memory`,
`persistent_workers`, `drop_last`, and the run's `seed` (see `hydralight.data.contract`).

The built-in modules (`ImageDataModule` and its subclasses) also state their normalization
(`mean`, `std` per channel, applied on the device to uint8 batches) and carve the validation split
from the training one with a seeded permutation (`val_size`).
"""

from importlib import import_module
from typing import Any

# Each name and the module holding it, imported on first use: `hydralight.data.options` (the typed configs,
# read before torch loads) stays free of torch.
_WHERE = {
    "build_datamodule": "contract",
    "datamodule_kwargs": "contract",
    "shards_by_rank": "contract",
    "stated_sizes": "contract",
    "ImageFolderDataModule": "imagefolder",
    "ImageDataModule": "images",
    "TensorImages": "images",
    "MEAN": "mnist",
    "STD": "mnist",
    "FashionMNISTDataModule": "mnist",
    "MNISTDataModule": "mnist",
    "load_split": "mnist",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
