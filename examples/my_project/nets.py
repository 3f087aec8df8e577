"""A network for the built-in classifier (`model=tiny`): an nn.Module whose constructor names the sizes the
data states, so one class fits MNIST, Fashion-MNIST and any folder of images."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


class TinyNet(nn.Module):
    """conv -> pool -> conv -> pool -> linear; `width` channels in the first conv, twice that in the second."""

    def __init__(self, num_classes: int, input_shape: Sequence[int], width: int = 16) -> None:
        super().__init__()
        channels, height, weight = input_shape
        self.layers = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(2 * width * (height // 4) * (weight // 4), num_classes),
        )

    def forward(self, x):
        return self.layers(x)
