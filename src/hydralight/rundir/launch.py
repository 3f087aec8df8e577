"""Which launcher started this process (plain `python`, torchrun, SLURM's srun), its rank, and the run dir
all ranks of one launch share. Read from the environment before Hydra composes anything."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydralight.errors import UserError

# The pid of the rank that starts the others, as they find it in their environment: they stop when it is gone.
LAUNCHER_PID = "HYDRALIGHT_LAUNCHER_PID"
# Ranks started while this process prepares the job (`early_ranks`), waiting to be told what to run.
EARLY_RANKS: list[subprocess.Popen] = []
# The job's log file and its size before this attempt (None: it was not there), for `take_back_log`.
_job_log: tuple[logging.FileHandler, int | None] | None = None
# Hydra's record of a job (`.hydra/`) as it was before the job wrote it there (folder -> its files), for
# `restore_record`: a job refused in the dir of an earlier run leaves that run's record.
_records_before: dict[Path, Any] = {}
# What a job dir held when Hydra's job started there, before Hydra wrote its log and record (folder -> names): a
# job dir Hydra works out itself (`${...}`, a sweep's job) is checked once it has written them.
_found_before: dict[Path, frozenset[str]] = {}
# What Hydra writes into a job dir: its record's folder and files.
RECORD_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")


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


def launch_run_dir(resume: Any, mode: Any) -> str | None:
    """The run dir this launch names, when it names one: `resume=RUN_DIR` continues in RUN_DIR (a training run;
    `mode=eval` and `mode=predict` read its checkpoint and write a run dir of their own); every rank of a
    torchrun or srun launch shares one named after the launch (torchrun's run id and rendezvous port, or the
    SLURM job id, which a requeued job keeps), where Hydra would give each rank its own time-stamped dir.
    None: a new dated folder (conf/hydra/default.yaml)."""
    if str(resume) not in ("auto", "never", "None", "") and getattr(mode, "name", str(mode)) == "train":
        if os.path.isfile(str(resume)):
            raise UserError(
                f"resume={resume} is a file; resume takes the run dir of an earlier run (outputs/<date>/<time>): to "
                f"continue from a checkpoint file, give ckpt_path={resume}"
            )
        return str(resume)
    launcher = external_launcher()
    if launcher == "torchrun":
        # A rendezvous id given (`--rdzv-id=$JOB`) names the job: relaunched, it continues there. Without one
        # torchrun calls every launch "none", told apart by its rendezvous port (--standalone draws an id).
        run_id = os.environ["TORCHELASTIC_RUN_ID"]
        return f"outputs/torchrun-{run_id}" + (f"-{os.environ.get('MASTER_PORT', '0')}" if run_id == "none" else "")
    if launcher == "slurm":
        return f"outputs/slurm-{os.environ.get('SLURM_ARRAY_JOB_ID', os.environ.get('SLURM_JOB_ID', '0'))}"
    return None


def record_subdir(resume: Any, mode: Any, output_dir: str) -> str | None:
    """Where in its run dir Hydra writes its record of the run (`hydra.output_subdir`): `.hydra`; nowhere from a
    rank other than 0 of a launch, nor into the dir of an earlier run this one continues (its record stays)."""
    continued = launch_run_dir(resume, mode) == str(resume)
    if not is_rank_zero() or (continued and Path(output_dir).resolve() == Path(str(resume)).resolve()):
        return None
    record = Path(output_dir) / ".hydra"
    if record.is_symlink() or any((record / name).is_symlink() for name in RECORD_FILES):
        return None  # Hydra would write through it, to a file elsewhere; the run is refused for the link
    keep_record_before(Path(output_dir) / ".hydra")  # read first by Hydra as it writes the record
    return ".hydra"


def keep_record_before(folder: Path) -> None:
    """Keep Hydra's record in `folder` as it is, before this job writes its own there (the first call wins)."""
    from hydralight.rundir.record import FileSnapshot

    folder = folder.resolve()
    if folder not in _records_before:
        _records_before[folder] = FileSnapshot.of_folder(folder)


def restore_record(run_dir: Path, refused: bool) -> None:
    """The job of `run_dir` ended: refused, Hydra's record there is put back as it was."""
    for folder in [f for f in _records_before if f.parent == run_dir.resolve()]:
        before = _records_before.pop(folder)
        if refused:
            before.restore(folder)


def log_handler(to: str, **file: Any) -> logging.Handler:
    """A handler of Hydra's job logging (conf/hydra/job_logging/project.yaml): rank 0 writes to the console
    (`to: console`) and the run's log file (`to: file`, `filename`); the other ranks of a launch only their
    warnings, to stderr."""
    if not is_rank_zero():
        handler: logging.Handler = logging.StreamHandler(sys.stderr) if to == "console" else logging.NullHandler()
        handler.setLevel(logging.WARNING)
        return handler
    if to != "file":
        return logging.StreamHandler(sys.stdout)
    global _job_log
    path = Path(file["filename"])
    # The first thing Hydra's job does in its dir after making it: what the dir held is taken now.
    with contextlib.suppress(OSError):
        _found_before.setdefault(path.parent.resolve(), frozenset(os.listdir(path.parent)))
    if path.is_symlink():  # a log through a link would append to a file elsewhere; the run is refused for the link
        return logging.NullHandler()
    size = path.stat().st_size if path.is_file() else None
    _job_log = (logging.FileHandler(path), size)
    return _job_log[0]


def found_before_hydra(run_dir: Path) -> frozenset[str] | None:
    """What the job dir held before Hydra's job wrote its log and record there; None when not known (job logging
    of the user's own, without this project's handler)."""
    return _found_before.get(run_dir.resolve())


def take_back_log() -> None:
    """An attempt that changed nothing (refused, or the run had already finished) leaves the job's log file as
    it was: its lines were said on the console. Later lines of this process go to the console only."""
    global _job_log
    if _job_log is None:
        return
    (handler, size), _job_log = _job_log, None
    logging.getLogger().removeHandler(handler)
    handler.close()
    path = Path(handler.baseFilename)
    with contextlib.suppress(FileNotFoundError):
        if size is None:
            path.unlink()
        elif path.stat().st_size > size:
            os.truncate(path, size)


def register_resolvers() -> None:
    """The resolvers conf/hydra/default.yaml names, for every process that composes or runs a job."""
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver(
        "hydralight.run_dir", lambda resume, mode, dated: launch_run_dir(resume, mode) or dated, replace=True
    )
    OmegaConf.register_new_resolver("hydralight.record_subdir", record_subdir, replace=True)


def check_writable(folder: str, key: str = "hydra.run.dir") -> None:
    """Refuse, before Hydra starts, a run or sweep dir (named by `key`) that cannot be created or written. Creates
    nothing: a folder made here would look like one the user had (and a name with `${...}` in it is Hydra's to
    resolve)."""
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
        raise UserError(f"cannot write run outputs to {folder} ({reason}); run from a writable folder or set {key}=...")


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
