"""A callback that writes the torch threads each rank trains on (measured, not planned) to the run dir."""

import json
from pathlib import Path

import pytorch_lightning as pl
import torch


class ThreadsSeen(pl.Callback):
    def __init__(self, run_dir: str) -> None:
        self.run_dir = Path(run_dir)

    def on_train_batch_start(self, trainer: pl.Trainer, *args) -> None:
        if trainer.global_step == 0:
            record = {"threads": torch.get_num_threads(), "world_size": trainer.world_size}
            (self.run_dir / f"threads-{trainer.global_rank}.json").write_text(json.dumps(record))
