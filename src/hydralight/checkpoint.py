"""Loading checkpoints the project did not just write: checked, and without running pickled code."""

from __future__ import annotations

import pickle
from pathlib import Path

from omegaconf import DictConfig

from hydralight.errors import UserError
from hydralight.model import Classifier


def load_classifier(path: str | Path) -> Classifier:
    """The model saved in a Lightning checkpoint, rebuilt from its own saved architecture."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"ckpt_path={path} does not exist; pass the .ckpt file of a run (its checkpoints/ folder)")
    try:
        # weights_only: tensors and plain containers only, so a planted pickle cannot run code.
        return Classifier.load_from_checkpoint(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError, RuntimeError, AttributeError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"ckpt_path={path} is not a checkpoint of this project ({reason[:200]})") from None


def check_mode(mode: str, ckpt_path: str | None) -> None:
    if mode not in ("train", "eval"):
        raise UserError(f"mode={mode} is not a mode; use mode=train or mode=eval")
    if mode == "eval" and not ckpt_path:
        raise UserError("mode=eval needs the checkpoint to test: add ckpt_path=PATH/TO/file.ckpt")


def resume_path(cfg: DictConfig, output_dir: Path) -> str | None:
    """The checkpoint `trainer.fit` continues from: `ckpt_path` if given, else with `resume=auto` the
    run dir's own last.ckpt (a requeued or restarted job lands in the same dir), else none."""
    if cfg.ckpt_path:
        if not Path(cfg.ckpt_path).is_file():
            raise UserError(
                f"ckpt_path={cfg.ckpt_path} does not exist; pass the .ckpt file of a run (its checkpoints/ folder)"
            )
        return str(cfg.ckpt_path)
    if cfg.resume not in ("auto", "never"):
        raise UserError(
            f"resume={cfg.resume} is not supported; use resume=auto (continue this run dir) or resume=never"
        )
    last = output_dir / "checkpoints" / "last.ckpt"
    return str(last) if cfg.resume == "auto" and last.is_file() else None
