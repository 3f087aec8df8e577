"""Loading checkpoints the project did not just write: checked, and without running pickled code."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hydralight.errors import UserError
from hydralight.model import Classifier, build_model, describe

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _readable(path: Path, label: str) -> Iterator[None]:
    """Turn a missing file, or any failure to load it, into one clear line naming `label`."""
    if not path.is_file():
        raise UserError(f"{label} does not exist; pass the .ckpt file of a run (its checkpoints/ folder)")
    try:
        yield
    except Exception as err:  # arbitrary bytes make torch.load fail in arbitrary ways
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"{label} is not a checkpoint of this project ({reason[:200]})") from None


def load_classifier(path: str | Path) -> Classifier:
    """The model saved in a Lightning checkpoint, rebuilt from its own saved architecture."""
    path = Path(path)
    with _readable(path, f"ckpt_path={path}"):
        # weights_only: tensors and plain containers only, so a planted pickle cannot run code.
        return Classifier.load_from_checkpoint(path, map_location="cpu", weights_only=True)


def check_mode(mode: str, ckpt_path: str | None) -> None:
    if mode not in ("train", "eval"):
        raise UserError(f"mode={mode} is not a mode; use mode=train or mode=eval")
    if mode == "eval" and not ckpt_path:
        raise UserError("mode=eval needs the checkpoint to test: add ckpt_path=PATH/TO/file.ckpt")


def with_evaluated_model(cfg: DictConfig) -> DictConfig:
    """`mode=eval`: the run's records name the network the checkpoint holds, not the model group's default."""
    if cfg.mode == "eval":
        net = read_checkpoint(cfg.ckpt_path).get("hyper_parameters", {}).get("net")
        if isinstance(net, dict):
            OmegaConf.update(cfg, "model.net", net, merge=False)
    return cfg


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """A checkpoint's contents, loaded without running pickled code."""
    import torch

    path = Path(path)
    with _readable(path, str(path)):
        return torch.load(path, map_location="cpu", weights_only=True)


def resume_path(cfg: DictConfig, output_dir: Path) -> str | None:
    """The checkpoint `trainer.fit` continues from, checked to hold this run's model.

    The run dir's own last.ckpt wins once the run has saved one (resume=auto, resume=RUN_DIR), so reruns
    and requeues continue and never restart; `ckpt_path=` starts a run from another run's state;
    resume=never ignores the run's own checkpoint.
    """
    own = output_dir / "checkpoints" / "last.ckpt"
    if cfg.resume != "never" and own.is_file():
        path, contents = own, _own_checkpoint(own)
        started = ""
        if cfg.ckpt_path and Path(cfg.ckpt_path).resolve() != own.resolve():
            started = f", not from ckpt_path={cfg.ckpt_path}, which started it"
        log.info(f"continuing from this run's own {own} (step {contents.get('global_step')}){started}")
    elif cfg.ckpt_path:
        path = Path(cfg.ckpt_path)
        contents = read_checkpoint(path)
    else:
        return None
    _check_same_model(cfg, path, contents)
    return str(path)


def _own_checkpoint(path: Path) -> dict[str, Any]:
    """The run dir's last.ckpt; unreadable, it is left as it is and the ways out are named."""
    try:
        contents = read_checkpoint(path)
        if not isinstance(contents, dict) or not {"state_dict", "hyper_parameters", "loops"} <= contents.keys():
            raise UserError(f"{path} is not a checkpoint of this project (no training state in it)")
        return contents
    except UserError as err:
        older = sorted((p for p in path.parent.glob("*.ckpt") if p != path), key=lambda p: p.stat().st_mtime)
        fallback = f", or continue from an older checkpoint of this run: ckpt_path={older[-1]}" if older else ""
        raise UserError(
            f"{err} (this run's own checkpoint, left untouched); to start the run over add resume=never "
            f"(last.ckpt will then be replaced), or move the file away{fallback}"
        ) from None


def starting_model(cfg: DictConfig, **model_kwargs: Any) -> Classifier:
    """The model a run starts with: the one saved in `ckpt_path` (`mode=eval`), else a fresh one from the
    config, with the weights of `init_from` when given."""
    if cfg.mode == "eval":
        return load_classifier(cfg.ckpt_path)
    model = build_model(cfg, **model_kwargs)
    if cfg.get("init_from"):
        load_weights(model, cfg.init_from)
    return model


def load_weights(model: Classifier, path: str | Path) -> None:
    """Start from the weights of a checkpoint (`init_from=`): optimizer, schedule and step count start fresh."""
    path = Path(path)
    contents = read_checkpoint(path)
    saved = contents.get("hyper_parameters", {}).get("net")
    if saved != model.hparams.net:
        raise UserError(
            f"init_from={path} holds another model ({_describe_net(saved)}) than this run ({_describe_net(model.hparams.net)}); "
            "pick the matching model=..."
        )
    model.check_task_sizes(contents.get("hyper_parameters", {}), f"init_from={path}")
    model.load_state_dict(contents["state_dict"])


def _describe_net(net: Any) -> str:
    return describe(net) if isinstance(net, dict) else "no model config"


def _check_same_model(cfg: DictConfig, path: Path, contents: dict[str, Any]) -> None:
    saved = contents.get("hyper_parameters", {}).get("net")
    wanted = OmegaConf.to_container(cfg.model.net, resolve=True)
    if saved != wanted:
        raise UserError(
            f"{path} holds another model ({_describe_net(saved)}) than this run ({_describe_net(wanted)}); "
            "pick the matching model=..., or start fresh with resume=never / another run dir"
        )


# Settings a resumed run may change: how long it trains.
EXTENDABLE = ("trainer.max_epochs", "trainer.max_steps")


def resumed_config(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """With `resume=RUN_DIR`, that run's saved config; the command line may only extend training.

    Any other override that contradicts the saved run is refused, naming each key that differs.
    """
    if cfg.resume in ("auto", "never"):
        return cfg
    run_dir = Path(str(cfg.resume))
    saved_file = run_dir / "config.yaml"
    if not saved_file.is_file():
        raise UserError(
            f"resume={cfg.resume} is not the dir of an earlier run (no config.yaml there); "
            "pass a run dir (outputs/<date>/<time>), or use resume=auto / resume=never"
        )
    saved = OmegaConf.load(saved_file)
    differ = []
    for item in overrides:
        key = item.split("=", 1)[0].lstrip("+~")
        if key == "resume" or key.startswith("hydra") or key in EXTENDABLE:
            continue
        now, then = OmegaConf.select(cfg, key), OmegaConf.select(saved, key)
        as_plain = lambda v: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v  # noqa: E731
        if as_plain(now) != as_plain(then):
            differ.append(f"{key} (run: {as_plain(then)}, now: {as_plain(now)})")
    if differ:
        raise UserError(
            f"resume={run_dir} is a different experiment: {'; '.join(differ)}; "
            "drop those overrides to continue that run, or start a new one"
        )
    for key in EXTENDABLE:
        OmegaConf.update(saved, key, OmegaConf.select(cfg, key), force_add=True)
    # A copied or moved run dir is a run of its own: nothing it writes may land in the original.
    saved = OmegaConf.create(_moved(OmegaConf.to_container(saved), str(saved.paths.output_dir), str(run_dir.resolve())))
    OmegaConf.update(saved, "resume", "auto")
    return saved


def finished_result(cfg: DictConfig, output_dir: Path) -> dict[str, Any] | None:
    """The results of this run dir when it already finished with this very config (the same command run
    again): nothing is left to do. A grown budget or any other change continues the run instead."""
    import json

    files = [output_dir / name for name in ("results.json", "manifest.json", "config.yaml")]
    if cfg.mode != "train" or cfg.resume == "never" or not all(f.is_file() for f in files):
        return None
    if json.loads(files[1].read_text()).get("status") != "finished":
        return None
    if OmegaConf.to_container(OmegaConf.load(files[2])) != OmegaConf.to_container(cfg, resolve=True):
        return None
    return json.loads(files[0].read_text())


def _moved(value: Any, old: str, new: str) -> Any:
    """`value` with every path inside the `old` run dir rewritten into `new`."""
    if isinstance(value, str) and (value == old or value.startswith(old.rstrip("/") + "/")):
        return new + value[len(old) :]
    if isinstance(value, dict):
        return {k: _moved(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_moved(v, old, new) for v in value]
    return value
