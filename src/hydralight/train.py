"""The one training entrypoint: compose config -> plan resources -> build -> fit -> test -> report.

Heavy imports (torch, Lightning) happen inside `run`, so `python train.py --cfg job` stays instant.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from hydralight.errors import UserError, exit_on_user_error
from hydralight.launchers import is_rank_zero, with_shared_run_dir

CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "conf")


def run(cfg: DictConfig) -> float | None:
    """Train and test (or only test, `mode=eval`) as the config says; return the test accuracy."""
    import pytorch_lightning as pl
    import torch
    from hydra.utils import instantiate

    from hydralight.checkpoint import load_classifier, resume_path
    from hydralight.distributed import build_strategy, job_scope
    from hydralight.model import Classifier
    from hydralight.plan import Machine, check_plan, make_plan
    from hydralight.tracking import build_loggers, save_results, save_run_record
    from hydralight.trainer import build_callbacks, build_trainer

    # Lightning-internal deprecation that users cannot act on, printed once per rank.
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")

    # 1. Plan: hardware -> framework -> task, refused here if this machine cannot run it.
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    machine = Machine.detect()
    plan = make_plan(cfg, machine)
    if cfg.plan:
        print(plan.table(), end="")
        return None
    check_plan(plan, machine)
    if cfg.mode not in ("train", "eval"):
        raise UserError(f"mode={cfg.mode} is not a mode; use mode=train or mode=eval")
    if cfg.mode == "eval" and not cfg.ckpt_path:
        raise UserError("mode=eval needs the checkpoint to test: add ckpt_path=PATH/TO/file.ckpt")
    output_dir = Path(cfg.paths.output_dir)
    config_file = save_run_record(output_dir, cfg, plan) if is_rank_zero() else output_dir / "config.yaml"
    if plan.framework.matmul_precision:
        torch.set_float32_matmul_precision(plan.framework.matmul_precision)
    pl.seed_everything(cfg.seed, workers=True, verbose=False)

    with job_scope():  # a sweep's next job starts with this process as it is now
        os.environ.update(plan.framework.env)
        # 2. Build: data, model, callbacks, loggers, trainer.
        datamodule = instantiate(cfg.data, **plan.data_kwargs(), drop_last=cfg.batch.drop_last, seed=cfg.seed)
        if cfg.mode == "eval":
            model = load_classifier(cfg.ckpt_path)
        else:
            model = Classifier(
                net=OmegaConf.to_container(cfg.model.net),
                optimizer=OmegaConf.to_container(cfg.optim.optimizer),
                scheduler=OmegaConf.to_container(cfg.optim.scheduler) if cfg.optim.get("scheduler") else None,
                lr=plan.task.lr,
            )
        loggers = build_loggers(cfg, plan)
        trainer = build_trainer(
            cfg, plan, build_strategy(cfg, plan, config_file), build_callbacks(cfg, loggers), loggers
        )

        # 3. Fit, then test the best checkpoint (the one `mode=eval` would be given).
        best, metrics = None, {}
        if cfg.mode == "train":
            resume = resume_path(cfg.mode, cfg.resume, cfg.ckpt_path, output_dir)
            trainer.fit(model, datamodule=datamodule, ckpt_path=resume, weights_only=True)
            best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else None
            metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        tested = trainer.test(model, datamodule=datamodule, ckpt_path=best or None, verbose=False, weights_only=True)

        # 4. Report.
        metrics.update({k: float(v) for k, v in trainer.callback_metrics.items()})
        test_acc = tested[0]["test/acc"] if tested else None
        if trainer.is_global_zero:
            summary = {"epochs": trainer.current_epoch, "global_step": trainer.global_step, "best_checkpoint": best}
            save_results(output_dir, {**summary, "metrics": metrics, "test/acc": test_acc})
            print(
                f"test/acc={test_acc:.4f} (checkpoint: {best or cfg.ckpt_path or 'final weights'}; run dir: {output_dir})"
            )
    return test_acc


@hydra.main(config_path=CONFIG_DIR, config_name="train", version_base="1.3")
@exit_on_user_error
def main(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig

    from hydralight.tracking import discard_unused_run_dir

    output_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        result = run(cfg)
    except UserError:
        # A refused run leaves no half-made run dir behind (rank 0 made it; only rank 0 removes it).
        if is_rank_zero():
            discard_unused_run_dir(output_dir)
        raise
    if cfg.plan:
        discard_unused_run_dir(output_dir)
    return result


def cli() -> None:
    """`python train.py`: every rank of a torchrun/srun launch shares one run dir, then Hydra runs."""
    with_shared_run_dir()
    main()
