"""The run dir of this process and who writes it: which launcher started us (plain `python`, torchrun, SLURM's
srun), our rank, and the run dir all ranks share. Free of torch and Lightning: it runs before Hydra composes."""

from __future__ import annotations

import os
import sys

# Arguments that pick the run dir themselves; when the user gives one, it wins.
_RUN_DIR_ARGS = ("hydra.run.dir=", "+hydra.run.dir=", "++hydra.run.dir=")


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


def shared_run_overrides(argv: list[str]) -> list[str]:
    """Extra overrides so that every rank of an externally launched run shares one run dir.

    Hydra would give each rank its own time-stamped dir. The dir is named after the launch instead
    (torchrun's run id and rendezvous port, or the SLURM job id, which a requeued job keeps), and
    only rank 0 writes Hydra's record and log there.
    """
    launcher = external_launcher()
    if launcher is None or "-m" in argv or "--multirun" in argv:
        return []
    extra = []
    if not any(arg.startswith(_RUN_DIR_ARGS) for arg in argv):
        if launcher == "torchrun":
            stamp = f"torchrun-{os.environ['TORCHELASTIC_RUN_ID']}-{os.environ.get('MASTER_PORT', '0')}"
        else:
            stamp = f"slurm-{os.environ.get('SLURM_ARRAY_JOB_ID', os.environ.get('SLURM_JOB_ID', '0'))}"
        extra.append(f"hydra.run.dir=outputs/{stamp}")
    if not is_rank_zero():
        extra += ["hydra.output_subdir=null", "hydra/job_logging=disabled"]
    return extra


def with_shared_run_dir() -> None:
    """Apply `shared_run_overrides` to this process's command line (before Hydra reads it)."""
    # Before any flag: Hydra's parser takes overrides only ahead of `--cfg job` and the like.
    sys.argv[1:1] = shared_run_overrides(sys.argv[1:])


def _value(argv: list[str], key: str) -> str | None:
    for arg in reversed(argv):
        if arg.lstrip("+").startswith(f"{key}="):
            value = arg.split("=", 1)[1]
            # Hydra's quoting (`key="a b"`) is not part of the value.
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            return value
    return None


def resume_overrides(argv: list[str]) -> list[str]:
    """`resume=RUN_DIR` continues that run in its own dir; Hydra's record of the original command stays."""
    target = _value(argv, "resume")
    if target in (None, "auto", "never") or _value(argv, "hydra.run.dir") is not None:
        return []
    return [f"hydra.run.dir={target}", "hydra.output_subdir=null"]


PRINT_ONLY = ("--cfg", "-c", "--help", "-h", "--hydra-help", "--info", "--shell-completion")


def fixed_run_dir(argv: list[str]) -> str | None:
    """The run dir a single run was told to use (`hydra.run.dir=...`), when this process will write there."""
    if "-m" in argv or "--multirun" in argv or any(flag in argv for flag in PRINT_ONLY):
        return None
    if _value(argv, "plan") in ("true", "True"):
        return None
    return _value(argv, "hydra.run.dir")


def check_run_dir_writable(argv: list[str]) -> None:
    """Refuse, before Hydra starts, a run dir that cannot be created or written."""
    from hydralight.errors import UserError

    if any(flag in argv for flag in PRINT_ONLY):
        return  # Hydra only prints: no run dir is made
    multirun = "-m" in argv or "--multirun" in argv
    target = _value(argv, "hydra.sweep.dir" if multirun else "hydra.run.dir") or ("multirun" if multirun else "outputs")
    try:
        os.makedirs(target, exist_ok=True)
        probe = os.path.join(target, f".write-test-{os.getpid()}")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as err:
        raise UserError(
            f"cannot write run outputs to {target} ({err.strerror}); run from a writable folder or set hydra.run.dir=..."
        ) from None
