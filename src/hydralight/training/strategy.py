"""Multi-process strategies, with rank processes that run their own job's plan.

Lightning's `ddp` starts ranks 1..N-1 by re-executing `sys.argv`. Under `python train.py -m ...` that
replays the whole sweep in every rank: each child launches the sweep again and may pair with a rank of
another job. Here the extra ranks run the plan that rank 0 saved in the job's own directory, so a job's
ranks always run that job and nothing else.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from pytorch_lightning.strategies import ParallelStrategy, Strategy
from pytorch_lightning.trainer.states import TrainerFn
from pytorch_lightning.utilities.model_helpers import is_overridden
from torch import nn

from hydralight.config.plan import RunPlan
from hydralight.errors import UserError
from hydralight.lightning_internals import CountsBackSpawnDDP, PlannedRanksDDP, PlannedRanksModelParallel, RanksToStart
from hydralight.rundir.launch import EARLY_RANKS, LAUNCHER_PID

log = logging.getLogger(__name__)

# Rank processes this process started for the current job, waited for when the job ends.
_children: list[subprocess.Popen] = []
# Ranks started while this process prepared the job (hydralight.rundir.launch.early_ranks).
_early = EARLY_RANKS
# How long a stopping launcher waits for the ranks it started before it kills them.
STOP_GRACE_S = 10.0


class EvaluatesRankZerosBuffers(ParallelStrategy):
    """Before a validation, test or prediction, every rank takes rank 0's buffers (BatchNorm's running statistics),
    which the checkpoint holds: the scores are the saved model's, and the ranks agree. DDP gives every rank rank 0's
    before a forward only when its last one synced gradients: not under manual optimization, whose steps each left
    each rank's own; FSDP never does."""

    def _rank_zero_buffers(self) -> None:
        module = self.lightning_module
        if module is None or self.world_size == 1:
            return
        for buffer in module.buffers():
            if type(buffer) is torch.Tensor:  # a sharded one (a DTensor) is left as it is
                sent = buffer.data.contiguous()  # what a collective takes; a view of other strides is copied back
                torch.distributed.broadcast(sent, src=0)
                if sent.data_ptr() != buffer.data.data_ptr():
                    buffer.data.copy_(sent)

    def on_validation_start(self) -> None:
        super().on_validation_start()
        self._rank_zero_buffers()

    def on_test_start(self) -> None:
        super().on_test_start()
        self._rank_zero_buffers()

    def on_predict_start(self) -> None:
        super().on_predict_start()
        self._rank_zero_buffers()


class JobDDPStrategy(EvaluatesRankZerosBuffers, PlannedRanksDDP):
    """DDP whose locally started ranks run the saved plan instead of replaying the command line."""

    def __init__(self, *args: Any, plan_file: Path, **kwargs: Any) -> None:
        super().__init__(*args, ranks=RanksToStart(plan_file, _children, _early), **kwargs)


class SpawnDDPStrategy(EvaluatesRankZerosBuffers, CountsBackSpawnDDP):
    """`ddp_spawn` whose spawned workers close their process group before they exit, and whose main process
    records the steps, epochs and throughput they measured.

    A worker that exits with a live gloo group can abort in the group's threads ("terminate called
    without an active exception"), failing a run that had finished.
    """

    def teardown(self) -> None:
        super().teardown()
        import torch.distributed as dist

        # Only the spawned workers hold a group; each stage (fit, test) spawns new ones.
        if dist.is_initialized():
            dist.destroy_process_group()


class JobFSDPStrategy(EvaluatesRankZerosBuffers, PlannedRanksModelParallel):
    """Fully sharded data parallel (torch's FSDP2 `fully_shard` under Lightning's ModelParallelStrategy), its
    locally started ranks running the saved plan like `JobDDPStrategy`'s.

    Every rank is one data-parallel replica of a 1-D mesh; each keeps 1/N of every sharded unit's parameters,
    gradients and optimizer state. A module with its own `configure_model` shards itself; any other is given
    one that shards the `shard` submodules (each child of a ModuleList/Sequential, or the module itself), then
    the module as the root, which takes every parameter left.
    """

    def __init__(
        self, *, plan_file: Path, world_size: int, shard: list[str], sharded_checkpoint: bool,
        mixed_precision: bool = False, **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(
            data_parallel_size=world_size, tensor_parallel_size=1, save_distributed_checkpoint=sharded_checkpoint,
            ranks=RanksToStart(plan_file, _children, _early), **kwargs,
        )  # fmt: skip
        self.shard, self.mixed_precision = list(shard), mixed_precision
        self.measured = False

    def setup_environment(self) -> None:
        super().setup_environment()  # the process group and the mesh, before Lightning calls configure_model
        module = self.lightning_module
        assert module is not None  # connected by the Trainer before it sets up the environment
        if getattr(module, "_hydralight_shards", False):
            return  # set up for an earlier stage (fit, then test)
        own = module.configure_model if is_overridden("configure_model", module) else None
        if own is None:
            self._check_units(module)
        # The public hook Lightning calls to shard a module, per instance: a module of any class trains. A module
        # with a configure_model of its own runs it first: one that shards itself is left as it is; one that only
        # builds its layers there (as Lightning's docs show) has them made equal on every rank, then sharded.
        target, mesh = module, self.device_mesh["data_parallel"]

        name = type(module).__name__
        units = ", ".join(f"{unit}.*" for unit in self.shard) or "each child with parameters"
        planned = f"strategy.shard: {units}, then the root {name}"

        def configure_model() -> None:
            from torch.distributed.fsdp import FSDPModule

            if isinstance(target, FSDPModule):
                return  # sharded for an earlier stage
            how = planned
            if own is not None:
                own()
                if isinstance(target, FSDPModule):
                    self._say(f"{name}.configure_model shards the module (strategy.shard is not read)")
                    return
                self._check_units(target)
                for tensor in [*target.parameters(), *target.buffers()]:  # layers built on each rank: rank 0's
                    torch.distributed.broadcast(tensor.data, src=0)
                how = f"{name}.configure_model builds its layers, then {planned}"
            shard_module(target, self.shard, mesh, self.mixed_precision)
            self._say(how)

        setattr(module, "configure_model", configure_model)  # noqa: B010  # this instance's, not its class's
        setattr(module, "_hydralight_shards", True)  # noqa: B010  # a mark on the instance, not an attribute of its class

    def _say(self, how: str) -> None:
        if self.global_rank == 0:
            log.info(f"fsdp over {self.world_size} processes: {how}")

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """Lightning's loading, without the optimizers where they are not needed (testing, predicting) or where
        Lightning cannot read them back: a stateless optimizer's state (plain SGD) fails its re-keying of a full
        checkpoint; its hyperparameters (its param_groups) are all it has, and are put back here."""
        module = self.lightning_module
        fitting = module is not None and module.trainer.state.fn == TrainerFn.FITTING
        optimizers = self.optimizers
        if fitting:
            try:
                return super().load_checkpoint(checkpoint_path, weights_only)
            except IndexError:  # `_rekey_optimizer_state_if_needed` of an optimizer that has no state
                pass
        self.optimizers = []
        try:
            checkpoint = super().load_checkpoint(checkpoint_path, weights_only)
        finally:
            self.optimizers = optimizers
        if fitting:
            for optimizer, saved in zip(optimizers, checkpoint.get("optimizer_states", []), strict=False):
                if saved.get("state"):
                    raise UserError(f"{checkpoint_path}: its optimizer state cannot be loaded under strategy=fsdp")
                for group, saved_group in zip(optimizer.param_groups, saved.get("param_groups", []), strict=False):
                    group.update({k: v for k, v in saved_group.items() if k != "params"})
        return checkpoint

    def _check_units(self, module: nn.Module) -> None:
        try:
            shard_units(module, self.shard)
        except UserError:
            if self.global_rank == 0:
                raise
            raise SystemExit(2) from None  # every rank finds the same names wrong: rank 0 says it, once

    def optimizer_step(self, *args: Any, **kwargs: Any) -> Any:
        out = super().optimizer_step(*args, **kwargs)
        if not self.measured:  # after the first step, when the optimizer has made its state
            self.measured = True
            self._log_state_per_device()
        return out

    def _log_state_per_device(self) -> None:
        """Bytes of parameters + optimizer state on each rank, beside the full copy DDP keeps on every rank."""
        module = self.lightning_module
        assert module is not None  # a step was taken
        local, full = state_bytes(module, self.optimizers)
        each = [0] * self.world_size
        torch.distributed.all_gather_object(each, local)
        if self.global_rank == 0:
            ranks = ", ".join(f"{b / 2**20:.2f} MB on rank {r}" for r, b in enumerate(each))
            log.info(
                f"fsdp: parameters + optimizer state per device: {ranks}; "
                f"a full copy, what DDP keeps on each device: {full / 2**20:.2f} MB"
            )
        setattr(module, "_hydralight_state_bytes", {"ranks": each, "full": full})  # noqa: B010  # read by tests


def shard_module(module: nn.Module, names: list[str], mesh: Any, mixed_precision: bool) -> None:
    """Shard each submodule `names` lists (each child of a ModuleList/Sequential, else the module itself),
    then `module` as the root, over the 1-D `mesh`; a module sharded already stays as it is (Lightning calls
    `configure_model` for every stage)."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    if isinstance(module, FSDPModule):
        return
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed_precision else None
    options: dict[str, Any] = {"mesh": mesh, **({"mp_policy": policy} if policy is not None else {})}
    # FSDP flattens parameters in their storage order: weights kept channels_last (a module's memory-format
    # choice) are refused by fully_shard; the same values in the default layout shard.
    for parameter in module.parameters():
        if not parameter.is_contiguous():
            parameter.data = parameter.data.contiguous()
    for unit in shard_units(module, names):
        fully_shard(unit, **options)
    fully_shard(module, **options)


def shard_units(module: nn.Module, names: list[str]) -> list[nn.Module]:
    """The submodules `names` lists, each child of a ModuleList/Sequential or else the module itself, that have
    parameters (a unit without any has nothing to shard). No names: each child of the module that has any, so
    that a step which calls its layers directly (`self.layers(x)`, not `self(x)`) still gathers their parameters."""
    if not names:
        return [child for child in module.children() if any(True for _ in child.parameters())]
    units = []
    for name in names:
        try:
            part = module.get_submodule(name)
        except AttributeError:
            children = ", ".join(n for n, _ in module.named_children())
            raise UserError(
                f"strategy.shard={name} is no submodule of {type(module).__name__}; name one by its dotted path "
                f"(its children: {children})"
            ) from None
        for unit in list(part.children()) if isinstance(part, nn.ModuleList | nn.Sequential) else [part]:
            if any(True for _ in unit.parameters()):
                units.append(unit)
    return units


def state_bytes(module: nn.Module, optimizers: list[torch.optim.Optimizer]) -> tuple[int, int]:
    """(bytes this rank holds, bytes of the whole) of the module's parameters and the optimizers' state: a
    sharded tensor (DTensor) counts its local shard and its global size."""
    from torch.distributed.tensor import DTensor

    def sizes(tensor: torch.Tensor) -> tuple[int, int]:
        whole = tensor.numel() * tensor.element_size()
        if isinstance(tensor, DTensor):
            shard = tensor.to_local()
            return shard.numel() * shard.element_size(), whole
        return whole, whole

    tensors: list[torch.Tensor] = list(module.parameters())
    tensors += [v for opt in optimizers for state in opt.state.values() for v in state.values() if torch.is_tensor(v)]
    counted = [sizes(t) for t in tensors if t.dim() > 0]  # Adam's step counters are scalars, not model state
    return sum(local for local, _ in counted), sum(whole for _, whole in counted)


def build_strategy(plan: RunPlan, plan_file: Path) -> str | Strategy:
    """The Lightning strategy for the plan; `plan_file` is the job's saved plan (what extra ranks run)."""
    options = plan.strategy_kwargs()
    if options is None:
        return "auto"
    if plan.framework.strategy == "ddp_spawn":
        return SpawnDDPStrategy(start_method="spawn", **options)
    if plan.framework.strategy == "fsdp":
        mixed = plan.framework.precision == "bf16-mixed"
        return JobFSDPStrategy(
            plan_file=plan_file, world_size=plan.hardware.world_size, mixed_precision=mixed, **options
        )
    return JobDDPStrategy(plan_file=plan_file, **options)


class RankFailed(RuntimeError):
    """Another rank of the job failed first; this rank's own error (a broken collective) followed from it."""


@contextlib.contextmanager
def blamed_on_a_failed_rank(wait_s: float = 2.0) -> Iterator[None]:
    """A job that fails after one of the ranks this process started did says so: its record names that rank,
    whose traceback is on the console, not the broken connection this rank then saw."""
    try:
        yield
    except Exception as err:
        if isinstance(err, UserError) or not _children:
            raise
        deadline = time.monotonic() + wait_s  # the rank that failed may still be exiting
        while not (
            failed := [(rank, code) for rank, c in enumerate(_children, 1) if (code := c.poll()) not in (None, 0)]
        ):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
        rank, code = failed[0]
        said = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise RankFailed(
            f"rank {rank} on this node failed first (exit code {code}; its traceback is above), then rank 0: {said}"
        ) from err


@contextlib.contextmanager
def job_scope(child_timeout_s: float = 120) -> Iterator[None]:
    """Leave this process as the job found it, so the next job of a sweep starts clean; and tie the job's
    ranks together while they start: none outlives the rank that launched it.

    A DDP job sets MASTER_PORT, LOCAL_RANK, WORLD_SIZE... in os.environ and opens a process group;
    left in place, the next job would believe it was started by an external launcher and spawn nobody.
    """
    import torch

    saved, threads = dict(os.environ), torch.get_num_threads()
    launcher = os.environ.get(LAUNCHER_PID)
    if launcher is not None and int(launcher) != os.getpid():
        exit_when_gone(int(launcher))  # a rank this job's launcher started
        restore_signals = None
    else:
        os.environ[LAUNCHER_PID] = str(os.getpid())
        restore_signals = _forward_stop_signals()
    failed = False
    try:
        yield
    except Exception:
        failed = True  # the others may wait for it in a collective until their timeout: they are stopped now
        raise
    finally:
        import torch.distributed as dist

        if restore_signals is not None:
            restore_signals()
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        os.environ.clear()
        os.environ.update(saved)
        torch.set_num_threads(threads)  # a DDP job's ranks share the cores: the next job gets them all back
        if failed:
            stop_children(signal.SIGTERM, STOP_GRACE_S)
        while _children:
            child = _children.pop()
            try:
                child.wait(timeout=child_timeout_s)
            except subprocess.TimeoutExpired:
                child.kill()


def _forward_stop_signals() -> Any:
    """SIGTERM and SIGINT reach the ranks this process started before they reach it; returns what restores the
    handlers found.

    A rank still importing, or waiting at the process-group rendezvous for a launcher that is gone, would
    otherwise go on alone (for the rendezvous timeout, 30 minutes by default). The ranks get SIGTERM whatever
    arrived here: until they train they have no handler of their own, and the default action stops them even
    inside the rendezvous. Once training, the Preemption callback owns these signals and stops every rank at a
    step boundary; this handler is then not the one installed, and does nothing.

    A Python handler runs only when the main thread runs Python, and this one waits in the rendezvous for the
    ranks it started (while they import torch, seconds). So the signal also wakes a thread (signal.set_wakeup_fd),
    which stops the ranks at once and, if the main thread is still stuck, ends this process."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None  # only the main thread may set handlers
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    lock, handled = threading.Lock(), threading.Event()

    def stop_once() -> None:
        with lock:
            if not getattr(stop_once, "done", False):
                stop_once.done = True  # type: ignore[attr-defined]
                stop_children(signal.SIGTERM, STOP_GRACE_S)

    def forward(signum: int, frame: FrameType | None) -> None:
        handled.set()
        stop_once()
        then = previous[signal.Signals(signum)]
        if callable(then):
            then(signum, frame)
        elif then == signal.SIG_DFL:  # end as the signal would have ended this process
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    for signum in previous:
        signal.signal(signum, forward)
    woken, wake = os.pipe()
    os.set_blocking(wake, False)
    earlier_wake = signal.set_wakeup_fd(wake, warn_on_full_buffer=False)
    if earlier_wake != -1:  # someone else listens (an event loop): leave it to them, the handler still forwards
        signal.set_wakeup_fd(earlier_wake)
        os.close(woken)
        os.close(wake)
        woken = wake = -1

    def watch() -> None:
        with os.fdopen(woken, "rb", buffering=0) as signals:
            while received := signals.read(1):
                signum = received[0]
                if signal.getsignal(signum) is not forward:
                    continue  # another owner now (Lightning's, the Preemption callback's)
                stop_once()
                if not handled.wait(timeout=2.0):
                    print(f"stopped by {signal.Signals(signum).name} while starting", file=sys.stderr, flush=True)
                    os._exit(128 + signum)

    if woken != -1:
        threading.Thread(target=watch, daemon=True, name="stop-signal-watch").start()

    def restore() -> None:
        for signum, handler in previous.items():
            if signal.getsignal(signum) is forward:
                signal.signal(signum, handler)
        if wake != -1:
            signal.set_wakeup_fd(-1)
            os.close(wake)  # the watcher reads the end of the pipe and stops

    return restore


def stop_children(signum: int, grace_s: float) -> None:
    """Send `signum` to the ranks this process started that still run, wait up to `grace_s` for them, kill the rest."""
    running = [child for child in _children if child.poll() is None]
    for child in running:
        child.send_signal(signum)
    deadline = time.monotonic() + grace_s
    for child in running:
        try:
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()


def exit_when_gone(pid: int) -> None:
    """End this process as soon as process `pid` (the rank that started it) has ended, whatever this one is
    doing: importing, building, or blocked at the rendezvous (a watcher thread, which runs while torch waits).
    Normally the launcher outlives its ranks: it waits for them when the job ends."""

    def gone() -> None:
        print(
            f"error: the rank that started this one (pid {pid}) has ended; rank {os.environ.get('LOCAL_RANK', '?')} "
            "stops too",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)

    try:
        handle = os.pidfd_open(pid)  # Linux: readable once the process has ended, a zombie included
    except ProcessLookupError:
        gone()
    except (AttributeError, OSError):  # no pidfd here: look every second
        threading.Thread(target=_poll_until_gone, args=(pid, gone), daemon=True, name="launcher-watch").start()
        return

    def watch() -> None:
        select.select([handle], [], [])
        gone()

    threading.Thread(target=watch, daemon=True, name="launcher-watch").start()


def _poll_until_gone(pid: int, gone: Any) -> None:
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            gone()
        except PermissionError:
            pass  # alive, another user's: cannot be ours, but it is there
        time.sleep(1.0)
