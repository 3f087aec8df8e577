"""`_target_` paths of earlier releases, as saved run configs and checkpoints name them: rewritten to where the
classes live now when such a file is read, so older runs continue and older checkpoints load."""

from __future__ import annotations

from typing import Any

MOVED = {
    "hydralight.model.SeedCNN": "hydralight.tasks.nets.SeedCNN",
    "hydralight.model.MLP": "hydralight.tasks.nets.MLP",
    "hydralight.model.FastCNN": "hydralight.tasks.nets.FastCNN",
    "hydralight.model.small_resnet": "hydralight.tasks.nets.small_resnet",
    "hydralight.model.Classifier": "hydralight.tasks.classifier.Classifier",
    "hydralight.last_checkpoint.LastCheckpoint": "hydralight.resume.last_checkpoint.LastCheckpoint",
    "hydralight.preemption.Preemption": "hydralight.resume.preemption.Preemption",
    "hydralight.progress.progress_bar": "hydralight.training.progress.progress_bar",
    "hydralight.distributed.RankRecord": "hydralight.training.records.RankRecord",
    "hydralight.loggers.AppendingCSVLogger": "hydralight.training.loggers.HistoryLogger",
    "hydralight.report.SweepSummary": "hydralight.launch.summary.SweepSummary",
}


# Arguments a class no longer takes, dropped from saved configs: where image folders cached their decoded
# images (now `cache_dir`, outside the data).
DROPPED = {"hydralight.data.ImageFolderDataModule": ("data_dir",)}


def upgraded(value: Any) -> Any:
    """`value` (a config or hyperparameters, as plain containers) with every moved `_target_` rewritten."""
    if isinstance(value, dict):
        new = {k: MOVED.get(v, v) if k == "_target_" else upgraded(v) for k, v in value.items()}
        for key in DROPPED.get(str(new.get("_target_")), ()):
            new.pop(key, None)
        return new
    if isinstance(value, list):
        return [upgraded(v) for v in value]
    return value
