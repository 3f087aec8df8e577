"""The files that record what a run was and what it measured: config.yaml, plan.yaml, manifest.json,
results.json. Kept free of torch and Lightning imports: launchers read and clean run dirs with it."""

from __future__ import annotations

import contextlib
import json
import platform
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from hydralight.redaction import redact, redact_files

if TYPE_CHECKING:
    from hydralight.plan import Machine, Plan

PACKAGES = ("torch", "torchvision", "pytorch-lightning", "torchmetrics", "hydra-core", "omegaconf", "wandb", "submitit")

# What a run writes before it has done anything: Hydra's record and log, our config, plan and manifest.
RECORD_ONLY = {".hydra", "multirun.yaml", "config.yaml", "plan.yaml", "manifest.json", ".lock"}


def save_config(output_dir: Path, cfg: DictConfig, plan: Plan) -> Path:
    """Write the resolved config (what extra ranks and resumes read) and the plan; return the config file."""
    output_dir.mkdir(parents=True, exist_ok=True)
    redact_files(output_dir / ".hydra")
    config_file = output_dir / "config.yaml"
    OmegaConf.save(OmegaConf.create(redact(OmegaConf.to_container(cfg, resolve=True))), config_file)
    (output_dir / "plan.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(plan.to_dict())))
    return config_file


def save_results(output_dir: Path, results: dict[str, Any]) -> None:
    (output_dir / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, cwd=Path(__file__).parent)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _machine_record(machine: Machine) -> dict[str, Any]:
    import torch

    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            gpus.append({"name": props.name, "memory_gb": round(props.total_memory / 2**30, 1)})
    nccl = None
    if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
        with contextlib.suppress(Exception):
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
    return {
        "hostname": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "cpu_cores": machine.cpu_cores,
        "memory_gb": machine.memory_gb,
        "gpus": gpus,
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        "nccl": nccl,
    }


def _versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


class Manifest:
    """`manifest.json`: what ran (command, overrides, code, packages, machine, plan) and what came out."""

    def __init__(self, output_dir: Path, plan: Plan, machine: Machine) -> None:
        from hydra.core.hydra_config import HydraConfig

        self.path = output_dir / "manifest.json"
        overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else None
        commit = _git("rev-parse", "HEAD")
        self.data: dict[str, Any] = {
            "status": "running",
            "command": [sys.executable, *sys.argv],
            "overrides": overrides,
            "run_dir": str(output_dir),
            "git": {"commit": commit, "dirty": bool(_git("status", "--porcelain")) if commit else None},
            "versions": _versions(),
            "machine": _machine_record(machine),
            "plan": plan.to_dict(),
            "started_at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            "finished_at": None,
            "metrics": {},
            "best_checkpoint": None,
        }

    def write(self, **updates: Any) -> dict[str, Any]:
        self.data.update(updates)
        self.path.write_text(json.dumps(redact(self.data), indent=2, sort_keys=True) + "\n")
        return self.data

    def finish(self, status: str, **updates: Any) -> dict[str, Any]:
        return self.write(
            status=status, finished_at=datetime.now(timezone.utc).isoformat(timespec="milliseconds"), **updates
        )


def record_failure(output_dir: Path, reason: str) -> None:
    """Mark a job's manifest failed with its reason (writing a small one if the job was refused before it had one)."""
    path = output_dir / "manifest.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        from hydra.core.hydra_config import HydraConfig

        overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else None
        data = {"run_dir": str(output_dir), "overrides": overrides, "started_at": None}
    if data.get("status") in (None, "running", "failed"):
        data.update(
            status="failed", error=reason, finished_at=datetime.now(timezone.utc).isoformat(timespec="milliseconds")
        )
    output_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(redact(data), indent=2, sort_keys=True) + "\n")


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
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", output_dir.parent.name):
        with contextlib.suppress(OSError):  # the date folder Hydra made for it, when nothing else is in there
            output_dir.parent.rmdir()
    return True


class RunRecord:
    """The files of one run: config.yaml and plan.yaml at start, manifest.json throughout,
    results.json at the end. Only the writer (rank 0) writes; every rank knows the paths."""

    def __init__(self, output_dir: Path, cfg: DictConfig, plan: Plan, machine: Machine, writer: bool) -> None:
        self.output_dir = output_dir
        self.cfg = cfg
        self.plan = plan
        self.writer = writer
        self.config_file = output_dir / "config.yaml"
        self.extra: dict[str, Any] = {}
        self._manifest = None
        if writer:
            save_config(output_dir, cfg, plan)
            self._manifest = Manifest(output_dir, plan, machine)
            self._manifest.write()

    @property
    def manifest(self) -> dict[str, Any] | None:
        return self._manifest.data if self._manifest else None

    @contextlib.contextmanager
    def timed(self, key: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.extra[key] = round(time.perf_counter() - start, 3)

    def __enter__(self) -> RunRecord:
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, tb: Any) -> None:
        if kind is not None and self._manifest is not None:
            status = "interrupted" if isinstance(error, (SystemExit, KeyboardInterrupt)) else "failed"
            reason = (
                str(error).strip().splitlines()[0] if error is not None and str(error).strip() else type(error).__name__
            )
            self._manifest.finish(status, error=reason, **self.extra)

    def finish(self, trainer: Any, metrics: dict[str, Any], best: str | None) -> float | None:
        """Write results.json and the finished manifest, print the result line; return the objective (the
        run's best validation value of `objective.metric`: what a sweeper may tune on, never a test metric)."""
        metrics = {k: float(v) for k, v in metrics.items()}
        test_acc = metrics.get("test/acc")
        objective = objective_value(trainer, metrics, self.cfg.objective.metric)
        if not trainer.is_global_zero:
            return objective
        fit_seconds = self.extra.get("fit_seconds")
        # Samples this attempt trained, over this attempt's time (a resumed run started at a later step).
        first = next((c.start_step for c in trainer.callbacks if hasattr(c, "start_step")), 0)
        samples = (trainer.global_step - first) * self.plan.task.global_size
        results = {
            "epochs": trainer.current_epoch,
            "global_step": trainer.global_step,
            "best_checkpoint": best or None,
            "metrics": metrics,
            "test/acc": test_acc,
            "objective": {"metric": str(self.cfg.objective.metric), "value": objective},
            **self.extra,
            "samples_per_second": round(samples / fit_seconds, 1) if fit_seconds else None,
        }
        save_results(self.output_dir, results)
        if self._manifest is not None:
            self._manifest.finish("finished", metrics=metrics, best_checkpoint=best or None, **self.extra)
        shown = f"{test_acc:.4f}" if test_acc is not None else "n/a"
        print(f"test/acc={shown} (checkpoint: {best or 'final weights'}; run dir: {self.output_dir})", flush=True)
        return objective


def objective_value(trainer: Any, metrics: dict[str, float], metric: str) -> float | None:
    """The best `metric` of the run as the best-checkpoint callback tracked it (over every validation,
    across resumed attempts), else its last value; None when the run never validated."""
    chosen = trainer.checkpoint_callback
    if chosen is not None and getattr(chosen, "monitor", None) == metric and chosen.best_model_score is not None:
        return float(chosen.best_model_score)
    return metrics.get(metric)
