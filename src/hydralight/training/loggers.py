"""The run's metric history (csv/metrics.csv, written with every logger, kept across resumes) and the
experiment trackers `logger=` adds beside it: TensorBoard, Weights & Biases."""

from __future__ import annotations

import contextlib
import csv
import hashlib
import os
import socket
import sys
import threading
from argparse import Namespace
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from lightning_fabric.utilities.rank_zero import rank_zero_only
from pytorch_lightning.loggers import Logger, WandbLogger

from hydralight.config.plan import RunPlan
from hydralight.errors import UserError, require
from hydralight.rundir.layout import RunDir
from hydralight.rundir.redaction import redact, redacted_argv

HISTORY_TARGET = "hydralight.training.loggers.HistoryLogger"


class HistoryLogger(Logger):
    """Every logged metric of a run, one row per logged step, in `<run dir>/csv/metrics.csv`, kept across the
    attempts of the run (resumes, requeues, the test stage of `ddp_spawn`): an attempt resumed from step S
    replaces the rows logged at S or later, so every step is in the file once. Rows reach the disk as they
    are logged, so a kill loses none before the last checkpoint.

    Written on Lightning's public Logger API: its CSVLogger deletes an existing file when it starts and
    forgets the file's columns in a new process.
    """

    def __init__(self, run_dir: str) -> None:
        super().__init__()
        self.path = RunDir.at(run_dir).history
        self._run_dir = run_dir
        self._columns: list[str] | None = None

    @property
    def name(self) -> str:
        return "csv"

    @property
    def version(self) -> str:
        return ""

    @property
    def root_dir(self) -> str:
        return self._run_dir

    @property
    def log_dir(self) -> str:
        return str(self.path.parent)

    @property
    def save_dir(self) -> str:
        return self._run_dir

    def _header(self) -> list[str]:
        if self._columns is None:
            self._columns = []
            if self.path.is_file():
                with self.path.open(newline="") as f:
                    self._columns = next(csv.reader(f), [])
        return self._columns

    def _rows(self) -> list[dict[str, str]]:
        if not self.path.is_file():
            return []
        with self.path.open(newline="") as f:
            return list(csv.DictReader(f))

    def _rewrite(self, columns: list[str], rows: list[Mapping[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with temporary.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
        os.replace(temporary, self.path)
        self._columns = columns

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        row = {"step": step, **{k: (v.item() if hasattr(v, "item") else v) for k, v in metrics.items()}}
        columns = self._header()
        new = [k for k in row if k not in columns]
        if new or not self.path.is_file():
            # A new column (the first validation, the test): the file is written again with it.
            self._rewrite([*columns, *new], [*self._rows(), row])
            return
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, fieldnames=columns).writerow(row)

    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any] | Namespace, *args: Any, **kwargs: Any) -> None:
        """The run's config and plan are in config.yaml and plan.yaml already."""

    @rank_zero_only
    def forget_from_step(self, step: int) -> None:
        """Drop the rows logged at `step` or later (by an attempt that did not reach its next checkpoint)."""
        rows = self._rows()
        kept = [row for row in rows if row.get("step") in (None, "") or int(float(row["step"])) < step]
        if len(kept) != len(rows):
            self._rewrite(self._header(), kept)


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


def wandb_settings(spec: dict[str, Any], plan: RunPlan) -> dict[str, Any]:
    """One wandb run per job: stable id from the job dir (a requeued or resumed job continues it),
    grouped by sweep, named by its overrides, tagged with the hardware."""
    hw, fw, paths = plan.hardware, plan.framework, plan.paths
    tags = [f"{hw.num_nodes}x{hw.devices}{hw.accelerator}", fw.strategy, fw.precision]
    run_dir = Path(paths.run_dir)
    # The name comes from the command line, which may carry a secret's value.
    return redact(
        {
            **spec,
            "mode": wandb_mode(spec.get("mode", "auto")),
            "id": spec.get("id") or hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:16],
            "resume": "allow",
            "group": spec.get("group") or (Path(paths.sweep_dir).name if paths.sweep_dir else None),
            "name": spec.get("name") or paths.job_name or run_dir.name,
            "tags": [*spec.get("tags", []), *tags],
        }
    )


def build_loggers(plan: RunPlan, manifest: dict[str, Any] | None = None) -> list[Logger]:
    """The history, then every logger under `logger.*`; each tracker gets the resolved config, the plan and
    (wandb) the run manifest."""
    from hydra.utils import instantiate

    loggers: list[Logger] = [HistoryLogger(plan.paths.run_dir)]
    for name, spec in plan.loggers.items():
        if spec.get("_target_") == HISTORY_TARGET:
            continue  # always there
        if name == "wandb":
            spec = wandb_settings(spec, plan)
        if name == "tensorboard":
            require("tensorboard", "tensorboard", "logger=tensorboard")
        loggers.append(instantiate(spec))
    hparams = redact({"config": plan.config, "plan": plan.to_dict()})
    for logger in loggers[1:]:
        if isinstance(logger, WandbLogger):
            start_wandb_run(logger)
        logger.log_hyperparams(hparams)
        if manifest and isinstance(logger, WandbLogger):
            logger.experiment.config.update({"manifest": redact(manifest)}, allow_val_change=True)
    return loggers


def start_wandb_run(logger: WandbLogger) -> None:
    """Start the logger's wandb run, with the command line's secrets out of what wandb records."""
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
