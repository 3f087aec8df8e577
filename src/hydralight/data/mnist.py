"""MNIST and Fashion-MNIST: the IDX data sets torchvision downloads, each with its own normalization."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from hydralight.data.idx import IDX_FILES, IdxDataModule

MEAN, STD = 0.1307, 0.3081  # of MNIST's training images

__all__ = ["IDX_FILES", "MEAN", "STD", "FashionMNISTDataModule", "MNISTDataModule", "load_split", "raw_dir"]


class MNISTDataModule(IdxDataModule):
    """MNIST train/val/test with a seeded 55,000/5,000 split and hardware-independent batching."""

    name = "MNIST"
    described = "an MNIST"
    channel_mean = (MEAN,)
    channel_std = (STD,)


class FashionMNISTDataModule(IdxDataModule):
    """Fashion-MNIST (Zalando's clothing images in MNIST's format and sizes): the same files, checks and loaders."""

    name = "FashionMNIST"
    described = "a FashionMNIST"
    channel_mean = (0.2860,)
    channel_std = (0.3530,)


def raw_dir(data_dir: str | os.PathLike[str]) -> Path:
    return MNISTDataModule.raw_dir(data_dir)


def load_split(data_dir: str | os.PathLike[str], train: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """MNIST's images (N, 28, 28) uint8 and labels (N,) int64 of one split, after the checks."""
    return MNISTDataModule.read_split(data_dir, train)
