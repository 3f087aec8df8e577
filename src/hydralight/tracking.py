"""Experiment loggers and the files that record what a run was and what it measured."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

if TYPE_CHECKING:
    from pytorch_lightning.loggers import Logger

    from hydralight.plan import Plan

# What a run writes before it has done anything: Hydra's record and log, our config and plan.
RECORD_ONLY = {".hydra", "config.yaml", "plan.yaml"}


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
