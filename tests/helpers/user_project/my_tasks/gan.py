"""A GAN trained with manual optimization: two optimizers, each stepped by the module itself. Its
discriminator step leaves the generator's parameters without gradients, which DDP refuses unless told to
look for unused parameters (`strategy.find_unused_parameters=true`)."""

from __future__ import annotations

import math

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn


class GAN(pl.LightningModule):
    """MLP generator and discriminator on images of `input_shape`; logs val/d_loss (lower: the discriminator
    tells real from generated images better)."""

    def __init__(self, input_shape: tuple[int, ...], latent: int = 8, hidden: int = 32, lr: float = 1e-3,
                 seed: int = 0) -> None:  # fmt: skip
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        pixels = math.prod(input_shape)
        self.generator = nn.Sequential(nn.Linear(latent, hidden), nn.ReLU(), nn.Linear(hidden, pixels))
        self.discriminator = nn.Sequential(nn.Flatten(), nn.Linear(pixels, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def noise(self, n: int, key: int) -> torch.Tensor:
        # Drawn from a generator keyed by the step and rank, so that a resumed run draws what it would have.
        gen = torch.Generator().manual_seed(self.hparams.seed * 1_000_003 + key)
        return torch.randn(n, self.hparams.latent, generator=gen).to(self.device, self.dtype)

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> None:
        real = batch[0]
        g_opt, d_opt = self.optimizers()  # type: ignore[misc]
        fake = self.generator(self.noise(len(real), self.global_step * 64 + self.global_rank))
        ones, zeros = torch.ones(len(real), 1, device=self.device), torch.zeros(len(real), 1, device=self.device)
        # The discriminator on real and detached generated images: no gradient reaches the generator.
        d_loss = F.binary_cross_entropy_with_logits(self.discriminator(real), ones)
        d_loss = d_loss + F.binary_cross_entropy_with_logits(self.discriminator(fake.detach()), zeros)
        d_opt.zero_grad()
        self.manual_backward(d_loss)
        d_opt.step()
        # The generator, through the updated discriminator, whose own gradients are left unused.
        g_loss = F.binary_cross_entropy_with_logits(self.discriminator(fake), ones)
        g_opt.zero_grad()
        self.manual_backward(g_loss)
        g_opt.step()
        self.log_dict({"train/d_loss": d_loss, "train/g_loss": g_loss}, prog_bar=True)

    def validation_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> None:
        real = batch[0]
        fake = self.generator(self.noise(len(real), -1 - batch_idx))
        ones, zeros = torch.ones(len(real), 1, device=self.device), torch.zeros(len(real), 1, device=self.device)
        d_loss = F.binary_cross_entropy_with_logits(self.discriminator(real), ones)
        d_loss = d_loss + F.binary_cross_entropy_with_logits(self.discriminator(fake), zeros)
        self.log("val/d_loss", d_loss, sync_dist=True)

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        g_opt = torch.optim.Adam(self.generator.parameters(), lr=self.hparams.lr, betas=(0.5, 0.999))
        d_opt = torch.optim.Adam(self.discriminator.parameters(), lr=self.hparams.lr, betas=(0.5, 0.999))
        return [g_opt, d_opt]
