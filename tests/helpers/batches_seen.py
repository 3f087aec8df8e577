"""A callback that records the sample ids of every training micro-batch each rank trains, epoch by epoch."""

import json
from pathlib import Path

import pytorch_lightning as pl


class BatchesSeen(pl.Callback):
    def __init__(self, out: str) -> None:
        self.out, self.seen = Path(out), {}

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx: int) -> None:
        self.seen.setdefault(str(trainer.current_epoch), []).append([int(i) for i in batch[2]])

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(self.seen))
