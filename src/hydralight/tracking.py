"""Experiment loggers and the files that record what a run was and what it measured."""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.utils import instantiate
from lightning_fabric.loggers.logger import rank_zero_experiment
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.loggers import CSVLogger, Logger
from pytorch_lightning.loggers.csv_logs import ExperimentWriter

if TYPE_CHECKING:
    from hydralight.plan import Plan

# What a run writes before it has done anything: Hydra's record and log, our config and plan.
RECORD_ONLY = {".hydra", "config.yaml", "plan.yaml"}


class _AppendingWriter(ExperimentWriter):
    def _record_new_keys(self) -> set[str]:
        # The file may have been started by another process (or another copy of this writer).
        if os.path.isfile(self.metrics_file_path):
            with open(self.metrics_file_path, newline="") as f:
                header = next(csv.reader(f), [])
            self.metrics_keys = sorted(set(self.metrics_keys) | set(header))
        return super()._record_new_keys()


class AppendingCSVLogger(CSVLogger):
    """Lightning's CSVLogger, able to append to a metrics.csv that another process started.

    Lightning's writer forgets the file's columns when a new process opens it (a resumed run, or the
    test stage of `ddp_spawn`) and then fails to rewrite the header. This one reads them back first.
    """

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            os.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment


def wandb_mode(requested: str) -> str:
    """`auto` is online only when an API key is configured, so a run never prompts or waits for a login."""
    if requested != "auto":
        return requested
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    has_login = netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="ignore")
    return "online" if has_login else "offline"


def build_loggers(cfg: DictConfig, plan: Plan) -> list[Logger]:
    """Instantiate every logger under `logger.*`, then give each the resolved config and the plan."""
    loggers = []
    for name, spec in (cfg.get("logger") or {}).items():
        spec = OmegaConf.to_container(spec, resolve=True)
        if name == "wandb":
            spec["mode"] = wandb_mode(spec.get("mode", "auto"))
        loggers.append(instantiate(spec))
    hparams = {"config": OmegaConf.to_container(cfg, resolve=True), "plan": plan.to_dict()}
    for logger in loggers:
        logger.log_hyperparams(hparams)
    return loggers


def save_run_record(output_dir: Path, cfg: DictConfig, plan: Plan) -> Path:
    """Write the resolved config (what extra ranks and resumes read) and the plan; return the config file."""
    output_dir.mkdir(parents=True, exist_ok=True)
    config_file = output_dir / "config.yaml"
    OmegaConf.save(cfg, config_file, resolve=True)
    (output_dir / "plan.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(plan.to_dict())))
    return config_file


def save_results(output_dir: Path, results: dict[str, Any]) -> None:
    (output_dir / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")


def discard_unused_run_dir(output_dir: Path) -> bool:
    """Remove a run dir that holds only its start-up record (a refused or plan-only run); keep anything else."""
    if not output_dir.is_dir():
        return False
    entries = list(output_dir.iterdir())
    if any(e.name not in RECORD_ONLY and e.suffix != ".log" for e in entries):
        return False
    for entry in entries:
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    output_dir.rmdir()
    return True
