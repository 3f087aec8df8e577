"""Which launcher started this process (plain `python`, torchrun, SLURM's srun), its rank, and the run dir
all ranks of one launch share. Read from the environment before Hydra composes anything."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator

from hydralight.errors import UserError

# The pid of the rank that starts the others, as they find it in their environment: they stop when it is gone.
LAUNCHER_PID = "HYDRALIGHT_LAUNCHER_PID"
# Ranks started while this process prepares the job (`early_ranks`), waiting to be told what to run.
EARLY_RANKS: list[subprocess.Popen] = []


def external_launcher() -> str | None:
    """`torchrun` or `slurm` when that launcher started one process per device, else None."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return "torchrun"
    # srun with several tasks (submitit's jobs included).
    if int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        return "slurm"
    return None


def global_rank() -> int:
    """This process's rank as its launcher announced it, read in Lightning's order (a DDP child inside a
    one-task SLURM allocation has LOCAL_RANK set but inherits SLURM_PROCID=0)."""
    for var in ("RANK", "LOCAL_RANK", "SLURM_PROCID"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


def is_rank_zero() -> bool:
    return global_rank() == 0


def shared_run_overrides(run_dir_given: bool) -> list[str]:
    """Overrides that make every rank of an externally launched run share one run dir.

    Hydra would give each rank its own time-stamped dir. The dir is named after the launch instead
    (torchrun's run id and rendezvous port, or the SLURM job id, which a requeued job keeps), and
    only rank 0 writes Hydra's record and log there.
    """
    launcher = external_launcher()
    if launcher is None:
        return []
    extra = []
    if not run_dir_given:
        if launcher == "torchrun":
            stamp = f"torchrun-{os.environ['TORCHELASTIC_RUN_ID']}-{os.environ.get('MASTER_PORT', '0')}"
        else:
            stamp = f"slurm-{os.environ.get('SLURM_ARRAY_JOB_ID', os.environ.get('SLURM_JOB_ID', '0'))}"
        extra.append(f"hydra.run.dir=outputs/{stamp}")
    if not is_rank_zero():
        extra += ["hydra.output_subdir=null", "hydra/job_logging=disabled"]
    return extra


def check_writable(folder: str) -> None:
    """Refuse, before Hydra starts, a run or sweep dir that cannot be created or written. Creates nothing: a
    folder made here would look like one the user had (and a name with `${...}` in it is Hydra's to resolve)."""
    if "${" in folder:
        folder = folder.split("${", 1)[0] or "."  # the part before the first interpolation is fixed
    target = os.path.abspath(folder)
    existing = target
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    reason = None
    if not os.path.isdir(existing):
        reason = f"{existing} is a file"
    elif not os.access(existing, os.W_OK | os.X_OK):
        reason = "permission denied"
    else:
        try:  # a read-only filesystem passes os.access for root: try a write that leaves nothing behind
            os.rmdir(tempfile.mkdtemp(prefix=".write-test-", dir=existing))
        except OSError as err:
            reason = err.strerror
    if reason is not None:
        raise UserError(
            f"cannot write run outputs to {folder} ({reason}); run from a writable folder or set hydra.run.dir=..."
        )


def check_rank_variables() -> None:
    """Refuse rank variables of another launch left in the shell: `python train.py` started by hand would act as
    that rank (writing no record, as only rank 0 writes), or as a child of a launch that never happened."""
    if external_launcher() is not None:
        return
    stale = [f"{name}={os.environ[name]}" for name in ("RANK", "LOCAL_RANK") if name in os.environ]
    if stale and stale != ["RANK=0"]:
        names = " ".join(s.split("=", 1)[0] for s in stale)
        raise UserError(
            f"{', '.join(stale)} is set in this shell, but no launcher (torchrun, srun) started this process; it "
            f"would run as another job's rank and record nothing: unset {names} (or start the ranks with torchrun)"
        )


@contextlib.contextmanager
def early_ranks(strategy: str, devices: int, num_nodes: int) -> Iterator[None]:
    """Start this node's other ranks of a `ddp` or `fsdp` job now, while this one resolves its plan and builds
    the data, the module and the trainer: each imports what a rank runs (seconds of torch and Lightning) and
    waits until Lightning would start it, when it is told its environment and plan file (`python -m
    hydralight.worker -`). Their imports then overlap this rank's instead of following them. Those never told
    (the job refused, or another number of ranks planned) are stopped when it ends."""
    started = (
        strategy in ("ddp", "fsdp")
        and devices > 1
        and num_nodes == 1
        and external_launcher() is None
        and LAUNCHER_PID not in os.environ  # the launching rank of its job: not a rank, not a job inside one
        and is_rank_zero()
    )
    if started:
        env = {**os.environ, LAUNCHER_PID: str(os.getpid())}
        command = [sys.executable, "-m", "hydralight.worker", "-"]
        for local_rank in range(1, devices):
            rank_env = {**env, "LOCAL_RANK": str(local_rank)}
            EARLY_RANKS.append(subprocess.Popen(command, env=rank_env, stdin=subprocess.PIPE, text=True))
    try:
        yield
    finally:
        while EARLY_RANKS:  # never told what to run: they have done nothing
            child = EARLY_RANKS.pop()
            child.kill()
            child.wait()
