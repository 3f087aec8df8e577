"""The one training entrypoint: compose config -> plan resources -> build -> fit -> test -> report.

Heavy imports (torch, Lightning) happen inside `run`, so `python train.py --cfg job` stays instant.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from hydralight.errors import UserError, exit_on_user_error
from hydralight.run_dir import (
    check_run_dir_writable,
    fixed_run_dir,
    is_rank_zero,
    resume_overrides,
    with_shared_run_dir,
)
from hydralight.run_lock import RunDirLock
from hydralight.schema import compose_jobs, register

register()
# ./conf holds your own options when you have any; without one there is nothing to warn about.
warnings.filterwarnings("ignore", message="provider=hydra.searchpath in main, path=conf is not available")

# The configs ship inside the package, so an installed (non-editable) copy finds them too.
CONFIG_DIR = str(Path(__file__).resolve().parent / "conf")


def run(cfg: DictConfig, overrides: list[str] | None = None) -> float | None:
    """Train and test (or only test, `mode=eval`) as the config says; return the objective (the best
    validation value of `objective.metric`), so a sweeper never tunes on the test set."""

    from hydralight.checkpoint import (
        check_mode,
        finished_result,
        resume_path,
        resumed_config,
        starting_model,
        with_evaluated_model,
    )
    from hydralight.console import quiet_framework, show_start, testing
    from hydralight.data.contract import build_datamodule, shards_by_rank
    from hydralight.distributed import build_strategy, job_scope
    from hydralight.invariance import InvarianceCheck
    from hydralight.loggers import build_loggers, wandb_scope
    from hydralight.model import task_sizes
    from hydralight.plan import Machine, apply_plan, check_plan, make_plan
    from hydralight.progress import Throughput
    from hydralight.run_record import RunRecord
    from hydralight.trainer import build_callbacks, build_trainer

    quiet_framework()  # the console shows the plan, the run dir, progress and the result

    # 1. Plan: hardware -> framework -> task, refused here if this machine cannot run it.
    cfg = resumed_config(OmegaConf.create(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)), overrides or [])
    machine = Machine.detect()
    plan = make_plan(cfg, machine)
    if cfg.plan:
        print(plan.table(), end="")
        return None
    check_plan(plan, machine)
    check_mode(cfg.mode, cfg.ckpt_path)
    cfg = with_evaluated_model(cfg)
    output_dir = Path(cfg.paths.output_dir)
    if (earlier := finished_result(cfg, output_dir)) is not None:  # the same command again: nothing to do
        print(f"already finished: test/acc={earlier.get('test/acc')} (run dir: {output_dir})", flush=True)
        return (earlier.get("objective") or {}).get("value")
    # The planned settings its constructor takes (the data contract: hydralight.data).
    datamodule = build_datamodule(cfg.data, plan.data_kwargs(), cfg.seed)
    if is_rank_zero():
        datamodule.prepare_data()  # missing or corrupt files are refused before any run file is written
    record = RunRecord(output_dir, cfg, plan, machine, writer=is_rank_zero())

    with job_scope(), wandb_scope(), record:  # the next job of a sweep starts clean
        apply_plan(plan, cfg.seed)
        # 2. Build: model, callbacks, loggers, trainer.
        model = starting_model(cfg, **plan.model_kwargs(), **task_sizes(datamodule))
        if is_rank_zero():
            show_start(plan, model, output_dir)
        loggers = build_loggers(cfg, plan, record.manifest)
        strategy = build_strategy(plan, record.config_file)
        # Whether 1 and N processes train alike with this model and data goes into the run's record.
        invariance = InvarianceCheck(bool(cfg.model.get("sync_batchnorm", False)), into=record.extra)
        throughput = Throughput(plan.task.global_size, into=record.extra)  # training samples/s, start-up left out
        callbacks = [*build_callbacks(cfg, loggers), invariance, throughput]
        trainer = build_trainer(cfg, plan, strategy, callbacks, loggers, shards_by_rank(datamodule))

        # 3. Fit (continuing this run dir's checkpoint), then test the best checkpoint.
        if cfg.mode == "train":
            with record.timed("fit_seconds"):
                trainer.fit(model, datamodule=datamodule, ckpt_path=resume_path(cfg, output_dir), weights_only=True)
        best = getattr(trainer.checkpoint_callback, "best_model_path", None) if cfg.mode == "train" else cfg.ckpt_path
        fit_metrics = dict(trainer.callback_metrics)
        with testing():
            trainer.test(model, datamodule=datamodule, ckpt_path=best or None, verbose=False, weights_only=True)

        # 4. Report: results.json, manifest.json, one line.
        return record.finish(trainer, {**fit_metrics, **trainer.callback_metrics}, best)


@hydra.main(config_path=CONFIG_DIR, config_name="train", version_base="1.3")
@exit_on_user_error
def main(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from hydralight.run_record import discard_unused_run_dir, record_failure

    output_dir = Path(HydraConfig.get().runtime.output_dir)
    in_sweep = HydraConfig.get().mode == RunMode.MULTIRUN
    # One live run per dir (a sweep job resubmitted while its first attempt runs is refused).
    with RunDirLock(output_dir) if is_rank_zero() and not cfg.plan else contextlib.nullcontext():
        try:
            result = run(cfg, list(HydraConfig.get().overrides.task))
        except UserError as err:
            # A refused run leaves no half-made run dir behind (rank 0 made it; only rank 0 removes it).
            if is_rank_zero():
                discard_unused_run_dir(output_dir)
            if not in_sweep:
                raise
            # In a sweep the other jobs go on; the job's manifest says why it failed, the sweep's summary counts it.
            print(f"error: job {HydraConfig.get().job.num} ({output_dir}): {err}", file=sys.stderr, flush=True)
            if is_rank_zero():
                record_failure(output_dir, str(err))
            return None
        if cfg.plan:
            discard_unused_run_dir(output_dir)
        return result


def cli() -> None:
    """`python train.py`: settle the run dir (shared by the ranks of a torchrun/srun launch, the earlier
    run's with resume=RUN_DIR, writable in any case), then let Hydra run."""
    with_shared_run_dir()
    sys.argv[1:1] = resume_overrides(sys.argv[1:])
    exit_on_user_error(_start)(sys.argv[1:])


def _start(argv: list[str]) -> None:
    # Every job's config is composed and type-checked first: a wrong value is one line, before any run dir.
    configs = compose_jobs(CONFIG_DIR, "train", argv)
    if any(flag in argv for flag in ("--cfg", "-c")):
        from hydralight.plan import Machine, make_plan

        for cfg in configs:
            make_plan(cfg, Machine())  # the arithmetic too; the machine is checked only by a run
    check_run_dir_writable(argv)
    # A named run dir is locked before Hydra writes its record there, so a live run is left untouched.
    run_dir = fixed_run_dir(argv)
    with RunDirLock(run_dir) if run_dir and is_rank_zero() else contextlib.nullcontext():
        main()


if __name__ == "__main__":
    # `python -m hydralight.train`: run the entrypoint from the imported module, not from `__main__`, so
    # that submitit pickles `hydralight.train.main` for its jobs.
    from hydralight.train import cli as _cli

    _cli()
