"""Resume decisions in one place: what a run starts from and whether it may.

The run plan names the checkpoint (hydralight.config.resolve: this run's own last.ckpt wins once it exists,
then `ckpt_path`; `resume=never`; `resume=RUN_DIR`; a finished run does nothing). Here, before anything is
written, that checkpoint is read without running pickled code and checked against the module this run
builds: the same module and network, the same data sizes and global batch, the same hyperparameters
(a new learning rate is the one change a continued run may make, hydralight.resume.state). `init_from`
loads weights only; `mode=eval` and `mode=predict` rebuild the module a checkpoint holds. Every refusal is one line that
names the way out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import pickle
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.model_helpers import is_overridden

from hydralight.config.declaration import ModuleDeclaration
from hydralight.config.plan import ModelPlan, RunPlan
from hydralight.config.resolve import chosen_by
from hydralight.config.schema import override_key
from hydralight.config.trust import check_trusted, configured_targets
from hydralight.errors import UserError
from hydralight.resume.state import RECORD, ResumeState, new_run_from, plain_hparams, plain_value
from hydralight.rundir.layout import RunDir, not_a_checkpoint_file
from hydralight.training.modules import build_module
from hydralight.training.records import objective_checkpoint

log = logging.getLogger(__name__)

# A module's hyperparameters and the config keys a user changes them with, for messages.
CONFIG_KEYS = {"lr": "optim.lr", "optimizer": "optim.optimizer", "scheduler": "optim.scheduler"}


def describe(spec: Any) -> str:
    """A `_target_` config in one short phrase: `Adam(weight_decay=0.0)`, `MLP(hidden=[128, 256])`."""
    if not isinstance(spec, dict):
        return str(spec) if spec is not None else "none"
    target = str(spec.get("_target_", "?")).rsplit(".", 1)[-1]
    args = ", ".join(f"{k}={v}" for k, v in spec.items() if not k.startswith("_"))
    return f"{target}({args})"


@contextlib.contextmanager
def _readable(path: Path, label: str) -> Iterator[None]:
    """Turn a missing file, or any failure to load it, into one clear line naming `label`."""
    if (problem := not_a_checkpoint_file(path)) is not None:
        raise UserError(f"{label} {problem}")
    try:
        yield
    except UserError:
        raise
    except pickle.UnpicklingError:  # torch's weights-only refusal: its advice (load it unsafely) is not repeated
        raise UserError(
            f"{label} is not a checkpoint of this project (it holds pickled objects other than tensors and plain "
            "data, which are never loaded: code could run as they are)"
        ) from None
    except Exception as err:  # arbitrary bytes make torch.load fail in arbitrary ways
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"{label} is not a checkpoint of this project ({reason[:200]})") from None


def read_checkpoint(path: str | Path, label: str | None = None) -> dict[str, Any]:
    """A checkpoint's contents, loaded without running pickled code (tensors and plain containers only)."""
    path = Path(path)
    with _readable(path, label or str(path)):
        if not zipfile.is_zipfile(path):  # torch.save has written zip archives since torch 1.6
            raise ValueError("not a file torch.save writes")
        contents = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        if not isinstance(contents, dict) or "state_dict" not in contents:
            raise ValueError("no model weights in it")
        return contents


def saved_hparams(contents: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's hyperparameters as plain data (tuples as lists)."""
    return plain_value(dict(contents.get("hyper_parameters") or {}))


def record_of(contents: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint says it holds: module, model config, data sizes, global batch (nothing, for a
    checkpoint written outside this project's runs)."""
    if RECORD in contents:
        return plain_value(contents[RECORD])
    return {"module": None, "model": None, "sizes": {}, "global_size": None}


# Data settings that say where and how the data is read, not what it is: a continued run (requeued on another
# node, say) may read it elsewhere, or otherwise.
_WHERE_DATA_IS = ("dir", "root", "path", "download", "url", "loader", "memory", "cache")


class Resume:
    """The run's resume decision, carried out in three steps around the module the run builds (hydralight.training
    builds it): `model`, what to build; `load`, the checkpoint checked against it and its weights loaded; `save`,
    what checkpoints hold and how a continued run applies its changes. `ckpt_path` is what `fit` continues from."""

    def __init__(self, plan: RunPlan) -> None:
        self.plan = plan
        self.decision = plan.resume
        self._held: dict[str, Any] | None = None  # mode=eval/predict: the checkpoint whose module is built
        self._contents: dict[str, Any] | None = None

    @property
    def ckpt_path(self) -> str | None:
        return self.decision.continue_from

    @property
    def _tests_a_checkpoint(self) -> bool:
        return self.decision.mode in ("eval", "predict")

    def record(self, sizes: dict[str, Any]) -> dict[str, Any]:
        """What this run's checkpoints say they hold: the module and its config, the data sizes and global
        batch it is trained for, and the project's options applied to it."""
        return {
            "module": self.plan.model.spec.get("_target_"),
            "model": self.plan.model.spec,
            "sizes": {k: list(v) if isinstance(v, tuple) else v for k, v in sizes.items()},
            "global_size": self.plan.task.global_size,
            # What else a continuation must keep: the data the run draws, and what its best checkpoint is by.
            "seed": self.plan.seed,
            "data": self.plan.data.spec,
            "objective": [self.plan.objective.metric, self.plan.objective.direction],
            "options": {
                "invariant_dropout": self.plan.model.invariant_dropout,
                "global_batchnorm": self.plan.global_batchnorm,
            },  # fmt: skip
        }

    # -- 1. what the run builds -----------------------------------------------------------------------

    def model(self, sizes: dict[str, Any]) -> tuple[RunPlan, dict[str, Any]]:
        """The plan whose model slice the run builds, and the data sizes it is built for: this run's own; for
        `mode=eval` and `mode=predict`, the module the checkpoint holds, as it was trained (checked before any of
        its classes is imported; the records then name the module a checkpoint holds, not the option's default)."""
        if not self._tests_a_checkpoint:
            return self.plan, sizes
        path = Path(str(self.decision.ckpt_path))
        contents = self._tested()
        # A model the command line asks for, other than the one the checkpoint records, would be ignored (how it
        # runs, compiled or channels-last, leaves the weights and the results as they are).
        then, now = record_of(contents).get("model") or {}, self.plan.model.spec
        how = ModuleDeclaration.of(then or now).how_it_runs
        differing = _asked_otherwise(then, now, self.plan.paths.overrides, how) if then else []
        if differing:
            key, asks = differing[0]
            uses = "tests" if self.decision.mode == "eval" else "predicts with"
            raise UserError(
                f"mode={self.decision.mode} {uses} the module {path} holds, built as it was trained, but the command "
                f"line asks for another ({key} differs: {asks}), which would be ignored; drop it (to train that model "
                f"from the checkpoint's weights, when they fit it: init_from={path})"
            )
        model = model_of(contents, self.plan.model)
        check_built_from(contents, model, configured_targets(self.plan.config), f"ckpt_path={path}")
        # How it runs is this run's choice: a compiled run's checkpoint tests uncompiled unless asked otherwise, and
        # what the command line sets is taken whether or not the training run's config listed it.
        asked = {key.split(".")[1] for o in self.plan.paths.overrides if (key := override_key(o)).startswith("model.")}
        runs = {k: now[k] for k in how if k in now and (k in model.spec or k in asked)}
        model = dataclasses.replace(model, spec={**model.spec, **runs})
        check_sizes(record_of(contents), sizes, f"ckpt_path={path}")  # before a module of another size is built
        self._held = contents
        config = {**self.plan.config, "model": {**self.plan.config.get("model", {}), **model.spec}}
        self.plan = self.plan.replace(model=model, config=config)
        return self.plan, {**sizes, **(record_of(contents).get("sizes") or {})}

    def _tested(self) -> dict[str, Any]:
        """mode=eval/predict: the checkpoint tested, read once."""
        if self._contents is None:
            path = Path(str(self.decision.ckpt_path))
            if any(override_key(o) == "ckpt_path" for o in self.plan.paths.overrides):
                self._contents = read_checkpoint(path, f"ckpt_path={path}")
                return self._contents
            try:  # the one the run's results name as its best: the user named the run, not the file
                self._contents = read_checkpoint(path)
            except UserError as err:
                others = sorted(str(p) for p in path.parent.glob("*.ckpt") if p != path)
                way = (
                    f"test another of its checkpoints: ckpt_path={others[-1]} in place of resume="
                    if others
                    else ("train it again")
                )
                raise UserError(f"the run's best checkpoint {err}; {way}") from None
        return self._contents

    def check_data(self) -> None:
        """Before the data is built (or downloaded): a checkpoint is tested (or predicts) on the data module it was
        trained with unless the command line names other data; without a word, another data module (the shipped
        default) would take its place silently."""
        if not self._tests_a_checkpoint:
            return
        path = Path(str(self.decision.ckpt_path))
        then, now = record_of(self._tested()).get("data"), self.plan.data.spec
        named = any(override_key(o).split(".")[0] in ("data", "experiment") for o in self.plan.paths.overrides)
        if then is None or named or then.get("_target_") == now.get("_target_"):
            return
        option = chosen_by(RunDir.at(path.parent.parent), "data") if path.parent.name == "checkpoints" else None
        raise UserError(
            f"mode={self.decision.mode} would read {now.get('_target_')}, but {path} was trained on "
            f"{then.get('_target_')}; name the data to use: data={option or '<the option it was trained with>'}, "
            "or another data= to evaluate it elsewhere"
        )

    @property
    def global_batchnorm(self) -> bool:
        """BatchNorm over every rank (`model.sync_batchnorm` on CPU): this run's choice, or the tested checkpoint's
        (its layers were trained so)."""
        options = (record_of(self._held).get("options") or {}) if self._held is not None else {}
        return self.plan.global_batchnorm or bool(options.get("global_batchnorm", False))

    # -- 2. before anything is written ----------------------------------------------------------------

    def load(self, module: pl.LightningModule, sizes: dict[str, Any]) -> None:
        """Check the checkpoint this run starts from against the module built: its weights loaded for `init_from`,
        `mode=eval` and `mode=predict`; only checked for the checkpoint `fit` continues from (Lightning loads it)."""
        decision = self.decision
        if self._held is not None:
            label = f"ckpt_path={decision.ckpt_path}"
            load_weights(module, self._held, label)
            self._check_compatible(self._held, module, sizes, label, continuing=False)
        elif decision.continue_from is not None:
            path = Path(decision.continue_from)
            contents = self._own(path) if decision.own else read_checkpoint(path, f"ckpt_path={path}")
            if decision.own:
                given = decision.ckpt_path
                started = (
                    f"; ckpt_path={given} is not read: a run dir that has saved goes on from its own checkpoint (a "
                    "rerun, a requeue); to start from that file, use a new run dir"
                    if given and Path(given).resolve() != path.resolve()
                    else ""
                )
                log.info(f"continuing from this run's own {path} (step {contents.get('global_step')}){started}")
            self._check_compatible(contents, module, sizes, path, continuing=True)
        elif decision.init_from:
            path = Path(decision.init_from)
            contents = read_checkpoint(path, f"init_from={path}")
            self._check_compatible(contents, module, sizes, f"init_from={path}", continuing=False)
            load_weights(module, contents, f"init_from={path}")

    def _own(self, path: Path) -> dict[str, Any]:
        """The run dir's last.ckpt; unreadable, it is left as it is and the ways out are named."""
        try:
            contents = read_checkpoint(path)
            if not {"state_dict", "loops"} <= contents.keys():
                raise UserError(f"{path} is not a checkpoint of this project (no training state in it)")
            return contents
        except UserError as err:
            older = sorted((p for p in path.parent.glob("*.ckpt") if p != path), key=lambda p: p.stat().st_mtime)
            fallback = f" (then ckpt_path={older[-1]} continues from this run's older checkpoint)" if older else ""
            raise UserError(
                f"{err} (this run's own checkpoint, left untouched); to start the run over add resume=never "
                f"(it will then be replaced), or move the file away{fallback}"
            ) from None

    def _check_compatible(
        self,
        contents: dict[str, Any],
        module: pl.LightningModule,
        sizes: dict[str, Any],
        source: Any,
        continuing: bool,
    ) -> None:
        then = record_of(contents)
        target = self.plan.model.spec.get("_target_")
        then_hparams = saved_hparams(contents)
        now_hparams = plain_hparams(dict(module.hparams), self.plan.model.spec)
        way_out = "pick the matching model=..., or start fresh in another run dir"
        if then["module"] is not None and then["module"] != target:
            raise UserError(f"{source} holds another module ({then['module']}) than this run ({target}); {way_out}")
        # The networks a module's config names (not the plan's optimizer or schedule) are what the model is.
        for key in sorted((_nested_targets(then_hparams) | _nested_targets(now_hparams)) - set(CONFIG_KEYS)):
            if then_hparams.get(key) != now_hparams.get(key):
                raise UserError(
                    f"{source} holds another model ({describe(then_hparams.get(key))}) than this run "
                    f"({describe(now_hparams.get(key))}); {way_out}"
                )
        check_sizes(then, sizes, source)
        if not continuing:
            return
        size = then.get("global_size")
        if size is not None and size != self.plan.task.global_size:
            raise UserError(
                f"{source} was trained with a global batch of {size}, this run uses {self.plan.task.global_size}; "
                f"continue with batch.global_size={size}, or {new_run_from(source, 'its weights')}"
            )
        self._check_same_run(then, source)
        fresh = f"or {new_run_from(source, 'its weights and a fresh optimizer')}"
        for key in sorted(set(then_hparams) & set(now_hparams) - {"lr"}):
            if then_hparams[key] != now_hparams[key]:
                name = CONFIG_KEYS.get(key, f"model.{key}")
                raise UserError(
                    f"{name} differs from the one {source} was trained with ({describe(then_hparams[key])}, now "
                    f"{describe(now_hparams[key])}); keep it to continue that run, {fresh}"
                )

    def _check_same_run(self, then: dict[str, Any], source: Any) -> None:
        """What a continued run must keep besides its model and batch (checkpoints of earlier versions do not
        record it): the seed (it draws the data split and order), the data's own settings but where it is read
        from, and the objective its best checkpoint so far was chosen by."""
        new_run = "or start a new run in another run dir"
        if "seed" in then and then["seed"] != self.plan.seed:
            raise UserError(
                f"seed={self.plan.seed} differs from the seed {source} was trained with ({then['seed']}), which "
                f"draws its data split and order; keep seed={then['seed']} to continue that run, {new_run}"
            )
        data, now = then.get("data"), self.plan.data.spec
        if data is None:  # recorded by an earlier version: nothing to compare with
            data = now
        for key in sorted(set(data) | set(now)):
            if not any(part in key for part in _WHERE_DATA_IS) and data.get(key) != now.get(key):
                raise UserError(
                    f"data.{key} differs from the one {source} was trained with ({data.get(key, 'not set')}, now "
                    f"{now.get(key, 'not set')}): the data it trains and validates on would change; keep it to continue that "
                    f"run, {new_run}"
                )
        objective = [self.plan.objective.metric, self.plan.objective.direction]
        if "objective" in then and list(then["objective"]) != objective:
            raise UserError(
                f"objective {' '.join(reversed(objective))} differs from the one {source} chose its best checkpoint "
                f"by ({' '.join(reversed(list(then['objective'])))}); keep it to continue that run, {new_run}"
            )

    # -- 3. what checkpoints hold; the checkpoint tested ------------------------------------------------

    def save(self, sizes: dict[str, Any], into: dict[str, Any]) -> ResumeState:
        """The callback that writes this run's record into every checkpoint and applies a continued run's changes."""
        return ResumeState(self.record(sizes), into, finished_before=self.decision.finished_before)

    def to_test(self, trainer: pl.Trainer) -> str | None:
        """The checkpoint the test stage loads: `ckpt_path` for `mode=eval`; else the best by the objective,
        or (a module without validation) last.ckpt, the final weights."""
        if self.decision.mode == "eval":
            return self.decision.ckpt_path
        best = getattr(objective_checkpoint(trainer, self.plan.objective.metric), "best_model_path", None) or None
        if best is not None and not Path(best).exists():
            best = None  # ddp_spawn hands a rank's missing best path back to the main process as "None"
        last = RunDir.at(self.plan.paths.run_dir).last
        return best if best is not None or not last.is_file() else str(last)


def _select(spec: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        spec = spec.get(part) if isinstance(spec, dict) else None
    return spec


def _nested_targets(spec: dict[str, Any]) -> set[str]:
    """The keys of a config whose values are `_target_` specs (a module's network)."""
    return {k for k, v in spec.items() if isinstance(v, dict) and "_target_" in v}


def _asked_otherwise(
    then: dict[str, Any], now: dict[str, Any], overrides: list[str], how_it_runs: tuple[str, ...]
) -> list[tuple[str, str]]:
    """The model keys the command line asks for that differ from a checkpoint's model config, each with the
    override that asks: a `model=` option (or an `experiment=` preset) asks for its module (and the networks it
    names), `model.<key>=` for that key. How it runs (the module's `how_it_runs`) is this run's choice and asks for nothing."""
    asked = []
    for override in reversed(overrides):  # the last one of a key is the one that stands
        key = override_key(override)
        if key in ("model", "experiment"):  # an experiment preset picks its model too
            keys = ["_target_", *(f"{k}._target_" for k in sorted(_nested_targets(then) | _nested_targets(now)))]
        elif key.startswith("model.") and key.split(".")[1] not in how_it_runs:
            keys = [key.removeprefix("model.")]
        else:
            continue
        asked += [
            (f"model.{k.removesuffix('._target_')}", override) for k in keys if _select(then, k) != _select(now, k)
        ]
    return asked


def check_sizes(then: dict[str, Any], sizes: dict[str, Any], source: Any) -> None:
    """Refuse a checkpoint trained on data of other sizes (classes, input shape) than this run's."""
    saved_sizes = {k: v for k, v in (then.get("sizes") or {}).items() if k in sizes}
    now_sizes = {k: list(v) if isinstance(v, tuple) else v for k, v in sizes.items() if k in saved_sizes}
    if saved_sizes != now_sizes:
        shown = lambda s: ", ".join(f"{k} {v}" for k, v in sorted(s.items()))  # noqa: E731
        raise UserError(
            f"{source} was trained on data with {shown(saved_sizes)}, this run's data has {shown(now_sizes)}; "
            "pick the data it was trained on, or start a new run dir"
        )


def model_of(contents: dict[str, Any], fallback: ModelPlan) -> ModelPlan:
    """The model slice a checkpoint was trained with: its record's config, else `fallback`'s config (a
    checkpoint that records nothing)."""
    then = record_of(contents)
    hparams = saved_hparams(contents)
    spec = dict(then["model"]) if then.get("model") else dict(fallback.spec)
    trained = {k: v for k, v in hparams.items() if k in ("lr", "optimizer", "scheduler")}
    options = then.get("options") or {}
    return dataclasses.replace(
        fallback,
        spec=spec,
        offered={**fallback.offered, **trained},
        explicit={},
        replaced=None,
        invariant_dropout=options.get("invariant_dropout", fallback.invariant_dropout),
    )


def check_built_from(contents: dict[str, Any], model: ModelPlan, trusted: set[str], source: str) -> None:
    """Refuse, before any import, a checkpoint whose module would be built with a target the user's configs do
    not name: its module and network, the values it was trained with, the data sizes its constructor gets."""
    sizes = record_of(contents).get("sizes")
    check_trusted({"model": model.spec, "optim": model.offered, "sizes": sizes}, trusted, source)


def load_weights(module: pl.LightningModule, contents: dict[str, Any], label: str) -> None:
    """The checkpoint's weights into `module`; a module that builds its layers in `configure_model` builds them
    first, as Lightning's own `load_from_checkpoint` does (Lightning calls it again under a strategy: such a hook
    keeps layers it has already built)."""
    if is_overridden("configure_model", module) and set(contents["state_dict"]) - set(module.state_dict()):
        # A hook that needs its strategy's device mesh (it shards) fails here: its layers are built already.
        with contextlib.suppress(Exception):
            module.configure_model()
    try:
        module.load_state_dict(contents["state_dict"])
    except RuntimeError as err:  # missing or unexpected keys, other shapes
        first = [line.strip() for line in str(err).splitlines() if line.strip()][1:2] or [str(err)]
        raise UserError(f"{label}: its weights do not fit this model ({first[0][:200]})") from None


def load_module(path: str | Path, trusted: Iterable[str] = ()) -> pl.LightningModule:
    """The module a checkpoint of this project holds, with its weights, outside a run (read without running
    pickled code): `load_module("outputs/.../checkpoints/last.ckpt")`. The classes it names are built only when
    the project's configs, `./conf` or `trusted` (e.g. `["my_project.tasks.Regressor"]`) name them."""
    from hydralight.training.invariance import make_invariant

    contents = read_checkpoint(path)
    then = record_of(contents)
    if not then.get("model") and then["module"] is None:
        raise UserError(f"{path} does not say which module it holds; build the module yourself and load its state_dict")
    model = model_of(contents, ModelPlan(spec={}, offered={}))
    check_built_from(contents, model, configured_targets() | set(trusted), f"checkpoint={path}")
    module = build_module(model, dict(then.get("sizes") or {}))
    options = then.get("options") or {}
    make_invariant(module, model.invariant_dropout, bool(options.get("global_batchnorm", False)))
    load_weights(module, contents, f"checkpoint={path}")
    return module
