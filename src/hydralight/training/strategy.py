"""Multi-process strategies, with rank processes that run their own job's plan.

Lightning's `ddp` starts ranks 1..N-1 by re-executing `sys.argv`. Under `python train.py -m ...` that
replays the whole sweep in every rank: each child launches the sweep again and may pair with a rank of
another job. Here the extra ranks run the plan that rank 0 saved in the job's own directory, so a job's
ranks always run that job and nothing else.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pytorch_lightning.strategies import DDPStrategy, Strategy

from hydralight.config.plan import RunPlan
from hydralight.lightning_internals import PlannedRanksDDP

# Rank processes this process started for the current job, waited for when the job ends.
_children: list[subprocess.Popen] = []


class JobDDPStrategy(PlannedRanksDDP):
    """DDP whose locally started ranks run the saved plan instead of replaying the command line."""

    def __init__(self, *args: Any, plan_file: Path, **kwargs: Any) -> None:
        super().__init__(*args, plan_file=plan_file, children=_children, **kwargs)


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


def build_strategy(plan: RunPlan, plan_file: Path) -> str | Strategy:
    """The Lightning strategy for the plan; `plan_file` is the job's saved plan (what extra ranks run)."""
    options = plan.strategy_kwargs()
    if options is None:
        return "auto"
    if plan.framework.strategy == "ddp_spawn":
        return SpawnDDPStrategy(start_method="spawn", **options)
    return JobDDPStrategy(plan_file=plan_file, **options)


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
