"""Sweeps on SLURM (and locally) through hydra-submitit-launcher, sized by the resource plan.

What the stock launcher lacks, and this adds:
- resources per job from that job's own plan (nodes, tasks per node = devices, GPUs, CPUs, memory),
  so `hardware=8gpu` cannot ask SLURM for 4 tasks, and a sweep over hardware sizes each job right;
- job ids and output dirs printed at submission; `dry_run=true` writes the sbatch scripts only;
- sbatch's refusals (unknown partition, too many GPUs) as one line and exit code 2.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, filter_overrides, run_job, setup_globals
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf, LocalQueueConf, SlurmQueueConf
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from hydralight.errors import UserError, exit_on_user_error
from hydralight.launch.sealed import Sealed, SealedJob, share_secrets
from hydralight.rundir.layout import RunDir, SweepDir, history_column
from hydralight.rundir.outcome import REFUSED_HERE, record_submitted
from hydralight.rundir.record import discard_refused_sweep, now, read_json, write_json
from hydralight.rundir.redaction import redact, redact_sweep_record, secret_values

log = logging.getLogger(__name__)

# Launcher keys that the plan decides; set through the hardware group instead.
RESOURCE_KEYS = ("nodes", "tasks_per_node", "gpus_per_node", "cpus_per_task", "mem_gb")
# How often a waiting sweep looks at its jobs, and says where they stand when none changed state.
POLL_S = 2.0
HEARTBEAT_S = 30.0
# The attribute of a job's result (a JobReturn) that carries why the job was refused, back to the sweep.
REFUSED_ATTR = "hydralight_refused"
# SLURM states of a job that is not over. A requeued job passes through them while the accounting submitit reads
# already holds its ended attempt (FAILED, CANCELLED), which submitit then takes as the job's end for good.
LIVE_STATES = frozenset(
    [
        "PENDING",
        "RUNNING",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "CONFIGURING",
        "COMPLETING",
        "SUSPENDED",
        "RESIZING",
        "SIGNALING",
    ]
)
# hydra-submitit-launcher's launchers as it ships them (`hydra/launcher=submitit_slurm`, `submitit_local`),
# and this project's that extend them.
STOCK_LAUNCHERS = {
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher": "slurm",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher": "local",
}


def check_launcher(config: DictConfig) -> None:
    """A sweep under a stock submitit launcher is refused before it submits: those ask SLURM for no job's devices,
    CPUs or memory (a `hardware=4gpu` job gets no GPU), and run `plan=true`'s jobs instead of printing them."""
    target = OmegaConf.select(config, "hydra.launcher._target_", default=None)
    if (ours := STOCK_LAUNCHERS.get(str(target))) is not None:
        choice = OmegaConf.select(config, "hydra.runtime.choices.hydra/launcher", default=None) or target
        raise UserError(
            f"hydra/launcher={choice} is hydra-submitit-launcher's launcher as it ships, which sizes no job from its "
            f"plan (no devices, CPUs or memory asked for) and would run plan=true's jobs: use hydra/launcher={ours}, "
            "the same launcher with each job sized by its plan"
            + (" (partition, account, time limit: cluster.*)" if ours == "slurm" else "")
        )


@dataclass
class HydralightSlurmConf(SlurmQueueConf):
    _target_: str = "hydra_plugins.hydralight_launchers.PlannedSlurmLauncher"
    # Write the sbatch script of each job next to the sweep and submit nothing.
    dry_run: bool = False
    # Options of the srun that starts the ranks. A rank that dies ends the whole job at once, instead of
    # leaving the others waiting in a collective until its timeout (NCCL, a hung node).
    srun_args: list[str] = field(default_factory=lambda: ["--kill-on-bad-exit=1"])


@dataclass
class HydralightLocalConf(LocalQueueConf):
    _target_: str = "hydra_plugins.hydralight_launchers.PlannedLocalLauncher"
    dry_run: bool = False


def visible_devices() -> list[int]:
    """The GPUs this process may give its local jobs: those CUDA_VISIBLE_DEVICES names (numbers only), else
    all the machine has."""
    from hydralight.training.machine import detect

    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None and all(part.strip().isdigit() for part in given.split(",") if part.strip()):
        return [int(part) for part in given.split(",") if part.strip()]
    return list(range(detect().gpus))


def device_assignment(wanted: list[int], devices: list[int]) -> list[list[int]]:
    """The GPUs of each of several jobs that run side by side, in turn from `devices`: parallel 1-GPU jobs on a
    4-GPU machine get GPUs 0, 1, 2, 3 (submitit's local executor gives each the first ones, all GPU 0); more
    jobs than GPUs share them round the ring."""
    found: list[list[int]] = []
    start = 0
    for count in wanted:
        if not devices or count == 0:
            found.append([])
            continue
        found.append([devices[(start + k) % len(devices)] for k in range(min(count, len(devices)))])
        start = (start + count) % len(devices)
    return found


def job_progress(job_dir: Path, metric: str | None = None) -> tuple[int | None, float | None]:
    """The step of a job's last history row and the last value of `metric` it logged (its metrics.csv, read
    from the end); None for what it has not logged yet."""
    history = RunDir(job_dir).history
    try:
        with history.open("rb") as f:
            f.seek(max(0, history.stat().st_size - 16384))
            lines = f.read().decode(errors="replace").splitlines()
            f.seek(0)
            header = f.readline().decode(errors="replace").strip().split(",")
    except OSError:
        return None, None
    if "step" not in header or len(lines) < 2:
        return None, None
    rows = [cells for line in lines[1:] if len(cells := line.split(",")) == len(header)]
    step_cell = rows[-1][header.index("step")] if rows else ""
    value = None
    if metric is not None and (name := history_column(header, metric)) is not None:
        column = header.index(name)
        filled = [cells[column] for cells in rows if cells[column]]
        with contextlib.suppress(ValueError, IndexError):
            value = float(filled[-1])
    return (int(step_cell) if step_cell.isdigit() else None), value


def _standing(step: int | None, value: float | None, metric: str | None) -> str:
    """`, at step N` (and `, val/acc=0.97` once it validated), or nothing for what is not known yet."""
    said = f", at step {step}" if step is not None else ""
    return said + (f", {metric}={value:.4g}" if value is not None and metric else "")


def _reached(job_dir: Path, metric: str | None = None) -> str:
    """How far a job got, from its history (`_standing`)."""
    return _standing(*job_progress(job_dir, metric), metric)


class _Board:
    """Where a waiting sweep says how its jobs stand: on a terminal a live table (rich), redrawn as they change;
    elsewhere (a log file, CI) a line per change of a job's state or last validation value."""

    def __init__(self, names: list[str], metric: str | None) -> None:
        import sys

        self.names, self.metric = names, metric
        self.rows: dict[int, tuple[str, str, int | None, float | None]] = {}
        self.live = None
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.live import Live

            self.live = Live(self._table(), console=Console(stderr=True), refresh_per_second=2, transient=False)
            self.live.start()

    def _table(self) -> Any:
        from rich.table import Table

        table = Table(title="sweep jobs", title_justify="left")
        for column in ("job", "id", "state", "step", self.metric or "objective"):
            table.add_column(column)
        for i, (job_id, state, step, value) in sorted(self.rows.items()):
            shown = "-" if value is None else f"{value:.4g}"
            table.add_row(self.names[i], job_id, state, "-" if step is None else str(step), shown)
        return table

    def update(self, i: int, job_id: str, state: str, step: int | None, value: float | None) -> bool:
        """Record job i's standing; True when it changed (and was said)."""
        before = self.rows.get(i)
        self.rows[i] = (job_id, state, step, value)
        if self.live is not None:
            self.live.update(self._table())
            return before is None or before[1] != state or before[3] != value
        if before is not None and (before[1], before[3]) == (state, value):
            return False
        log.info(f"{self.names[i]} ({job_id}): {state}{_standing(step, value, self.metric)}")
        return True

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()


def _remove_written(folder: Path, before: set[Path] | None) -> None:
    """What a refused submission wrote in `folder` (its jobs' pickles and scripts): removed, and `folder`
    itself when it was not there before (`before` None); what was there before stays."""
    if not folder.is_dir():
        return
    for path in sorted(set(folder.rglob("*")) - (before or set()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
    if before is None:
        with contextlib.suppress(OSError):
            folder.rmdir()


class JobFailed(Exception):
    """Raised at the end of a job's process that was refused or crashed (the job itself said why)."""


def _mark_ended(run_dir: RunDir, reason: str) -> None:
    """A job's manifest that still says running once its job is gone: failed, with why."""
    manifest = read_json(run_dir.manifest)
    if manifest is not None and manifest.get("status") == "running":
        write_json(run_dir.manifest, {**manifest, "status": "failed", "error": reason, "finished_at": now()})


def still_queued(sweep_dir: Path, executor: str, numbers: set[int]) -> list[tuple[int, str]]:
    """The jobs among `numbers` that an earlier submission of this sweep (its jobs.json) left queued or running:
    (number, job id). SLURM's are read from squeue; the local executor's ids are the jobs' process ids here."""
    recorded = read_json(SweepDir(sweep_dir).jobs) or {}
    ids = {
        int(n): str(entry.get("job_id"))
        for n, entry in recorded.items()
        if n.isdigit() and int(n) in numbers and isinstance(entry, dict) and entry.get("job_id")
    }
    if not ids:
        return []
    if executor == "slurm":
        try:
            listed = subprocess.run(["squeue", "-h", "-r", "-o", "%i"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return []  # no answer from the scheduler: sbatch says what is wrong next
        live = set(listed.stdout.split()) if listed.returncode == 0 else set()
        return [(n, job_id) for n, job_id in sorted(ids.items()) if job_id in live]
    return [(n, job_id) for n, job_id in sorted(ids.items()) if job_id.isdigit() and _alive(int(job_id))]


def live_state(job_id: str) -> str | None:
    """The state SLURM's controller holds for a job that is not over (queued again, running), else None."""
    try:
        listed = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None  # no answer: the accounting's word stands
    states = listed.stdout.split() if listed.returncode == 0 else []
    return states[0] if states and states[0] in LIVE_STATES else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid != os.getpid()


def job_resources(cfg: DictConfig, executor: str) -> dict[str, Any]:
    """Launcher resources of one job, from that job's own plan: for SLURM planned from the profile alone,
    for local jobs on this machine (one process per job; Lightning starts the other ranks itself)."""
    from hydralight.config.resolve import resources, resources_elsewhere
    from hydralight.training.machine import detect

    if executor == "slurm":
        return resources_elsewhere(cfg)[0].slurm_resources()
    hardware = resources(cfg, detect())[0]
    if hardware.num_nodes > 1:
        raise UserError(
            f"hardware.num_nodes={hardware.num_nodes} cannot run with hydra/launcher=local; use hydra/launcher=slurm"
        )
    return hardware.slurm_resources(one_task=True)


def _say_if_crowded(groups: Mapping[tuple[tuple[str, Any], ...], list[int]]) -> None:
    """Local jobs run side by side: when together they ask for more CPUs than this machine has, each plan's
    `cpus each` is a share it will not get (its timings neither): said in one line."""
    from hydralight.training.machine import detect

    asked = sum(int(dict(request).get("cpus_per_task") or 1) * len(indices) for request, indices in groups.items())
    jobs, cores = sum(len(indices) for indices in groups.values()), detect().cpu_cores
    if jobs > 1 and asked > cores:
        log.warning(
            f"note: the {jobs} local jobs run side by side and ask for {asked} CPUs together; this machine has "
            f"{cores}: each runs on a share of them (slower, its throughput not comparable); to run them one after "
            "another, leave hydra/launcher=local out"
        )


def already_finished(cfg: DictConfig, number: int) -> str | None:
    """The result line of job `number` when its dir holds this very job, finished (the sweep run again): its
    own process would only say so. None when it is to run (or its plan says why it cannot, as its job will)."""
    from hydra.core.hydra_config import HydraConfig

    from hydralight.config.plan import Machine
    from hydralight.config.resolve import JobInfo, resolve
    from hydralight.training.records import result_line

    cfg = cfg.copy()
    with open_dict(cfg.hydra):
        cfg.hydra.job.num = number
    job_dir = Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
    if not RunDir(job_dir).results.is_file():
        return None
    with open_dict(cfg.hydra):  # as Hydra's run_job sets it for the job (its paths.* read it)
        cfg.hydra.runtime.output_dir = str(job_dir.resolve())
    choices = {k: v for k, v in cfg.hydra.runtime.choices.items() if isinstance(v, str)}
    job = JobInfo(str(job_dir), str(cfg.hydra.sweep.dir), overrides=list(cfg.hydra.overrides.task), choices=choices)
    task = cfg.copy()
    with open_dict(task):
        del task["hydra"]
    sweeps = HydraConfig.instance().cfg
    HydraConfig.instance().set_config(cfg)
    try:
        finished = resolve(task, Machine(), job).resume.finished
    except Exception:  # in doubt the job runs, and says itself what stops it
        return None
    finally:
        HydraConfig.instance().cfg = sweeps
    return None if finished is None else result_line(finished, str(job_dir))


def check_time_limit(minutes: Any, warning_s: Any) -> None:
    """A job's time limit SLURM can hold, with room before its warning signal (`signal_delay_s` ahead of the
    limit): `--time=0` is no limit to SLURM and a negative one years; a warning at the start requeues forever."""
    if isinstance(minutes, bool) or not isinstance(minutes, int) or minutes < 1:
        raise UserError(f"cluster.timeout_min={minutes} is no time limit: give whole minutes >= 1")
    if warning_s is None:
        return
    if isinstance(warning_s, bool) or not isinstance(warning_s, int) or warning_s < 0:
        raise UserError(f"cluster.signal_delay_s={warning_s} must be whole seconds >= 0")
    if minutes * 60 <= warning_s:
        raise UserError(
            f"cluster.timeout_min={minutes} ends before its warning, sent cluster.signal_delay_s={warning_s} s ahead: "
            f"every job would be stopped as it starts; give cluster.timeout_min above {warning_s // 60} or a smaller "
            "cluster.signal_delay_s"
        )


def script_writer(folder: str, executor: str, max_num_timeout: int) -> Any:
    """submitit's executor of that kind, made to write job scripts only (the SLURM one would otherwise look
    for `srun` on this host)."""
    import submitit

    if executor != "slurm":
        return submitit.LocalExecutor(folder)

    class ScriptWriter(submitit.SlurmExecutor):
        @classmethod
        def affinity(cls) -> int:
            return 1

    return ScriptWriter(folder, max_num_timeout=max_num_timeout)


def sbatch_refusal(err: BaseException) -> str:
    """The `sbatch: error: ...` lines of a failed submission, joined into one line."""
    text = " ".join(str(a) for a in getattr(err, "args", ())) + " " + str(getattr(err, "output", "") or "")
    found = re.findall(r"sbatch: error: ([^\n\\]+)", text)
    return "; ".join(dict.fromkeys(m.strip() for m in found)) or str(err).strip().splitlines()[-1]


class PlannedLauncherMixin:
    """Mixed into the submitit launchers; `_EXECUTOR` is `slurm` or `local`."""

    _EXECUTOR: str
    params: dict[str, Any]
    config: DictConfig | None
    hydra_context: Any
    task_function: Any

    def __call__(
        self,
        sweep_overrides: list[str],
        job_dir_key: str,
        job_num: int,
        job_id: str,
        singleton_state: dict[type, Singleton],
        sweep_config: DictConfig | None = None,
    ) -> JobReturn:
        """One job, in its own process: its config as the sweep composed it when it submitted the job."""
        import submitit

        Singleton.set_state(singleton_state)
        setup_globals()
        if sweep_config is None:
            sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, sweep_overrides)
        else:  # a copy: run_job leaves the config read-only, and a requeued job is resubmitted with these arguments
            sweep_config = copy.deepcopy(sweep_config)
        # Ranks other than 0 write no Hydra record or log into the job dir (conf/hydra's resolvers say so).
        with read_write(sweep_config.hydra), open_dict(sweep_config.hydra):
            sweep_config.hydra.job.id = submitit.JobEnvironment().job_id
            sweep_config.hydra.job.num = job_num
        returned = run_job(
            hydra_context=self.hydra_context,
            task_function=self.task_function,
            config=sweep_config,
            job_dir_key=job_dir_key,
            job_subdir_key="hydra.sweep.subdir",
        )
        # A job refused here keeps its dir's earlier results, whose manifest says finished: the reason travels
        # back with its result, for the sweep's summary to count it refused, not done.
        refusal = REFUSED_HERE.get(Path(str(sweep_config.hydra.runtime.output_dir)).name)
        if refusal is not None:
            setattr(returned, REFUSED_ATTR, refusal)  # noqa: B010  # JobReturn has no field of its own for it
        # A job refused or crashed ends its process with an error, so the scheduler's accounting (sacct, mail on
        # failure) says FAILED; its manifest says why.
        manifest = read_json(RunDir(Path(str(sweep_config.hydra.runtime.output_dir))).manifest) or {}
        if manifest.get("status") == "failed":
            raise JobFailed(manifest.get("error") or "failed")
        return returned

    @exit_on_user_error
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit

        assert self.config is not None
        params = dict(self.params)
        if self._EXECUTOR == "slurm" and not params.get("setup"):
            # A list-valued interpolation cannot sit in the launcher's typed config; read it here.
            params["setup"] = list(self.config.get("cluster", {}).get("setup") or []) or None
        try:
            check_time_limit(params.get("timeout_min"), params.get("signal_delay_s"))
        except UserError:
            discard_refused_sweep(self.config)
            raise
        dry_run = params.pop("dry_run", False)
        folder = params.pop("submitit_folder")
        max_num_timeout = params.pop("max_num_timeout", 0)
        init = {f"{self._EXECUTOR}_max_num_timeout": max_num_timeout}
        generic = set(OmegaConf.structured(BaseQueueConf).keys())
        base = {k if k in generic else f"{self._EXECUTOR}_{k}": v for k, v in params.items() if k not in RESOURCE_KEYS}

        # Group jobs by what they ask for: one array submission per distinct request.
        groups: dict[tuple[tuple[str, Any], ...], list[int]] = defaultdict(list)
        arguments = []
        planned_only: list[DictConfig] = []
        for i, overrides in enumerate(job_overrides):
            idx = initial_job_idx + i
            job_cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            planned_only.append(job_cfg)
            try:
                resources = job_resources(job_cfg, self._EXECUTOR)
                self._check_no_resource_overrides(params, resources)
            except UserError as err:
                discard_refused_sweep(self.config)
                prefix = (
                    f"sweep job {idx} ({' '.join(filter_overrides(overrides))}): " if len(job_overrides) > 1 else ""
                )
                raise UserError(prefix + str(err)) from None
            # A job finished by an earlier run of this very sweep is not submitted again.
            finished = None if job_cfg.get("plan") else already_finished(job_cfg, idx)
            if finished is None:
                groups[tuple(sorted(resources.items()))].append(i)
            state = Singleton.get_state()
            arguments.append((list(overrides), "hydra.sweep.dir", idx, f"job_id_for_{idx}", state, job_cfg))
            done = f": already finished: {finished}" if finished is not None else ""
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}{done}")

        # A plan and a dry run only print or write: they need no SLURM commands on this host.
        if all(bool(cfg.get("plan")) for cfg in planned_only):
            return self._plans_here(planned_only, initial_job_idx, groups)
        if self._EXECUTOR == "slurm" and not dry_run and submitit.SlurmExecutor.affinity() <= 0:  # no srun here
            discard_refused_sweep(self.config)
            raise UserError(
                "hydra/launcher=slurm submits with SLURM's commands (srun, sbatch), which this machine does not "
                "have: run the sweep on a host of your cluster; here, plan=true prints each job's request and plan, "
                "hydra.launcher.dry_run=true writes the job scripts"
            )
        # Every job is sized (or refused) before the sweep dir exists.
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        to_submit = {initial_job_idx + i for indices in groups.values() for i in indices}
        if not dry_run and (live := still_queued(sweep_dir, self._EXECUTOR, to_submit)):
            discard_refused_sweep(self.config)
            jobs_said = ", ".join(f"#{number}: {self._EXECUTOR} job {job_id}" for number, job_id in live)
            stop = "squeue shows them; scancel stops them" if self._EXECUTOR == "slurm" else "kill stops them"
            raise UserError(
                f"{sweep_dir} has jobs of an earlier submission of this sweep still queued or running ({jobs_said}); "
                f"submitted again, each would run twice: wait for them to end ({stop}), then run the command again"
            )
        sweep_dir.mkdir(parents=True, exist_ok=True)
        # Hydra wrote the sweep's record with the command line as given; the jobs must not find secrets in it.
        redact_sweep_record(sweep_dir)
        if dry_run:
            writer = script_writer(folder, self._EXECUTOR, max_num_timeout)
            return self._write_scripts(writer, base, groups, sweep_dir, initial_job_idx)
        if self._EXECUTOR == "local":
            _say_if_crowded(groups)
        executor = submitit.AutoExecutor(folder=folder, cluster=self._EXECUTOR, **init)
        jobs: list[Any] = [None] * len(arguments)
        submissions: list[tuple[Any, list[int], tuple[int, ...] | None]] = [(r, i, None) for r, i in groups.items()]
        if self._EXECUTOR == "local":  # jobs run side by side here: each its own GPUs, one submission a job
            wanted = [
                int(dict(request).get("gpus_per_node") or 0) for request, indices in groups.items() for _ in indices
            ]
            devices = iter(device_assignment(wanted, visible_devices()))
            submissions = [(request, [i], tuple(next(devices))) for request, indices in groups.items() for i in indices]
        # The jobs' pickles hold references to the secrets of the command line, never their values.
        share_secrets(secret_values())
        scripts = Path(folder.split("%j", 1)[0])  # where submitit writes each job's pickle and script
        written_before = set(scripts.rglob("*")) if scripts.is_dir() else None
        for request, indices, gpus in submissions:
            executor.update_parameters(**base, **dict(request))
            if gpus:
                # submitit's local executor takes the GPUs of a job (`visible_gpus`); its AutoExecutor does not
                # pass that key on.
                executor._executor.update_parameters(visible_gpus=gpus)
            try:  # submitit prints sbatch's refusal as it is; the one line below says it
                with contextlib.redirect_stderr(io.StringIO()):
                    submitted = executor.map_array(SealedJob(), [Sealed((self, arguments[i])) for i in indices])
            except Exception as err:  # sbatch said no: bad partition, resources the cluster does not have
                # The sweep is refused as a whole: what it submitted before is cancelled (it would run on with no
                # one waiting for it or counting it), and what it wrote goes.
                earlier = [job for job in jobs if job is not None]
                for job in earlier:
                    with contextlib.suppress(Exception):
                        job.cancel(check=False)
                _remove_written(scripts, written_before)
                discard_refused_sweep(self.config)
                asked = ", ".join(f"{k}={v}" for k, v in request if v is not None)
                cancelled = f"; the {len(earlier)} job(s) it had submitted before are cancelled" if earlier else ""
                raise UserError(
                    f"SLURM refused the job ({asked}): {sbatch_refusal(err)}{cancelled}; ask for what its nodes have "
                    "(`sinfo -o '%P %c %m %G'`) with the hardware group (hardware.devices, hardware.cpus_per_task, "
                    "hardware.mem_gb) and where it goes (cluster.partition, cluster.account)"
                ) from None
            for i, job in zip(indices, submitted, strict=True):
                jobs[i] = job
                log.info(
                    f"#{initial_job_idx + i}: {self._EXECUTOR} job {job.job_id} -> {sweep_dir / str(initial_job_idx + i)}"
                )
        if not any(jobs):
            return []  # every job finished before: nothing submitted, nothing to wait for
        self._record_jobs(sweep_dir, arguments, jobs)
        waited = sum(job is not None for job in jobs)
        log.info(f"Waiting for {waited} job(s); job logs in {folder.replace('%j', '<job id>')}")
        try:
            return self._wait(jobs, sweep_dir, initial_job_idx)
        except KeyboardInterrupt:  # the jobs are the scheduler's: they run on, and the sweep dir gathers them
            running = " the jobs run on (squeue; scancel to stop them);" if self._EXECUTOR == "slurm" else ""
            where = f"where they stand: python -m hydralight.report {sweep_dir}"
            print(f"\nstopped waiting;{running} {where}", file=sys.stderr, flush=True)
            raise SystemExit(128 + signal.SIGINT) from None

    def _plans_here(
        self, configs: list[DictConfig], first: int, groups: dict[tuple[tuple[str, Any], ...], list[int]]
    ) -> list[JobReturn]:
        """`plan=true`: each job's request and plan printed in this process, one after another; nothing is
        submitted and no job dir is kept (the sweep dir holds Hydra's record, as a local sweep's plan does)."""
        for request, indices in groups.items():
            asked = ", ".join(f"{k}={v}" for k, v in request if v is not None)
            jobs = ", ".join(f"#{first + i}" for i in indices)
            log.info(f"plan=true: nothing is submitted; {jobs} would ask {self._EXECUTOR} for {asked}")
        results = []
        for i, sweep_config in enumerate(configs):
            with open_dict(sweep_config.hydra):
                sweep_config.hydra.job.id = f"plan_{first + i}"
                sweep_config.hydra.job.num = first + i
            HydraConfig.instance().set_config(sweep_config)
            results.append(
                run_job(
                    hydra_context=self.hydra_context,
                    task_function=self.task_function,
                    config=sweep_config,
                    job_dir_key="hydra.sweep.dir",
                    job_subdir_key="hydra.sweep.subdir",
                )
            )
        return results

    def _wait(self, jobs: list[Any], sweep_dir: Path, first: int) -> list[JobReturn]:
        """Each job's result as it ends, in any order, saying how each job stands as it changes (its state, the
        step it reached, its last value of the objective: a live table on a terminal, a line per change
        elsewhere), and every `HEARTBEAT_S` where the jobs stand: a sweep never waits in silence. A job that
        ended without a result (killed, cancelled, out of time) is marked so in its manifest, which its own
        process could not do."""
        results: dict[int, JobReturn] = {}
        metric = OmegaConf.select(self.config, "objective.metric") if self.config is not None else None
        board = _Board([f"#{first + i}" for i in range(len(jobs))], metric)
        pending = {i for i, job in enumerate(jobs) if job is not None}  # None: finished before, not submitted
        last_said = time.monotonic()
        try:
            while pending:
                for i in sorted(pending):
                    job, name, job_dir = jobs[i], f"#{first + i}", sweep_dir / str(first + i)
                    state = str(job.state)
                    done = job.done()
                    # Ended without a result by the accounting, but requeued (the job asked for it as it stopped,
                    # or the cluster did): its next attempt is the job's end, not this one.
                    ended_bare = done and self._EXECUTOR == "slurm" and not job.paths.result_pickle.exists()
                    if ended_bare and (live := live_state(str(job.job_id))):
                        done, state = False, live
                    if done:
                        try:
                            results[i] = job.results()[0]
                            # done() sees the result file before SLURM's accounting; a job that ended refused or
                            # crashed (its process went on to the end) says so in its manifest.
                            failed = (read_json(RunDir(job_dir).manifest) or {}).get("status") == "failed"
                            state = "FAILED" if failed else "COMPLETED"
                            if (refusal := getattr(results[i], REFUSED_ATTR, None)) is not None:
                                REFUSED_HERE[job_dir.name], state = refusal, "REFUSED"
                        except Exception as err:  # killed, cancelled, out of time, crashed: the others still count
                            state = str(job.state)
                            if (read_json(RunDir(job_dir).manifest) or {}).get("status") == "failed":
                                state = "FAILED"  # refused or crashed in the job (JobFailed): its manifest says why
                            else:
                                reason = (str(err).strip().splitlines() or [type(err).__name__])[-1][:300]
                                ended = f"{self._EXECUTOR} job {job.job_id} ended {job.state}: {reason}"
                                log.error(f"{name}: {ended}")
                                _mark_ended(RunDir(job_dir), ended)
                        finally:
                            self._forget_pickles(job)
                        pending.discard(i)
                    # A refused job's dir holds an earlier run's progress, not its own.
                    progress = job_progress(job_dir, metric) if state != "REFUSED" else (None, None)
                    if state != "UNKNOWN" and board.update(i, str(job.job_id), state, *progress):
                        last_said = time.monotonic()  # UNKNOWN: the scheduler has not said yet
                if pending and board.live is None and time.monotonic() - last_said >= HEARTBEAT_S:
                    running = ", ".join(
                        f"#{first + i}{_reached(sweep_dir / str(first + i), metric)}" for i in sorted(pending)
                    )
                    log.info(f"{len(jobs) - len(pending)} of {len(jobs)} job(s) ended; waiting for {running}")
                    last_said = time.monotonic()
                if pending:
                    time.sleep(POLL_S)
        finally:
            board.close()
        return [results[i] for i in sorted(results)]

    @staticmethod
    def _forget_pickles(job: Any) -> None:
        """An ended job's pickled input and result hold its config and command line as given, secrets included;
        no one reads them again (its logs beside them stay)."""
        for path in job.paths.folder.glob(f"{job.job_id}_*.pkl"):
            path.unlink(missing_ok=True)

    @staticmethod
    def _record_jobs(sweep_dir: Path, arguments: list, jobs: list) -> None:
        submitted = {
            idx: (redact(overrides), job.job_id)
            for (overrides, _, idx, *_), job in zip(arguments, jobs, strict=True)
            if job is not None
        }
        record_submitted(sweep_dir, submitted)

    def _check_no_resource_overrides(self, params: dict[str, Any], planned: dict[str, Any]) -> None:
        defaults = OmegaConf.structured(BaseQueueConf)
        for key in RESOURCE_KEYS:
            if params.get(key) not in (None, defaults[key], planned[key]):
                raise UserError(
                    f"hydra.launcher.{key}={params[key]} disagrees with the hardware profile ({planned[key]}); "
                    "set hardware.devices / hardware.num_nodes / hardware.cpus_per_task / hardware.mem_gb instead"
                )

    def _write_scripts(self, executor: Any, base: dict, groups: dict, sweep_dir: Path, first: int) -> list:
        scripts = sweep_dir / "sbatch"
        scripts.mkdir(parents=True, exist_ok=True)
        prefix = f"{self._EXECUTOR}_"
        for resources, indices in groups.items():
            # What AutoExecutor.update_parameters does: generic names converted, ours with the prefix taken off.
            asked = {k: v for k, v in {**base, **dict(resources)}.items() if v is not None}
            params = executor._convert_parameters({k: v for k, v in asked.items() if not k.startswith(prefix)})
            params.update({k.removeprefix(prefix): v for k, v in asked.items() if k.startswith(prefix)})
            executor._internal_update_parameters(**params)
            # The interpreter a submission runs (submitit's: this one), so the script is the one sbatch would get.
            text = executor._make_submission_file_text(
                f"{executor.python} -u -m submitit.core._submit <folder>", "dry-run"
            )
            for i in indices:
                path = scripts / f"job{first + i}.sh"
                path.write_text(text)
                log.info(f"#{first + i}: sbatch script written to {path} (dry run, nothing submitted)")
        return []
