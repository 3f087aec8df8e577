"""Multi-process strategies, with rank processes that run their own job's config.

Lightning's `ddp` starts ranks 1..N-1 by re-executing `sys.argv`. Under `python train.py -m ...` that
replays the whole sweep in every rank: each child launches the sweep again and may pair with a rank
of another job. Here the extra ranks are started from the resolved config that rank 0 saved in the
job's own directory, so a job's ranks always run that job and nothing else.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback
from pytorch_lightning.strategies import DDPStrategy, Strategy
from pytorch_lightning.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from torch.nn import SyncBatchNorm

from hydralight.plan import Plan

WORKER_MODULE = "hydralight.worker"
# Rank processes this process started for the current job, waited for when the job ends.
_children: list[subprocess.Popen] = []


class JobScriptLauncher(_SubprocessScriptLauncher):
    """Starts ranks 1..N-1 of this node as `python -m hydralight.worker <job config>`."""

    def __init__(self, *args: Any, config_file: Path, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.config_file = config_file

    def _call_children_scripts(self) -> None:
        self._check_can_spawn_children()
        self.procs = []
        env = self.cluster_environment
        os.environ.update(
            MASTER_ADDR=env.main_address,
            MASTER_PORT=str(env.main_port),
            NODE_RANK=str(env.node_rank()),
            LOCAL_RANK=str(env.local_rank()),
            WORLD_SIZE=str(self.num_processes * self.num_nodes),
        )
        for local_rank in range(1, self.num_processes):
            child_env = {**os.environ, "LOCAL_RANK": str(local_rank)}
            command = [sys.executable, "-m", WORKER_MODULE, str(self.config_file)]
            self.procs.append(subprocess.Popen(command, env=child_env))
        _children.extend(self.procs)


class JobDDPStrategy(DDPStrategy):
    """DDP whose locally started ranks run the saved job config instead of replaying the command line."""

    def __init__(self, *args: Any, config_file: Path, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.config_file = config_file

    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        if isinstance(self._launcher, _SubprocessScriptLauncher):
            self._launcher = JobScriptLauncher(
                self.cluster_environment, self.num_processes, self.num_nodes, config_file=self.config_file
            )


class SpawnDDPStrategy(DDPStrategy):
    """`ddp_spawn` whose spawned workers close their process group before they exit.

    A worker that exits with a live gloo group can abort in the group's threads ("terminate called
    without an active exception"), failing a run that had finished.
    """

    def teardown(self) -> None:
        super().teardown()
        import torch.distributed as dist

        # Only the spawned workers hold a group; each stage (fit, test) spawns new ones.
        if dist.is_initialized():
            dist.destroy_process_group()


def build_strategy(plan: Plan, config_file: Path) -> str | Strategy:
    """The Lightning strategy for the plan; `config_file` is the job's saved, resolved config."""
    options = plan.strategy_kwargs()
    if options is None:
        return "auto"
    if plan.framework.strategy == "ddp_spawn":
        return SpawnDDPStrategy(start_method="spawn", **options)
    return JobDDPStrategy(config_file=config_file, **options)


@contextlib.contextmanager
def job_scope(child_timeout_s: float = 120) -> Iterator[None]:
    """Leave this process as the job found it, so the next job of a sweep starts clean.

    A DDP job sets MASTER_PORT, LOCAL_RANK, WORLD_SIZE... in os.environ and opens a process group;
    left in place, the next job would believe it was started by an external launcher and spawn nobody.
    """
    saved = dict(os.environ)
    try:
        yield
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        os.environ.clear()
        os.environ.update(saved)
        while _children:
            child = _children.pop()
            try:
                child.wait(timeout=child_timeout_s)
            except subprocess.TimeoutExpired:
                child.kill()


class RankRecord(Callback):
    """Each rank writes `ranks/rank<N>.json` (host, pid, device, learning rate) into the run dir at fit start.

    Shows which processes ran a job and with what settings: the first thing to check when a
    multi-node or multirun job misbehaves.
    """

    def __init__(self, output_dir: str) -> None:
        self.output_dir = Path(output_dir)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        folder = self.output_dir / "ranks"
        folder.mkdir(parents=True, exist_ok=True)
        record = {
            "global_rank": trainer.global_rank,
            "local_rank": trainer.local_rank,
            "node_rank": trainer.node_rank,
            "world_size": trainer.world_size,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "device": str(pl_module.device),
            "lr": pl_module.hparams.get("lr"),
            "sync_batchnorm_layers": sum(isinstance(m, SyncBatchNorm) for m in pl_module.modules()),
            "launcher": type(trainer.strategy.cluster_environment).__name__
            if hasattr(trainer.strategy, "cluster_environment")
            else None,
        }
        (folder / f"rank{trainer.global_rank}.json").write_text(json.dumps(record, indent=2) + "\n")
