"""Every place the project reaches into Lightning's internals, behind one wall.

Each function says why no public API does the job and what it touches; all were checked against
pytorch-lightning 2.6 (the pin in pyproject.toml stops at 2.7). tests/test_private_apis.py exercises each
touch the way the project uses it and names this module when one moves.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytorch_lightning as pl
import torch
from lightning_fabric.strategies.launchers.subprocess_script import _ChildProcessObserver
from lightning_fabric.utilities.distributed import _set_num_threads_if_needed
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.strategies import DDPStrategy, ModelParallelStrategy, ParallelStrategy
from pytorch_lightning.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from pytorch_lightning.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

from hydralight.errors import UserError

if TYPE_CHECKING:
    from pytorch_lightning.loops.progress import _ProcessedTracker, _StartedTracker

# -- weight averaging -------------------------------------------------------------------------------------


def averaged_updates(callback: Any) -> int:
    """How many weights a `WeightAveraging` callback's average has taken in (0: still the copy made when `fit`
    started). The average (`_average_model`, an AveragedModel counting in `n_averaged`) has no public accessor."""
    model = getattr(callback, "_average_model", None)
    return 0 if model is None else int(model.n_averaged)


def swap_average(callback: Any, module: pl.LightningModule) -> None:
    """Exchange the module's weights with the average, as the callback's validation hooks do (`_swap_models`)."""
    callback._swap_models(module)


# -- the training loop's progress -----------------------------------------------------------------------


def micro_batches_done(trainer: pl.Trainer) -> int:
    """Micro-batches trained in the current epoch (a resumable loader's position). The loop's progress
    counters have no public accessor; `trainer.fit_loop.epoch_loop.batch_progress.current.processed`."""
    # Typed as the tracker base class; the batch progress holds a `_ProcessedTracker`.
    return cast("_ProcessedTracker", trainer.fit_loop.epoch_loop.batch_progress.current).processed


def set_micro_batches_done(trainer: pl.Trainer, done: int) -> None:
    """Make the epoch's micro-batch counters (`batch_progress.current` and `.total`, every stage of them) say
    `done`: a run continued under another accumulation counts in its own micro-batches, where Lightning's
    accumulation boundary (`ready % accumulate_grad_batches`) and the epoch's batch index are read."""
    progress = trainer.fit_loop.epoch_loop.batch_progress
    delta = done - cast("_ProcessedTracker", progress.current).processed
    for tracker in (progress.current, progress.total):
        for field in ("ready", "started", "processed", "completed"):
            setattr(tracker, field, getattr(tracker, field) + delta)


def epoch_complete(trainer: pl.Trainer) -> bool:
    """Whether the epoch ran to its last batch, not cut by a step budget (`batch_progress.is_last_batch`;
    `trainer.is_last_batch` is reset once the epoch ends)."""
    return bool(trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)


def align_logging_step(trainer: pl.Trainer) -> None:
    """Keep Lightning's logging step equal to the optimizer step. A restart at an epoch boundary can leave
    `fit_loop.epoch_loop._batches_that_stepped` one ahead, and a resumed run would log one step off from an
    uninterrupted one; it has no public setter."""
    trainer.fit_loop.epoch_loop._batches_that_stepped = trainer.global_step


def validation_follows(trainer: pl.Trainer) -> bool:
    """Whether Lightning validates right after the training batch that just ended: its epoch loop's own
    decision (`_should_check_val_fx`), which no public attribute gives."""
    fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)
    if not trainer.enable_validation or fetcher is None:
        return False
    return bool(trainer.fit_loop.epoch_loop._should_check_val_fx(fetcher))


def validate_now(trainer: pl.Trainer) -> None:
    """Run a validation pass inside `fit`, after its last step (one stopped between validations), logged at
    the last step's index as an epoch-end validation is. `trainer.validate()` cannot run inside `fit`; the
    epoch loop's `val_loop.run()` and `_batches_that_stepped` can."""
    loop = trainer.fit_loop.epoch_loop
    stepped = loop._batches_that_stepped
    loop._batches_that_stepped = trainer.global_step - 1
    _STEPPED_BEFORE[id(loop)] = stepped  # what logging_step says meanwhile (a stop saved in this validation)
    trainer.validating = True
    try:
        loop.val_loop.run()
    finally:
        trainer.training = True
        loop._batches_that_stepped = stepped
        _STEPPED_BEFORE.pop(id(loop), None)


# The training's logging step of an epoch loop whose `validate_now` runs (its own is moved back for that time).
_STEPPED_BEFORE: dict[int, int] = {}


def log_step_metrics_now(trainer: pl.Trainer) -> None:
    """Hand this step's logged metrics to the loggers now: Lightning does it right after
    `on_train_batch_end`, which a run stopping at this step skips
    (`trainer._logger_connector.update_train_step_metrics`)."""
    trainer._logger_connector.update_train_step_metrics()


def accumulating(trainer: pl.Trainer) -> bool:
    """Whether the batch just trained accumulates gradients (no optimizer step, nothing logged): the epoch
    loop's `_should_accumulate()`, which Lightning decides its step logging by and keeps private."""
    return bool(trainer.fit_loop.epoch_loop._should_accumulate())


def loggers_write_this_step(trainer: pl.Trainer) -> bool:
    """Whether Lightning writes this training step's logged values to the loggers itself (every
    `log_every_n_steps`, and at a stop): `trainer._logger_connector.should_update_logs`."""
    return bool(trainer._logger_connector.should_update_logs)


def step_values_for_loggers(trainer: pl.Trainer) -> dict[str, Any]:
    """What the module logged on this training step for the loggers (`self.log(..., on_step=True)`), as
    Lightning's own write takes them: the epoch loop's private results, `_results.metrics(True)["log"]`."""
    return dict(trainer.fit_loop.epoch_loop._results.metrics(True)["log"])


def logging_step(trainer: pl.Trainer) -> int:
    """The step Lightning writes training values at (`epoch_loop._batches_that_stepped`, no public getter)."""
    loop = trainer.fit_loop.epoch_loop
    return int(_STEPPED_BEFORE.get(id(loop), loop._batches_that_stepped))


def forget_train_loader(trainer: pl.Trainer) -> None:
    """Let `fit` build the training loader again. `trainer.estimated_stepping_batches` (read in a module's
    `configure_optimizers`) builds it before a checkpoint is restored, and Lightning then never gives it the
    saved position in the epoch (`fit_loop._combined_loader`)."""
    trainer.fit_loop._combined_loader = None


# -- callback dispatch -----------------------------------------------------------------------------------
# The hooks Lightning calls on every callback at every training step, overridden or not, each inside a profiler
# context (`trainer/call.py`, `_call_callback_hooks`): about 1.3 us a callback and hook on a CPU, 80 us a step
# for a dozen callbacks. That loop skips a hook attribute that is not callable.
STEP_HOOKS = (
    "on_train_batch_start",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
    "on_train_batch_end",
)


def skip_unused_step_hooks(callbacks: list[pl.Callback]) -> None:
    """Hide each callback's per-step hooks that it does not override (Callback's no-ops) from Lightning's
    dispatch, so a step pays only for the hooks that do something. Instance attributes: the classes stay as
    they are."""
    for callback in callbacks:
        for hook in STEP_HOOKS:
            if getattr(type(callback), hook, None) is getattr(pl.Callback, hook):
                setattr(callback, hook, None)


# -- values logged per epoch, over every rank ------------------------------------------------------------


def sync_epoch_values(trainer: pl.Trainer) -> list[Any]:
    """Tensor values the running loop has logged for the epoch (`on_epoch=True`: the default in validation and test;
    also with `on_step=True`, whose epoch value is `<name>_epoch`) and not synced: synced when the epoch's value is
    computed, as `self.log(..., sync_dist=True)` does (sums and counts reduced over ranks: the mean over every rank's
    samples). Called on every rank at once, after the loader's last batch and after the module's epoch-end hook:
    the step values already logged stay each rank's own, and no step pays a collective. Only values every rank
    logged are synced: one logged on some ranks alone (`if self.global_rank == 0: self.log(...)`) would leave the
    others' reductions unmatched. `sync_dist` is read when a value is logged; the results (`trainer._results`, each
    value's `meta.sync`; `valid_items`, what the loop will compute) have no public accessor. Returns what it
    changed, for `unsync` once the epoch's values are computed: Lightning refuses a value logged again with other
    settings."""
    results = trainer._results
    unsynced = {  # the values logged since the results were last reset, for the running loader (or the epoch's end)
        key: metric.meta.sync
        for key, metric in (results.valid_items() if results is not None else ())
        if metric.is_tensor
        and metric.meta.on_epoch
        and not metric.meta.is_custom_reduction
        and not metric.meta.sync.should
        and not metric.meta.sync.rank_zero_only
    }
    everywhere = set(unsynced)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        logged: list[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(logged, sorted(unsynced))
        everywhere = set.intersection(*(set(keys) for keys in logged))
    changed = [sync for key, sync in unsynced.items() if key in everywhere]
    for sync in changed:
        sync.should = True
    return changed


# -- callbacks that act after the module's own hook ------------------------------------------------------
# Lightning calls every callback's hook before the module's (`trainer/call.py`: `_call_callback_hooks`, then
# `_call_lightning_module_hook`), and nothing between the module's and what follows it: computing an evaluation's
# epoch values (`_EvaluationLoop._on_evaluation_epoch_end`), the step's end. A callback's `after_<hook>` method runs
# right after the module's `<hook>`: the module's hooks are wrapped on the instance, where Lightning looks them up.
WRAPPED = "_hydralight_wrapped_hooks"  # on the module: each wrapped hook's own instance attribute (None: none)


def call_after_module_hook(trainer: pl.Trainer, module: pl.LightningModule, hook: str) -> None:
    """From now on, right after the module's `hook`, each of the trainer's callbacks' `after_<hook>(trainer, module,
    *the hook's arguments)`, in the callbacks' order (a checkpoint saved there holds what the module's own
    `on_train_batch_end` did at that step: an EMA of its weights). Idempotent; `restore_module_hooks` undoes it."""
    wrapped = module.__dict__.setdefault(WRAPPED, {})
    if hook in wrapped:
        return
    wrapped[hook] = vars(module).get(hook)
    own = getattr(module, hook)

    @functools.wraps(own)
    def run(*args: Any, **kwargs: Any) -> Any:
        result = own(*args, **kwargs)
        for callback in trainer.callbacks:  # type: ignore[attr-defined]  # the connector's list
            if callable(after := getattr(callback, f"after_{hook}", None)):
                after(trainer, module, *args, **kwargs)
        return result

    setattr(module, hook, run)


def restore_module_hooks(module: pl.LightningModule) -> None:
    """The module's hooks as they were before `call_after_module_hook`."""
    for hook, own in module.__dict__.pop(WRAPPED, {}).items():
        if own is None:
            vars(module).pop(hook, None)
        else:
            setattr(module, hook, own)


def logged_names(trainer: pl.Trainer) -> set[str]:
    """The names of the values the running loop logged (a value logged per step and per epoch under its name and
    both forked ones; a value of one of several loaders with its `/dataloader_idx_N`, as `callback_metrics` names it):
    what validation measured, told apart from what training logged. The loop's results (`trainer._results`, and
    `_forked_name` that adds the loader's suffix) have no public accessor; `callback_metrics` mixes both."""
    results, names = trainer._results, set[str]()
    for metric in (results or {}).values():
        for on_step in (True, False):  # the plain name is the epoch's
            names.update(results._forked_name(metric, on_step))  # type: ignore[union-attr]
    return names


def unsync(changed: list[Any]) -> None:
    """The values `sync_epoch_values` changed, as they were logged."""
    for sync in changed:
        sync.should = False


# -- the loop state inside a checkpoint -------------------------------------------------------------


def _fit_state(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    return (checkpoint.get("loops") or {}).get("fit_loop")


def loader_state_saved(checkpoint: dict[str, Any]) -> bool:
    """Whether the checkpoint holds the training loader's position (a stateful loader: `state_dict` and
    `load_state_dict`); Lightning keeps it under the fit loop's `combined_loader`."""
    fit = _fit_state(checkpoint)
    return bool(fit and (fit.get("state_dict") or {}).get("combined_loader"))


def mid_epoch(checkpoint: dict[str, Any]) -> bool:
    """Whether the checkpoint was taken inside an epoch (some of its batches trained, not all)."""
    fit = _fit_state(checkpoint)
    if not fit:
        return False
    batches = fit["epoch_loop.batch_progress"]
    # `processed`: a checkpoint saved after a step and before Lightning counts it completed (every save but the
    # one at an epoch's end) has one batch more processed than completed; after an epoch's first, none completed.
    return batches["current"]["processed"] > 0 and not batches["is_last_batch"]


def record_loop_state(checkpoint: dict[str, Any], form: str, global_step: int) -> None:
    """Record in a checkpoint being written where training really stopped. Lightning marks an epoch as
    finished when `fit` stops, also in the middle of one (a step budget), and a checkpoint taken then would
    resume into the next epoch, skipping the rest of the current one.

    `boundary`: the epoch is done and the next not begun (a resumed run starts the next epoch at its first
    batch). `stopped`: as if saved right after the last optimizer step (the form periodic checkpoints have;
    a resumed run continues the same epoch with the next batch). `epoch start`: the epoch's progress
    rewound to its first batch (a loader without a position can only start the epoch over).
    """
    fit = _fit_state(checkpoint)
    if fit is None:
        return
    epochs, batches = fit["epoch_progress"], fit["epoch_loop.batch_progress"]
    if form == "boundary":
        for part in ("total", "current"):
            epochs[part].update(dict.fromkeys(("ready", "processed", "completed"), epochs[part]["started"]))
        batches["current"] = dict.fromkeys(batches["current"], 0)
        batches["is_last_batch"] = False
        checkpoint["epoch"] = epochs["current"]["started"]
    elif form == "stopped":
        for part in ("total", "current"):
            epochs[part]["processed"] = epochs[part]["completed"] = epochs[part]["started"] - 1
            batches[part]["completed"] = batches[part]["processed"] - 1
        fit["epoch_loop.state_dict"]["_batches_that_stepped"] = global_step - 1
        checkpoint["epoch"] = epochs["current"]["started"] - 1
    elif form == "epoch start":
        batches["current"] = dict.fromkeys(batches["current"], 0)
        batches["is_last_batch"] = False
        total = batches["total"]
        if total["processed"] == total["completed"] + 1:
            # Saved after a step (every save but an epoch's last): restarting, Lightning counts that batch completed
            # in the epoch (`_TrainingEpochLoop.reset`), which would then end one batch short.
            batches["current"]["completed"] = -1
    else:
        raise ValueError(f"unknown loop state form {form!r}")


# -- DDP ranks started from a saved plan --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RanksToStart:
    """What a job's other ranks are started with: the saved plan they run, the list the job waits on when it
    ends, and the ranks started early that wait to be told what to run (hydralight.rundir.launch.early_ranks)."""

    plan_file: Path
    children: list[subprocess.Popen]
    early: list[subprocess.Popen]


class JobRanksObserver(_ChildProcessObserver):
    """Lightning's watch over the ranks this process started kills them all on a rank's failure, and this process
    too: under `-m` this process is the sweep's, which died with the job (and a watch outliving its job killed the
    next one). Here the other ranks are stopped and this process ends the job itself (gloo fails its next
    collective at once); it is killed as Lightning would kill it only when still in that job after `grace_s`."""

    def __init__(self, children: list[subprocess.Popen], job_over: Callable[[], bool], grace_s: float = 60) -> None:
        super().__init__(main_pid=os.getpid(), child_processes=children)
        self.job_over, self.grace_s = job_over, grace_s

    def _terminate_all(self) -> None:
        for child in self._child_processes:
            child.send_signal(self._termination_signal)
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline:
            if self.job_over():
                return
            time.sleep(0.2)
        os.kill(self._main_pid, self._termination_signal)


class JobScriptLauncher(_SubprocessScriptLauncher):
    """Starts ranks 1..N-1 of this node as `python -m hydralight.worker <plan file>` instead of re-executing
    `sys.argv`, which under `python train.py -m ...` would replay the whole sweep in every rank. Lightning has
    no public hook for the command of its child processes: the private launcher's `_call_children_scripts`."""

    def __init__(self, *args: Any, ranks: RanksToStart, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ranks = ranks

    def launch(self, function: Callable, *args: Any, trainer: pl.Trainer | None = None, **kwargs: Any) -> Any:
        # Lightning's own `launch`, with the project's watch over the ranks instead of Lightning's.
        self.cluster_environment.validate_settings(num_devices=self.num_processes, num_nodes=self.num_nodes)
        if not self.cluster_environment.creates_processes_externally:
            self._call_children_scripts()
            procs, started = self.procs, self.ranks.children
            JobRanksObserver(procs, job_over=lambda: not any(p in started for p in procs)).start()
        _set_num_threads_if_needed(num_processes=self.num_processes)
        return function(*args, **kwargs)

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
        plan_file, waiting = self.ranks.plan_file, self.ranks.early
        early = waiting if len(waiting) == self.num_processes - 1 else []
        self.ready_dir = Path(tempfile.mkdtemp(prefix="hydralight-ranks-"))
        for local_rank in range(1, self.num_processes):
            child_env = {**os.environ, "LOCAL_RANK": str(local_rank), READY_DIR_VARIABLE: str(self.ready_dir)}
            if early:  # started while this rank prepared, its imports done: told what to run
                proc = early.pop(0)
                assert proc.stdin is not None  # started with a pipe to read this from
                proc.stdin.write(json.dumps({"env": child_env, "plan_file": str(plan_file)}) + "\n")
                proc.stdin.close()
            else:
                command = [sys.executable, "-m", "hydralight.worker", str(plan_file)]
                proc = subprocess.Popen(command, env=child_env)
            self.procs.append(proc)
        self.ranks.children.extend(self.procs)


# Where the ranks a job started mark that they reached the process group (a folder of the launching rank's).
READY_DIR_VARIABLE = "HYDRALIGHT_RANKS_READY"
GO = "go"


def _meet_started_ranks(launcher: Any, timeout_s: float) -> None:
    """On the launching rank, before the process group forms: wait until every rank it started has marked that
    it reached the group too, and refuse at once when one ended before that. torch waits for a missing rank in
    C++ for the whole timeout (30 minutes), deaf to signals, so a rank that failed while it started (its module
    not importable there, its data missing) held the job, and a sweep's next jobs, until the watch killed it."""
    if not isinstance(launcher, JobScriptLauncher) or not getattr(launcher, "procs", None):
        return
    ready_dir: Path = launcher.ready_dir
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            for local_rank, proc in enumerate(launcher.procs, start=1):
                if proc.poll() is not None and not (ready_dir / str(local_rank)).exists():
                    raise UserError(
                        f"rank {local_rank} of this job ended (exit code {proc.returncode}) before the job's ranks "
                        "met: its own lines above say why; a rank runs the same code and config as rank 0, on its "
                        "own process"
                    )
            if all((ready_dir / str(rank)).exists() for rank in range(1, len(launcher.procs) + 1)):
                (ready_dir / GO).touch()  # the ranks connect once this one's store is up: none waits out a retry
                return
            time.sleep(0.01)
    except BaseException:
        shutil.rmtree(ready_dir, ignore_errors=True)
        raise
    shutil.rmtree(ready_dir, ignore_errors=True)  # no rank came in time: the group's own wait says so


def _say_ready(timeout_s: float) -> None:
    """On a started rank: mark that it reached the process group (see `_meet_started_ranks`), then wait for the
    launching rank to form it: a rank that connects before the group's store is up retries a second later."""
    if not ((folder := os.environ.get(READY_DIR_VARIABLE)) and (local_rank := os.environ.get("LOCAL_RANK"))):
        return
    ready_dir, parent = Path(folder), os.getppid()
    with contextlib.suppress(OSError):  # the launching rank gave up waiting and removed the folder
        (ready_dir / local_rank).touch()
    deadline = time.monotonic() + timeout_s
    while ready_dir.is_dir() and not (ready_dir / GO).exists() and os.getppid() == parent:
        if time.monotonic() > deadline:
            return
        time.sleep(0.005)
    time.sleep(0.02)  # the store starts as the launching rank enters the group


def _met(launcher: Any) -> None:
    """The marks are gone once the group formed."""
    if isinstance(launcher, JobScriptLauncher) and (ready_dir := getattr(launcher, "ready_dir", None)):
        shutil.rmtree(ready_dir, ignore_errors=True)


class _PlannedRanks(ParallelStrategy):
    """A strategy whose locally started ranks run a saved plan: its private `_configure_launcher` is the only
    place its script launcher (`strategy._launcher`) can be swapped for one that runs the plan."""

    if TYPE_CHECKING:  # both strategies it is mixed into have them

        @property
        def num_processes(self) -> int: ...

        num_nodes: int

    def __init__(self, *args: Any, ranks: RanksToStart, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ranks = ranks

    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        if isinstance(self._launcher, _SubprocessScriptLauncher):
            self._launcher = JobScriptLauncher(
                self.cluster_environment, self.num_processes, self.num_nodes,
                ranks=self.ranks,
            )  # fmt: skip

    def _meet(self) -> None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return  # met for an earlier stage (fit, then test): the group is formed once
        timeout = cast(Any, self)._timeout  # the process group's, Lightning's setting
        seconds = timeout.total_seconds() if timeout is not None else 1800.0
        if self.local_rank == 0:  # the rank that started this node's others
            _meet_started_ranks(self._launcher, seconds)
        else:
            _say_ready(seconds)


class PlannedRanksDDP(_PlannedRanks, DDPStrategy):
    """DDP whose locally started ranks run a saved plan."""

    def setup_distributed(self) -> None:
        self._meet()  # DDP's process group forms here (`_init_dist_connection`)
        super().setup_distributed()
        _met(self._launcher)


class PlannedRanksModelParallel(_PlannedRanks, ModelParallelStrategy):
    """Lightning's ModelParallelStrategy (FSDP2) whose locally started ranks run a saved plan, as DDP's do."""

    def _setup_distributed(self) -> None:
        self._meet()  # the process group forms here, in this private method of Lightning's
        super()._setup_distributed()
        _met(self._launcher)


# -- ddp_spawn: what the workers counted, back in the main process ------------------------------------


class _CountsBackLauncher(_MultiProcessingLauncher):
    """ddp_spawn's launcher, also sending back to the main process what its workers' fit counted (the fit
    loop's progress: steps and epochs; the test loop's batches) and what the callbacks measured into their records
    (`into`). Lightning sends back only the weights, the best checkpoint's path and `callback_metrics`; its `get_extra_results` /
    `update_main_process_results` pair is the documented place to add more, on a private class."""

    def get_extra_results(self, trainer: pl.Trainer) -> dict[str, Any]:
        extra = super().get_extra_results(trainer)
        extra["fit_loop"] = trainer.fit_loop.state_dict()
        extra["test_batches"] = list(trainer.test_loop._max_batches)  # what a test stage ran (`num_test_batches`)
        extra["measured"] = [dict(into) if isinstance(into := getattr(c, "into", None), dict) else None
                             for c in trainer.callbacks]  # type: ignore[attr-defined]  # fmt: skip
        return extra

    def update_main_process_results(self, trainer: pl.Trainer, extra: dict[str, Any]) -> None:
        # What the workers' stage logged replaces what the main process holds from the stage before (a test
        # stage's metrics would otherwise be mixed with the fit's, as they are not in one process).
        trainer.callback_metrics.clear()
        super().update_main_process_results(trainer, extra)
        if "fit_loop" in extra:
            trainer.fit_loop.load_state_dict(extra["fit_loop"])
        if extra.get("test_batches"):
            trainer.test_loop._max_batches = extra["test_batches"]
        for callback, measured in zip(trainer.callbacks, extra.get("measured", []), strict=False):  # type: ignore[attr-defined]
            if measured:
                callback.into.update(measured)


def spawned_rank(trainer: pl.Trainer) -> bool:
    """Whether this rank was spawned by ddp_spawn's launcher (its error reaches the parent process, which says it)."""
    return isinstance(trainer.strategy.launcher, _MultiProcessingLauncher)


class CountsBackSpawnDDP(DDPStrategy):
    """`ddp_spawn` (a DDPStrategy with a spawn start method) whose main process learns what its workers counted;
    its private `_configure_launcher` is where the launcher is chosen."""

    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        launcher = self._launcher
        if type(launcher) is _MultiProcessingLauncher:
            self._launcher = _CountsBackLauncher(self, start_method=launcher._start_method)


# -- the epoch of the last step ----------------------------------------------------------------------


def epoch_of_last_step(trainer: pl.Trainer) -> int:
    """The epoch (from 0, as Lightning counts) the latest step belongs to: the last one started. The loop's
    `started` counter is not moved by the end of an epoch, as `current_epoch` (its `completed`) is."""
    # The tracker is a _StartedTracker; `_Progress` declares its base, which has no `started`.
    current = cast("_StartedTracker", trainer.fit_loop.epoch_progress.current)
    return max(0, current.started - 1)


def plateau_step_pending(trainer: pl.Trainer) -> bool:
    """Whether fit is at the end of an epoch whose plateau schedulers Lightning has not stepped yet: it steps them
    after the epoch's last validation and its `on_train_epoch_end` hooks (where checkpoints are saved), and skips
    that step when it resumes from such a checkpoint (their metric is not in it). `_num_ready_batches_reached`
    is how Lightning itself decides an epoch has ended; the epoch's progress has `processed` moved past
    `completed` only between the two."""
    loop = trainer.fit_loop
    if trainer.sanity_checking or not loop.epoch_loop._num_ready_batches_reached():
        return False
    progress = cast("_ProcessedTracker", loop.epoch_progress.current)
    return progress.processed > progress.completed or (trainer.validating and progress.processed == progress.completed)


class BestCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint, its `{epoch}` the epoch of the checkpoint's last step: the private
    `_monitor_candidates` is where the values of its file name come from (hydralight.training.epochs says why)."""

    @functools.cached_property
    def state_key(self) -> str:
        # The key Lightning's own class saves its state under (best score and path): a run saved with it
        # continues with its best checkpoint. Computed once: Lightning asks for it at every hook of every step
        # (the profiler's action name), and its settings do not change after construction.
        return super().state_key.replace(type(self).__qualname__, ModelCheckpoint.__qualname__, 1)

    def _monitor_candidates(self, trainer: pl.Trainer) -> dict[str, torch.Tensor]:
        candidates = super()._monitor_candidates(trainer)
        if "epoch" not in trainer.callback_metrics and trainer.state.fn == "fit":  # a module's own `epoch` stands
            candidates["epoch"] = torch.tensor(epoch_of_last_step(trainer))
        return candidates
