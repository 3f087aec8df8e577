"""The one training entrypoint: resolve the run plan -> build -> fit -> test (or predict) -> record.

`cli` reads the command line once, checks every job's config, and hands it to Hydra; `main` is Hydra's
task (one run, or one job of a sweep): it resolves the plan and runs it; `run` tells the story of a run.
Heavy imports (torch, Lightning) happen inside `main`, so `python train.py --cfg job` stays quick.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, open_dict

from hydralight import lightning_namespaces
from hydralight.config.compose import Invocation, compose_jobs
from hydralight.config.folders import SHIPPED_CONF
from hydralight.config.hydra_internals import mode_known, run_composed
from hydralight.config.plan import Machine, RunPlan
from hydralight.config.resolve import JobInfo
from hydralight.config.schema import register
from hydralight.data.options import SCHEMAS as DATA_SCHEMAS
from hydralight.errors import UserError, exit_on_user_error
from hydralight.rundir.launch import (
    check_rank_variables,
    early_ranks,
    external_launcher,
    found_before_hydra,
    is_rank_zero,
    keep_record_before,
    launch_run_dir,
    register_resolvers,
    restore_record,
    take_back_log,
)
from hydralight.rundir.layout import CHECKPOINTS, RESULTS
from hydralight.rundir.lock import RunDirLock
from hydralight.rundir.ownership import Claim, check_sweep_usable, check_usable, claim_sweep_dir, unshare
from hydralight.rundir.record import discard_unused_run_dir, remove_empty_folders
from hydralight.tasks.options import SCHEMAS as MODEL_SCHEMAS

# The typed configs the shipped model and data options extend, and the resolvers conf/hydra names.
register({**MODEL_SCHEMAS, **DATA_SCHEMAS})
register_resolvers()
# A user's `lightning.pytorch` module, data module or callback is built on the classes this Trainer runs.
lightning_namespaces.install()

# conf/ of the repository, inside the package too, so an installed (non-editable) copy finds them.
CONFIG_DIR = str(SHIPPED_CONF)
# What Hydra names the job (`hydra.job.name`, the log file's name): the module of its task function, `main`.
JOB_NAME = "train"
# The run dir `cli` claimed and locked before Hydra wrote its record there (a named dir of a single run).
_claimed_before_hydra: Claim | None = None
# The folders above a run dir that Hydra names (`outputs/`) not there before this run: a refused run leaves none.
_made_for_hydra: tuple[Path, ...] = ()


def run(plan: RunPlan, machine: Machine) -> float | None:
    """Train and test (or only test, `mode=eval`; or write a checkpoint's predictions, `mode=predict`) as the plan
    says; return the objective (the best validation value of `objective.metric`), so a sweeper never tunes on the
    test set."""
    from hydralight.config.resolve import check_plan
    from hydralight.data.contract import build_datamodule, shards_by_rank, stated_sizes, with_planned_batch
    from hydralight.resume.policy import Resume
    from hydralight.rundir.layout import RunDir
    from hydralight.rundir.record import RunRecord
    from hydralight.training import machine as this_machine
    from hydralight.training.console import apply_extras, quiet_framework, say, show_start, testing
    from hydralight.training.invariance import make_invariant
    from hydralight.training.loggers import build_loggers, wandb_scope
    from hydralight.training.modules import build_module, check_constructors, tests
    from hydralight.training.predictions import (
        PredictionWriter,
        predict,
        prediction_line,
        prediction_results,
        prepare_prediction,
    )
    from hydralight.training.records import FitEnd, Throughput, result_line, run_results, stopped_by
    from hydralight.training.strategy import blamed_on_a_failed_rank, build_strategy, job_scope
    from hydralight.training.trainer import build_callbacks, build_trainer, lightning_refusals

    quiet_framework()  # the console shows the plan, the run dir, progress and the result
    apply_extras(plan.config)
    if (earlier := plan.resume.finished) is not None:  # the same command again: nothing to do
        say(f"already finished: {result_line(earlier, plan.paths.run_dir)}")
        take_back_log()  # its files stay as they were, its log too
        return earlier["objective"]["value"]

    # 1. Check the plan against this machine; build what writes nothing: data, module, the resume decision.
    check_plan(plan, machine)
    check_constructors(plan)  # before the data module's prepare_data may download
    this_machine.seed(plan.seed)
    resume = Resume(plan)
    resume.check_data()  # a checkpoint tested on other data than its own is refused before any is read
    data = build_datamodule(plan.data.spec, plan.data.offered, plan.data.explicit)
    if is_rank_zero():
        with lightning_refusals():  # missing or corrupt files are refused before any run file is written
            data.prepare_data()
    built, data = data, with_planned_batch(data, plan.data.spec, plan.data.offered, plan.hardware.world_size)
    sizes = stated_sizes(data)
    plan, built_for = resume.model(sizes)  # mode=eval/predict: the module the checkpoint holds
    module = build_module(plan.model, built_for)
    make_invariant(module, plan.model.invariant_dropout, resume.global_batchnorm)
    if plan.framework.precision == "64-true":
        module.double()  # before any checkpoint's float64 weights are loaded into it, not after
    resume.load(module, sizes)  # checked against what it continues from; init_from's or the tested weights in
    predicting = plan.resume.mode == "predict"
    if predicting:  # a module without predict_step, a source its data cannot read: refused before any file
        prepare_prediction(module, data, (plan.config.get("predict") or {}).get("source"))
    run_dir = RunDir.at(plan.paths.run_dir)
    machine_record = this_machine.describe(machine)
    record = RunRecord(run_dir, plan.config, plan.to_dict(), machine_record, plan.paths.overrides, is_rank_zero())

    with job_scope(), wandb_scope(), record, blamed_on_a_failed_rank():  # the next job of a sweep starts clean
        # 2. Build: process settings, loggers, callbacks, trainer.
        this_machine.apply(plan.framework.env, plan.framework.matmul_precision, plan.hardware.cpus_per_task)
        if is_rank_zero():
            show_start(plan, module, divides_batch=data is not built)
        throughput = Throughput(plan.task.global_size, into=record.extra)  # training samples/s, start-up left out
        writer = [PredictionWriter(run_dir.path)] if predicting else []
        fit_end = FitEnd(plan.paths.run_dir, is_rank_zero())
        callbacks = build_callbacks(
            plan, module, record.extra, throughput, resume.save(sizes, record.extra), fit_end, *writer
        )
        loggers = [] if predicting else build_loggers(plan, record.manifest)  # a prediction logs no metrics
        trainer = build_trainer(plan, build_strategy(plan, run_dir.plan), callbacks, loggers, shards_by_rank(data))

        if predicting:
            # 3. Predict with the checkpoint's module, each rank its share; rank 0 writes them in sample order.
            with (
                record.timed("predict_seconds"),
                _left_as_it_was_if_refused(plan, trainer, record),
                lightning_refusals(),
            ):
                predict(trainer, module, data, writer[0])
            # 4. Record: results.json, the manifest, one line naming the file.
            results = prediction_results(writer[0].written, plan.resume.ckpt_path)
            record.finish(results)
            if trainer.is_global_zero:
                say(prediction_line(results))
            return None

        # 3. Fit, continuing the run's checkpoint.
        if plan.resume.mode == "train":
            with (
                record.timed("fit_seconds"),
                _left_as_it_was_if_refused(plan, trainer, record),
                lightning_refusals(plan.task.accumulation),
            ):
                trainer.fit(module, datamodule=data, ckpt_path=resume.ckpt_path, weights_only=True)
        # 4. Test the best checkpoint.
        # What training ended with (that of the attempt that trained, when this one continued a finished training).
        if plan.resume.mode == "train":
            ended = fit_end.ended(trainer)
        else:
            ended = {"metrics": dict(trainer.callback_metrics), "epochs": None, "stopped_by": stopped_by(trainer)}
        best, tested, test_batches = resume.to_test(trainer), {}, 0  # before the test reloads callbacks
        if tests(module, data):
            with testing():
                trainer.test(module, datamodule=data, ckpt_path=best, verbose=False, weights_only=True)
            tested = dict(trainer.callback_metrics)  # what the test stage logged, under the module's names
            test_batches = int(sum(trainer.num_test_batches))

        # 5. Record: results.json, the manifest, one line.
        results = run_results(
            trainer, ended["metrics"], tested, best, plan.objective,
            throughput.samples_per_second(trainer, record.extra.get("fit_seconds")), ended["stopped_by"],
            ended["epochs"], test_batches,
        )  # fmt: skip
        record.finish(results)
        if trainer.is_global_zero:
            say(result_line(results, plan.paths.run_dir))
        return results["objective"]["value"]


@contextlib.contextmanager
def _left_as_it_was_if_refused(plan: RunPlan, trainer: Any, record: Any) -> Iterator[None]:
    """A run refused inside `fit` (a batch its module cannot take, an objective it does not log, a setting its
    checkpoint cannot continue with) changes nothing: a new single run leaves no run dir, an earlier run's
    record stays as it was."""
    try:
        yield
    except UserError as err:
        untrained = getattr(trainer, "global_step", 1) == 0 or getattr(err, "before_any_result", False)
        if plan.paths.sweep_dir is None and untrained and not plan.resume.own:
            err.discard_run_dir = True  # what this attempt added goes; what was there before stays
        err.saved_something = not record.restore_if_nothing_saved()
        if not err.saved_something:  # a tracker's run of the earlier attempt is left as it was too
            for logger in getattr(trainer, "loggers", []):
                getattr(logger, "put_back", lambda: None)()
        raise


def _claim_after_hydra(run_dir: Path, swept: bool) -> Claim:
    """The job dir Hydra worked out and wrote its log and record into (`${...}` in it, a sweep's job), claimed by
    what it held before; refused, Hydra's record there is put back and its log taken back."""
    key = "job dir" if swept else "hydra.run.dir"  # a sweep's job dirs are no key the user set
    try:
        return Claim.take(run_dir.resolve(), key, hydra_wrote=True, found=found_before_hydra(run_dir))
    except UserError:
        restore_record(run_dir, refused=True)
        take_back_log()
        raise


def _discard_begun(claim: Claim, run_dir: Path, job: JobInfo) -> bool:
    """A run dir that holds only this attempt's start-up record goes (a folder that was there before stays,
    emptied of it), with the folders made for a single run's dated dir; whether it went."""
    gone = discard_unused_run_dir(run_dir, keep_folder=not claim.made_folder)
    if gone and job.sweep_dir is None:
        remove_empty_folders(_made_for_hydra)
    return gone


def job_info() -> JobInfo:
    """What Hydra knows of the running job."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    sweep = hc.mode == RunMode.MULTIRUN
    return JobInfo(
        run_dir=str(hc.runtime.output_dir),
        sweep_dir=str(hc.sweep.dir) if sweep else None,
        job_name=hc.job.override_dirname or None,
        overrides=list(hc.overrides.task),
        choices={k: v for k, v in hc.runtime.choices.items() if isinstance(v, str)},
    )


@hydra.main(config_path=CONFIG_DIR, config_name="train", version_base="1.3")
@exit_on_user_error
def main(cfg: DictConfig) -> float | None:
    """One run, or one job of a sweep: resolve its plan (print it with `plan=true`) and run it."""
    from hydralight.config.resolve import resolve
    from hydralight.rundir.record import record_failure
    from hydralight.training.machine import detect

    job = job_info()
    run_dir = Path(job.run_dir)
    claimed = _claimed_before_hydra
    # One live run per dir (a sweep job resubmitted while its first attempt runs is refused).
    plan_only = bool(cfg.get("plan", False))  # read so: a primary config of the user's may lack it (refused below)
    locked = plan_only or not is_rank_zero() or (claimed is not None and run_dir.resolve() == claimed.path)
    with contextlib.nullcontext() if locked else RunDirLock(run_dir):
        claim = None
        try:
            if is_rank_zero():  # a folder of the user's is refused before anything of the run is written there
                claim = claimed if locked and not plan_only else _claim_after_hydra(run_dir, job.sweep_dir is not None)
            machine = detect()
            # This node's other ranks start now and import while this one resolves and builds.
            with contextlib.nullcontext() if plan_only else early_ranks(*_ranks_asked(cfg, machine)):
                plan = resolve(cfg, machine, job)
                if plan_only:  # printed, and the run dir Hydra made removed, once: by rank 0 of a torchrun launch
                    if is_rank_zero():
                        from hydralight.training.modules import check_constructors

                        check_constructors(plan)
                        print(plan.table(), end="")
                        restore_record(run_dir, refused=True)  # an earlier run's record there, as it was
                        kept = claim is not None and not claim.made_folder
                        if discard_unused_run_dir(run_dir, keep_folder=kept) and not kept and job.sweep_dir is None:
                            remove_empty_folders(_made_for_hydra)  # `outputs/`, made for it
                    return None
                # `resume=RUN_DIR hydra.run.dir=OTHER` continues in RUN_DIR: the dir written is the one locked.
                continued = Path(plan.paths.run_dir).resolve()
                elsewhere = is_rank_zero() and continued != run_dir.resolve()
                if elsewhere:
                    check_usable(continued, "resume")
                    unshare(continued)
                with RunDirLock(continued) if elsewhere else contextlib.nullcontext():
                    return run(plan, machine)
        except KeyboardInterrupt:
            # Ctrl-C before training took the signal (building, reading the data): a run dir this attempt began in
            # a new or an empty folder holds nothing to continue from, and goes as a refused run's does.
            if claim is not None and not claim.before and not (run_dir / CHECKPOINTS).exists():
                claim.discard_added()
                _discard_begun(claim, run_dir, job)
            raise
        except UserError as err:
            # A refused run leaves no half-made run dir behind (rank 0 made it; only rank 0 removes it), and
            # removes only what this attempt added: a folder that was there before stays.
            if claim is not None:
                if external_launcher() is not None:
                    from hydralight.training.torchrun import others_refused

                    others_refused()  # none of them makes the run dir again after this clean-up
                if getattr(err, "discard_run_dir", False):
                    claim.discard_added()
                kept = not _discard_begun(claim, run_dir, job)
                restore_record(run_dir, refused=kept)  # an earlier run's record, as it was
                # And its log (the refusal is on the console); a sweep's job keeps it unless earlier results stand.
                if kept and not err.saved_something and (job.sweep_dir is None or (run_dir / RESULTS).is_file()):
                    take_back_log()
            elif external_launcher() is not None:
                from hydralight.training.torchrun import refused

                refused()  # its exit would stop rank 0 in the middle of its own clean-up
                if _named_by_launch(run_dir, cfg):
                    # Another rank of a torchrun or srun launch, whose Hydra made the dir the launch is named by
                    # after rank 0 removed it: empty, it goes too.
                    with contextlib.suppress(OSError):
                        run_dir.rmdir()
            if claim is not None and external_launcher() is not None:
                from hydralight.training.torchrun import start_up_ended

                start_up_ended()
            if job.sweep_dir is None:
                raise
            # In a sweep the other jobs go on; the job's manifest says why it failed, the sweep's summary counts it.
            from hydra.core.hydra_config import HydraConfig

            from hydralight.rundir.outcome import REFUSED_HERE

            print(f"error: job {HydraConfig.get().job.num} ({run_dir}): {err}", file=sys.stderr, flush=True)
            REFUSED_HERE[run_dir.name] = str(err)
            if claim is not None and not plan_only:  # a job dir of the user's (refused as such) gets no record of ours
                from hydralight.rundir.layout import RunDir

                record_failure(RunDir(run_dir), str(err), job.overrides)
            return None
        except Exception as err:
            if job.sweep_dir is None:
                raise
            # One job's crash (a module's bug, a value it cannot take) ends that job, not the sweep: its traceback
            # is said, its manifest says why, and the sweep's last line counts it.
            import traceback

            from hydra.core.hydra_config import HydraConfig

            from hydralight.rundir.layout import RunDir

            traceback.print_exc()
            reason = f"{type(err).__name__}: {err}".splitlines()[0][:300]
            print(f"error: job {HydraConfig.get().job.num} ({run_dir}) crashed: {reason}", file=sys.stderr, flush=True)
            if claim is not None:
                record_failure(RunDir(run_dir), reason, job.overrides)
            return None
        finally:
            restore_record(run_dir, refused=False)  # the job ended: what was kept for it goes


def _named_by_launch(run_dir: Path, cfg: DictConfig) -> bool:
    """Whether `run_dir` is the one a torchrun or srun launch is named by (`outputs/torchrun-<id>`)."""
    named = launch_run_dir(cfg.resume, cfg.mode)
    return named is not None and Path(named).resolve() == run_dir.resolve()


def _ranks_asked(cfg: DictConfig, machine: Machine) -> tuple[str, int, int]:
    """(strategy, devices per node, nodes) the config asks for, read before the plan is resolved (cheaply: no
    module is imported); nothing when it does not resolve or this machine cannot hold it (the plan says why)."""
    from hydralight.config.capacity import check_capacity
    from hydralight.config.resolve import resources

    try:
        hardware, framework, _ = resources(cfg, machine)
        if hardware.accelerator == "gpu" and machine.gpus < hardware.devices:
            raise UserError("not these GPUs")
        check_capacity(hardware, machine, bool(cfg.hardware.get("oversubscribe", False)))
    except Exception:  # refused by resolve() or the plan's check in a moment, with its own line
        return "auto", 1, 1
    return framework.strategy, hardware.devices, hardware.num_nodes


def cli() -> None:
    """`python train.py`: read the command line once, compose and check every job's config, lock a named
    run dir, then let Hydra run. A `.env` file in the folder it starts from sets the variables the shell
    does not (DATA_DIR, WANDB_API_KEY, ...)."""
    from dotenv import load_dotenv

    load_dotenv(Path.cwd() / ".env", override=False)
    try:
        exit_on_user_error(_start)(Invocation(tuple(sys.argv[1:])))
    except KeyboardInterrupt:  # Ctrl-C before training took the signal (importing, composing, building)
        print("interrupted", file=sys.stderr, flush=True)
        raise SystemExit(128 + signal.SIGINT) from None


def _start(invocation: Invocation) -> None:
    global _claimed_before_hydra, _made_for_hydra
    check_rank_variables()  # this door is a shell's or a launcher's, never one of this project's own ranks
    # The config is composed and type-checked first (a sweep's each job's, by its sweeper): a wrong value is one
    # line, before any run dir.
    modes: set = set()
    given = invocation.override_args  # what Hydra reads: the config composed here is handed to it
    composed: list = []  # the config, composed once: Hydra runs it as it is
    configs = compose_jobs(CONFIG_DIR, "train", invocation, modes, composed, JOB_NAME)
    if configs and not invocation.multirun:  # the run dir that resuming, or a torchrun or srun launch, names
        invocation = dataclasses.replace(invocation, launch_dir=launch_run_dir(configs[0].resume, configs[0].mode))
        if (ignored := invocation.ignored_run_dir) is not None and composed:
            # All of a continued run goes into its own dir: Hydra's log and record too, never split over two.
            print(
                f"note: resume={invocation.launch_dir} continues that run in its own dir; hydra.run.dir={ignored} "
                "is not used",
                file=sys.stderr,
                flush=True,
            )
            with open_dict(composed[0].hydra.run):
                composed[0].hydra.run.dir = invocation.launch_dir
    if invocation.print_only:
        from hydralight.config.resolve import resources

        for cfg in configs:
            resources(cfg, Machine())  # the arithmetic too; the machine is checked only by a run
    invocation.check_writable()
    _made_for_hydra = invocation.missing_output_folders()
    multirun = any(getattr(mode, "name", None) == "MULTIRUN" for mode in modes)  # a search preset may set it
    if (multirun or invocation.multirun) and (launcher := external_launcher()) is not None:
        # Every rank would run the whole sweep by itself, each job's ranks never meeting the others'.
        raise UserError(
            f"-m under {launcher}: a sweep starts each job's processes itself; run it with python (python train.py "
            "-m ... hardware.devices=N strategy=ddp), or start one launch per job"
        )
    if (sweep_dir := invocation.fixed_sweep_dir(multirun)) is not None and is_rank_zero():
        # A folder of the user's is refused before Hydra writes the sweep's record (multirun.yaml) in it.
        if invocation.plan_only:
            check_sweep_usable(Path(sweep_dir))
        else:
            claim_sweep_dir(Path(sweep_dir))
    # Hydra need not compose everything again to learn what the configs say of hydra.mode (unless the
    # command line sets it: those overrides are Hydra's, not composed above).
    read = len(modes) == 1 and not any("hydra.mode" in arg for arg in invocation.argv)
    known = mode_known(modes.pop()) if read else contextlib.nullcontext()
    handed = run_composed(composed[0], given, invocation.multirun) if composed else contextlib.nullcontext()
    # A named run dir is locked before Hydra writes its record there, so a live run is left untouched.
    named = invocation.fixed_run_dir()
    with known, handed:
        if named is None or not is_rank_zero():
            try:
                main()
            finally:  # a sweep refused before its first job leaves no folder made for it
                if invocation.multirun and is_rank_zero():
                    remove_empty_folders(_made_for_hydra)
            return
        if invocation.plan_only:  # prints the plan and writes nothing of its own: no claim, no lock
            check_usable(Path(named), "hydra.run.dir")
            main()
            return
        # Checked and marked before the lock writes its file or Hydra its record: a folder of the user's is
        # refused with nothing written in it.
        claim = Claim.take(Path(named).resolve(), invocation.run_dir_key)
        try:
            with RunDirLock(claim.path):
                _claimed_before_hydra = claim
                if (subdir := invocation.hydra_record_dir()) is not None:  # also one the command line names
                    keep_record_before(claim.path / subdir)
                main()
        finally:
            claim.remove_if_empty()  # a run refused by the lock leaves no folder it made


if __name__ == "__main__":
    # `python -m hydralight.train`: run the entrypoint from the imported module, not from `__main__`, so
    # that submitit pickles `hydralight.train.main` for its jobs.
    from hydralight.train import cli as _cli

    _cli()
