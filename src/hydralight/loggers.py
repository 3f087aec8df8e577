"""The experiment loggers of a run: CSV that survives resumes, TensorBoard, Weights & Biases."""

from __future__ import annotations

import contextlib
import csv
import hashlib
import os
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.utils import instantiate
from lightning_fabric.loggers.logger import rank_zero_experiment
from lightning_fabric.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.loggers import CSVLogger, Logger, WandbLogger
from pytorch_lightning.loggers.csv_logs import ExperimentWriter

from hydralight.redaction import redact, redacted_argv

if TYPE_CHECKING:
    from hydralight.plan import Plan


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
