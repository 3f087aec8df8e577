"""The plain PyTorch floor that `experiment=fast` is timed against: the same recipe, torch alone.

Usage: python scripts/plain_recipe.py DATA_DIR SEED   (DATA_DIR holds MNIST/raw/*-ubyte)

What `experiment=fast` trains, without Lightning, Hydra or any project import (its start-up is torch's):
conv 24 5x5 -> BatchNorm -> max-pool -> conv 32 3x3 -> BatchNorm -> max-pool -> fc 256 -> 10 (no conv
biases), Adam with a one-cycle schedule peaking at 0.01 after a quarter of the steps, batch 128, label
smoothing 0.1, every training image shifted by up to one pixel, one epoch over the 55,000 images left
after the same seeded hold-out of 5,000 that the project validates on. No validation pass: the floor
does only what the test accuracy needs. Prints `test/acc=0.xxxx` as `train.py` does.
"""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

MEAN, STD = 0.1307, 0.3081
BATCH, PEAK_LR, SHIFT = 128, 0.01, 1


def split(raw: Path, prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
    images = bytearray((raw / f"{prefix}-images-idx3-ubyte").read_bytes()[16:])
    labels = bytearray((raw / f"{prefix}-labels-idx1-ubyte").read_bytes()[8:])
    return torch.frombuffer(images, dtype=torch.uint8).view(-1, 1, 28, 28), torch.frombuffer(
        labels, dtype=torch.uint8
    ).long()


def normalized(images: torch.Tensor) -> torch.Tensor:
    return images.float().div(255).sub(MEAN).div(STD)


def shifted(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Each image moved by its own (dy, dx) in [-SHIFT, SHIFT]; uncovered pixels are background (0)."""
    n, _, h, w = images.shape
    padded = F.pad(images, (SHIFT,) * 4)
    dy, dx = torch.randint(0, 2 * SHIFT + 1, (2, n), generator=generator)
    rows = (dy[:, None] + torch.arange(h))[:, None, :, None].expand(n, 1, h, w + 2 * SHIFT)
    cols = (dx[:, None] + torch.arange(w))[:, None, None, :].expand(n, 1, h, w)
    return padded.gather(2, rows).gather(3, cols)


def main(data_dir: str, seed: int) -> float:
    raw = Path(data_dir) / "MNIST" / "raw"
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    images, labels = split(raw, "train")
    keep = torch.randperm(len(labels), generator=torch.Generator().manual_seed(42))[min(5000, len(labels) // 6) :]
    images, labels = images[keep], labels[keep]
    model = nn.Sequential(
        nn.Conv2d(1, 24, 5, padding=2, bias=False), nn.BatchNorm2d(24), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(24, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 256), nn.ReLU(), nn.Linear(256, 10),
    )  # fmt: skip
    optimizer = torch.optim.Adam(model.parameters(), lr=PEAK_LR)
    steps = len(labels) // BATCH  # full batches only, as the project trains
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=PEAK_LR, total_steps=steps, pct_start=0.25)
    order = torch.randperm(len(labels), generator=generator)
    for i in range(steps):
        batch = order[i * BATCH : (i + 1) * BATCH]
        loss = F.cross_entropy(model(normalized(shifted(images[batch], generator))), labels[batch], label_smoothing=0.1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
    model.eval()
    test_images, test_labels = split(raw, "t10k")
    with torch.no_grad():
        right = sum(
            (model(normalized(test_images[i : i + 1000])).argmax(1) == test_labels[i : i + 1000]).sum().item()
            for i in range(0, len(test_labels), 1000)
        )
    return right / len(test_labels)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python scripts/plain_recipe.py DATA_DIR SEED")
    print(f"test/acc={main(sys.argv[1], int(sys.argv[2])):.4f}", flush=True)
