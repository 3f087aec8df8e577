"""A task that is not image classification, written as a user would write one: a character-level language
model over any text file, its own LightningModule and LightningDataModule, trained by the same entrypoint
(`python train.py experiment=charlm data.path=book.txt`).

It uses only the public contract: the data module states `vocab_size` and `block_size` (listed in `sizes`)
and takes the planned `batch_size`; the module takes what it names (`vocab_size`, `block_size`, `lr`),
logs its own losses and configures its own optimizer and schedule. The run's objective is `val/loss`.
"""

from __future__ import annotations

import math
from functools import cached_property
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from hydralight.errors import UserError, run_config_check


class TextBlocks(Dataset):
    """Consecutive blocks of a token tensor: (input, the same shifted by one), block after block."""

    def __init__(self, tokens: torch.Tensor, block_size: int) -> None:
        self.tokens, self.block_size = tokens, block_size
        self.count = (len(tokens) - 1) // block_size

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.block_size
        chunk = self.tokens[start : start + self.block_size + 1]
        return chunk[:-1], chunk[1:]


class TextDataModule(pl.LightningDataModule):
    """A text file's characters, split into train, validation and test parts (the last 10% each by default);
    batches are (tokens, next tokens) of `block_size` characters."""

    sizes = ("vocab_size", "block_size")

    @classmethod
    def check_config(cls, config: dict[str, Any]) -> None:
        """Refuse values of its config before anything is built or launched (`plan=true` too)."""
        if not config.get("path"):
            raise ValueError("data=text needs the text to train on: data.path=FILE (any UTF-8 text file)")
        block_size = config.get("block_size", 64)
        if isinstance(block_size, int) and block_size < 1:
            raise ValueError(f"data.block_size={block_size} must be at least 1")
        val, test = config.get("val_fraction", 0.1), config.get("test_fraction", 0.1)
        if (
            isinstance(val, int | float)
            and isinstance(test, int | float)
            and not (0 < val < 1 and 0 < test < 1 and val + test < 1)
        ):
            raise ValueError(
                f"data.val_fraction={val} and data.test_fraction={test} must be between 0 and 1 and leave text "
                "to train on"
            )

    def __init__(
        self,
        path: str | None,
        block_size: int = 64,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        batch_size: int = 32,
        num_workers: int = 0,
        pin_memory: bool = False,
        drop_last: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__()
        run_config_check(self.check_config, {"path": path, "block_size": block_size, "val_fraction": val_fraction,
                                         "test_fraction": test_fraction})  # fmt: skip
        self.path = Path(str(path)).expanduser()
        if not self.path.is_file():
            raise UserError(f"data.path={path} is not a file; give a UTF-8 text file")
        self.block_size, self.val_fraction, self.test_fraction = block_size, val_fraction, test_fraction
        self.batch_size, self.num_workers, self.pin_memory = batch_size, num_workers, pin_memory
        self.drop_last, self.seed = drop_last, seed
        self.splits: dict[str, TextBlocks] = {}
        self.predict_path: Path | None = None  # `predict.source`: another text; None: predict on the test part

    @cached_property
    def text(self) -> str:
        try:
            return self.path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise UserError(f"data.path={self.path} is not UTF-8 text ({err.reason} at byte {err.start})") from None

    @cached_property
    def vocabulary(self) -> list[str]:
        return sorted(set(self.text))

    @property
    def vocab_size(self) -> int:
        return len(self.vocabulary)

    def prepare_data(self) -> None:
        """Refuse, before the run starts, a text too short for one block of each split."""
        parts = self._bounds()
        short = [name for name, (a, b) in parts.items() if b - a < self.block_size + 1]
        if short:
            raise UserError(
                f"{self.path} has {len(self.text)} characters: too few for a block of {self.block_size} in its "
                f"{', '.join(short)} part; lower data.block_size or give a longer text"
            )

    def _bounds(self) -> dict[str, tuple[int, int]]:
        n = len(self.text)
        val, test = int(n * self.val_fraction), int(n * self.test_fraction)
        return {"train": (0, n - val - test), "val": (n - val - test, n - test), "test": (n - test, n)}

    def predict_from(self, source: str) -> None:
        """Predict on the text of the file `source`, in blocks, with the vocabulary of the training text."""
        path = Path(source).expanduser()
        if not path.is_file():
            raise UserError(f"predict.source={source} is not a file; give a UTF-8 text file")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise UserError(f"predict.source={source} is not UTF-8 text ({err.reason} at byte {err.start})") from None
        if unknown := sorted(set(text) - set(self.vocabulary)):
            raise UserError(
                f"predict.source={source} has characters the model never saw in {self.path} ({unknown[0]!r} and "
                f"{len(unknown) - 1} more); remove them, or train on a text that has them"
            )
        if len(text) < self.block_size + 1:
            raise UserError(f"predict.source={source} is shorter than one block of {self.block_size} characters")
        self.predict_path = path

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        index = {c: i for i, c in enumerate(self.vocabulary)}
        tokens = torch.tensor([index[c] for c in self.text], dtype=torch.long)
        self.splits = {name: TextBlocks(tokens[a:b], self.block_size) for name, (a, b) in self._bounds().items()}
        self.splits["predict"] = self.splits["test"]
        if self.predict_path is not None:
            other = self.predict_path.read_text(encoding="utf-8")
            self.splits["predict"] = TextBlocks(torch.tensor([index[c] for c in other]), self.block_size)

    def _loader(self, split: str, train: bool = False) -> DataLoader:
        return DataLoader(
            self.splits[split],
            batch_size=self.batch_size,
            shuffle=train,
            drop_last=train and self.drop_last,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            generator=torch.Generator().manual_seed(self.seed) if train else None,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader("predict")


class CharLM(pl.LightningModule):
    """A small causal transformer over characters: embedding + positions, `layers` pre-norm blocks, a head."""

    def __init__(
        self,
        vocab_size: int,
        block_size: int,
        lr: float = 3e-3,
        width: int = 128,
        layers: int = 2,
        heads: int = 4,
        dropout: float = 0.1,
        weight_decay: float = 0.01,
    ) -> None:
        super().__init__()
        if width % heads:
            raise UserError(f"model.width={width} must be a multiple of model.heads={heads}")
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab_size, width)
        self.position = nn.Embedding(block_size, width)
        block = nn.TransformerEncoderLayer(
            width, heads, dim_feedforward=4 * width, dropout=dropout, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        x = self.embed(tokens) + self.position(torch.arange(length, device=tokens.device))
        causal = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
        return self.head(self.norm(self.blocks(x, mask=causal, is_causal=True)))

    def _loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        tokens, targets = batch
        logits = self(tokens)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def _evaluate(self, stage: str, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        loss = self._loss(batch)
        self.log(f"{stage}/loss", loss, prog_bar=stage == "val", sync_dist=True)
        self.log(f"{stage}/bits_per_char", loss / math.log(2), sync_dist=True)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate("val", batch)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate("test", batch)

    def predict_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        """Per block: the most likely next character at each position, and (given the true next characters)
        the block's mean loss in bits per character."""
        tokens, targets = batch if isinstance(batch, tuple | list) else (batch, None)
        logits = self(tokens)
        out = {"next": logits.argmax(-1)}
        if targets is not None:
            loss = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none").mean(-1)
            out["bits_per_char"] = loss / math.log(2)
        return out

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(
            self.parameters(), lr=self.hparams["lr"], weight_decay=self.hparams["weight_decay"]
        )
        steps = max(1, int(self.trainer.estimated_stepping_batches))
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=self.hparams["lr"], total_steps=steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    @torch.no_grad()
    def sample(self, vocabulary: list[str], start: str, length: int = 200) -> str:
        """Text the model writes after `start` (greedy from its distribution: drawn, not argmax)."""
        index = {c: i for i, c in enumerate(vocabulary)}
        tokens = torch.tensor([[index[c] for c in start if c in index] or [0]], device=self.device)
        for _ in range(length):
            logits = self(tokens[:, -self.hparams["block_size"] :])[:, -1]
            tokens = torch.cat([tokens, torch.multinomial(logits.softmax(-1), 1)], dim=1)
        return "".join(vocabulary[i] for i in tokens[0].tolist())
