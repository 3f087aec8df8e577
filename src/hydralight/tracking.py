"""Experiment loggers and the files that record what a run was and what it measured."""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.utils import instantiate
from lightning_fabric.loggers.logger import rank_zero_experiment
from lightning_fabric.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.loggers import CSVLogger, Logger, WandbLogger
from pytorch_lightning.loggers.csv_logs import ExperimentWriter

if TYPE_CHECKING:
    from hydralight.plan import Machine, Plan

# Environment variables whose values never reach a file this project writes.
SECRET_SUFFIXES = ("_KEY", "_TOKEN", "_SECRET", "_PASSWORD")
REDACTED = "<redacted>"
PACKAGES = ("torch", "torchvision", "pytorch-lightning", "torchmetrics", "hydra-core", "omegaconf", "wandb", "submitit")

# What a run writes before it has done anything: Hydra's record and log, our config, plan and manifest.
RECORD_ONLY = {".hydra", "config.yaml", "plan.yaml", "manifest.json", ".lock"}


class _AppendingWriter(ExperimentWriter):
    def _check_log_dir_exists(self) -> None:
        """Keep an existing metrics.csv: it is the history of this run's earlier attempts."""

    def forget_from_step(self, step: int) -> None:
        """Drop the rows logged at `step` or later (by an attempt that did not reach its next checkpoint)."""
        self.metrics = [row for row in self.metrics if row.get("step", 0) < step]
        if not os.path.isfile(self.metrics_file_path):
            return
        with open(self.metrics_file_path, newline="") as f:
            reader = csv.DictReader(f)
            header, rows = reader.fieldnames or [], list(reader)
        kept = [row for row in rows if row.get("step") in (None, "") or int(float(row["step"])) < step]
        if len(kept) == len(rows):
            return
        temporary = f"{self.metrics_file_path}.tmp"
        with open(temporary, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=header)
            writer.writeheader()
            writer.writerows(kept)
        os.replace(temporary, self.metrics_file_path)

    def _record_new_keys(self) -> set[str]:
        # The file may have been started by another process (or another copy of this writer).
        if os.path.isfile(self.metrics_file_path):
            with open(self.metrics_file_path, newline="") as f:
                header = next(csv.reader(f), [])
            self.metrics_keys = sorted(set(self.metrics_keys) | set(header))
        return super()._record_new_keys()


class AppendingCSVLogger(CSVLogger):
    """Lightning's CSVLogger, keeping one metrics.csv across the attempts of a run.

    Lightning's writer deletes an existing metrics.csv when it starts, and forgets the file's columns
    when a new process opens it (a resumed run, or the test stage of `ddp_spawn`). This one keeps the
    file, reads its columns back, and on resuming from step S replaces the rows logged at S or later
    with the resumed attempt's, so every step is in the file exactly once. Rows are flushed at every
    step by default (`flush_logs_every_n_steps=1`), so a kill loses none before the last checkpoint.
    """

    def __init__(self, *args: Any, flush_logs_every_n_steps: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, flush_logs_every_n_steps=flush_logs_every_n_steps, **kwargs)

    @rank_zero_only
    def forget_from_step(self, step: int) -> None:
        self.experiment.forget_from_step(step)

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            os.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment


def _is_secret_name(name: str) -> bool:
    name = name.upper()
    return name.endswith(SECRET_SUFFIXES) or name in {s.lstrip("_") for s in SECRET_SUFFIXES}


def secret_values() -> list[str]:
    """Values of the secrets this process knows: environment variables and command-line overrides whose
    names end in _KEY, _TOKEN, _SECRET or _PASSWORD (or are KEY, TOKEN, SECRET, PASSWORD)."""
    values = [v for k, v in os.environ.items() if _is_secret_name(k)]
    for arg in sys.argv[1:]:
        key, sep, value = arg.partition("=")
        if sep and _is_secret_name(key.rsplit(".", 1)[-1].lstrip("+~")):
            values.append(value.strip("'\""))
    return [v for v in values if len(v) >= 4]


@contextlib.contextmanager
def redacted_argv() -> Iterator[None]:
    """`sys.argv` with secrets replaced, for libraries that record the command line (wandb's metadata)."""
    saved = list(sys.argv)
    sys.argv[:] = redact(saved)
    try:
        yield
    finally:
        sys.argv[:] = saved


def redact(value: Any, secrets: list[str] | None = None) -> Any:
    """`value` with every secret replaced, through dicts, lists and strings."""
    secrets = secret_values() if secrets is None else secrets
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, REDACTED)
        return value
    if isinstance(value, dict):
        return {k: redact(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v, secrets) for v in value]
    return value


def redact_files(folder: Path) -> None:
    """Scrub secrets from text files already written (Hydra's record of the command line)."""
    secrets = secret_values()
    for path in folder.glob("*.yaml") if secrets and folder.is_dir() else ():
        text = path.read_text()
        if any(s in text for s in secrets):
            path.write_text(redact(text, secrets))


# How long `auto` waits for the wandb server before logging offline instead.
WANDB_PROBE_S = 5.0


def wandb_mode(requested: str) -> str:
    """The mode of the run's wandb logger: the config's when set, else the user's `WANDB_MODE`, else
    (`auto`) online only when an API key is configured and the server answers within
    `WANDB_PROBE_S` seconds, so a run never prompts for a login or hangs on a compute node
    without internet."""
    if requested != "auto":
        return requested
    if os.environ.get("WANDB_DISABLED", "").lower() in ("1", "true", "yes"):
        return "disabled"
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    has_login = netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="ignore")
    if not (os.environ.get("WANDB_API_KEY") or has_login):
        return "offline"
    unreachable = wandb_server_unreachable()
    if unreachable:
        print(
            f"wandb: {unreachable}; logging offline instead (upload later with `wandb sync <run dir>/wandb/offline-run-*`)",
            file=sys.stderr,
            flush=True,
        )
        return "offline"
    return "online"


def wandb_server_unreachable(timeout: float = WANDB_PROBE_S) -> str | None:
    """Why the wandb server (WANDB_BASE_URL) cannot be reached within `timeout` seconds; None if it can."""
    from urllib.parse import urlsplit

    url = urlsplit(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai"))
    host, port = url.hostname or "api.wandb.ai", url.port or (443 if url.scheme == "https" else 80)
    outcome: list[str | None] = []

    def probe() -> None:  # in a thread: name resolution has no timeout of its own
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            outcome.append(None)
        except OSError as err:
            outcome.append(f"{host}:{port} cannot be reached ({err.strerror or err})")

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return outcome[0] if outcome else f"{host}:{port} did not answer within {timeout:.0f}s"


def _hydra_job() -> tuple[str | None, str | None]:
    """(sweep dir, job overrides) of the running Hydra job; (None, None) outside a sweep or Hydra."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return None, None
    hc = HydraConfig.get()
    sweep = str(hc.sweep.dir) if hc.mode == RunMode.MULTIRUN else None
    return sweep, hc.job.override_dirname or None


def wandb_settings(spec: dict[str, Any], plan: Plan, output_dir: Path) -> dict[str, Any]:
    """One wandb run per job: stable id from the job dir (a requeued or resumed job continues it),
    grouped by sweep, named by its overrides, tagged with the hardware."""
    sweep, overrides = _hydra_job()
    hw, fw = plan.hardware, plan.framework
    tags = [f"{hw.num_nodes}x{hw.devices}{hw.accelerator}", fw.strategy, fw.precision]
    # The name comes from the command line, which may carry a secret's value.
    return redact(
        {
            **spec,
            "mode": wandb_mode(spec.get("mode", "auto")),
            "id": spec.get("id") or hashlib.sha1(str(output_dir.resolve()).encode()).hexdigest()[:16],
            "resume": "allow",
            "group": spec.get("group") or (Path(sweep).name if sweep else None),
            "name": spec.get("name") or overrides or output_dir.name,
            "tags": [*spec.get("tags", []), *tags],
        }
    )


def build_loggers(cfg: DictConfig, plan: Plan, manifest: dict[str, Any] | None = None) -> list[Logger]:
    """Instantiate every logger under `logger.*`, then give each the resolved config, the plan and
    (wandb) the run manifest."""
    loggers = []
    for name, spec in (cfg.get("logger") or {}).items():
        spec = OmegaConf.to_container(spec, resolve=True)
        if name == "wandb":
            spec = wandb_settings(spec, plan, Path(cfg.paths.output_dir))
        loggers.append(instantiate(spec))
    hparams = redact({"config": OmegaConf.to_container(cfg, resolve=True), "plan": plan.to_dict()})
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            start_wandb_run(logger)
        logger.log_hyperparams(hparams)
        if manifest and isinstance(logger, WandbLogger):
            logger.experiment.config.update({"manifest": redact(manifest)}, allow_val_change=True)
    return loggers


def start_wandb_run(logger: WandbLogger) -> None:
    """Start the logger's wandb run, with the command line's secrets out of what wandb records."""
    from hydralight.errors import UserError

    try:
        with redacted_argv():
            logger.experiment  # noqa: B018 (starts the run)
    except Exception as err:  # wandb raises its own error types, and they move between releases
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(
            f"wandb could not start a run ({reason[:200]}); log offline with WANDB_MODE=offline (upload later with "
            "`wandb sync`), or check WANDB_BASE_URL and your login"
        ) from None


@contextlib.contextmanager
def wandb_scope() -> Iterator[None]:
    """Close the job's wandb run when the job ends, so the next job of a sweep gets its own."""
    failed = True
    try:
        yield
        failed = False
    finally:
        wandb = sys.modules.get("wandb")
        if wandb is not None and wandb.run is not None:
            wandb.finish(exit_code=int(failed))


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
        """Write results.json and the finished manifest, print the result line; return test/acc."""
        metrics = {k: float(v) for k, v in metrics.items()}
        test_acc = metrics.get("test/acc")
        if not trainer.is_global_zero:
            return test_acc
        fit_seconds = self.extra.get("fit_seconds")
        # Samples this attempt trained, over this attempt's time (a resumed run started at a later step).
        first = next((c.start_step for c in trainer.callbacks if hasattr(c, "start_step")), 0)
        samples = (trainer.global_step - first) * self.plan.task.global_batch
        results = {
            "epochs": trainer.current_epoch,
            "global_step": trainer.global_step,
            "best_checkpoint": best or None,
            "metrics": metrics,
            "test/acc": test_acc,
            **self.extra,
            "samples_per_second": round(samples / fit_seconds, 1) if fit_seconds else None,
        }
        save_results(self.output_dir, results)
        if self._manifest is not None:
            self._manifest.finish("finished", metrics=metrics, best_checkpoint=best or None, **self.extra)
        shown = f"{test_acc:.4f}" if test_acc is not None else "n/a"
        print(f"test/acc={shown} (checkpoint: {best or 'final weights'}; run dir: {self.output_dir})", flush=True)
        return test_acc
