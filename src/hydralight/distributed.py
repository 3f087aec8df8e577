"""Multi-process strategies, with rank processes that run their own job's config.

Lightning's `ddp` starts ranks 1..N-1 by re-executing `sys.argv`. Under `python train.py -m ...` that
replays the whole sweep in every rank: each child launches the sweep again and may pair with a rank
of another job. Here the extra ranks are started from the resolved config that rank 0 saved in the
job's own directory, so a job's ranks always run that job and nothing else.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from pytorch_lightning.strategies import DDPStrategy, Strategy
from pytorch_lightning.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

from hydralight.plan import Plan

WORKER_MODULE = "hydralight.worker"


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


def build_strategy(cfg: DictConfig, plan: Plan, config_file: Path) -> str | Strategy:
    """The Lightning strategy for the plan; `config_file` is the job's saved, resolved config."""
    name = plan.framework.strategy
    if name == "auto":
        return "auto"
    options = {
        "process_group_backend": plan.framework.backend,
        "find_unused_parameters": bool(cfg.strategy.get("find_unused_parameters", False)),
        "timeout": timedelta(seconds=int(cfg.strategy.get("timeout_s", 1800))),
    }
    if name == "ddp_spawn":
        return DDPStrategy(start_method="spawn", **options)
    return JobDDPStrategy(config_file=config_file, **options)
