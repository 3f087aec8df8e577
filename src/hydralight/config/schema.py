"""Typed schemas of the config tree, checked by Hydra when the config is composed.

A wrong type or an unknown choice (`optim.lr=abc`, `mode=tain`, `trainer.precision=bf17`) is refused
before any run dir exists, for a single run, `--cfg`, `plan=true` and every job of a sweep alike.
Checks that need arithmetic (divisibility, what the machine has) stay in the plan. No torch imports.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hydra.core.config_store import ConfigStore


def override_key(override: str) -> str:
    """The key a command-line override sets: `+model.x=1` -> `model.x`, `~data` -> `data`."""
    return override.split("=", 1)[0].lstrip("+~")


class Choice(str, Enum):
    """A closed set of string values; prints as the bare value."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


def choice(name: str, values: tuple[str, ...]) -> type[Choice]:
    # The functional API accepts values such as "bf16-mixed" that are not Python names.
    return Choice(name, [(v, v) for v in values])  # type: ignore[call-overload]


PRECISIONS = ("32-true", "16-mixed", "bf16-mixed", "bf16-true", "16-true", "64-true")
STRATEGIES = ("auto", "ddp", "ddp_spawn", "fsdp")
CHECKPOINT_FORMS = ("full", "sharded")
LR_SCALING = ("none", "linear", "sqrt")

Mode = choice("Mode", ("train", "eval", "predict"))
Direction = choice("Direction", ("max", "min"))
Accelerator = choice("Accelerator", ("auto", "cpu", "gpu", "cuda"))
StrategyName = choice("StrategyName", STRATEGIES)
CheckpointForm = choice("CheckpointForm", CHECKPOINT_FORMS)
Precision = choice("Precision", PRECISIONS)
LrScaling = choice("LrScaling", LR_SCALING)

# Trainer arguments that other groups own: one place to set each.
PLANNED = {
    "accelerator": "hardware.accelerator",
    "devices": "hardware.devices",
    "num_nodes": "hardware.num_nodes",
    "strategy": "strategy=<name>",
    "accumulate_grad_batches": "batch.max_per_device or batch.accumulation",
    "sync_batchnorm": "model.sync_batchnorm",
    "use_distributed_sampler": "`shards_by_rank = True` on a data module whose loaders shard by rank themselves (it "
    "is on for any other)",
    "default_root_dir": "hydra.run.dir (the run dir holds everything a run writes)",
    "logger": "logger=<name>",
    "callbacks": "callbacks.<name>",
    "plugins": "nothing (the run adds its checkpoint and cluster plugins)",
}


def set_by_plan(key: str, owner: str) -> str:
    """The one wording of a refused key that the plan decides."""
    return f"{key} is set by the plan; set {owner} instead"


# Values the plan gives a module, refused where a typed model config has no key for them.
PLANNED_MODEL = {"model.lr": "optim.lr", "model.seed": "seed"}


# Keys of lightning-hydra-template's configs and of hydra-optuna-sweeper's (what the template's search presets
# set) that this project spells otherwise: (whose key it is, what this project takes instead).
TEMPLATE = "lightning-hydra-template"
OPTUNA_PLUGIN = "hydra-optuna-sweeper"
TPE_ONLY = "nothing (the search samples with Optuna's TPE, its defaults)"
TEMPLATE_KEYS = {
    "optimized_metric": (TEMPLATE, "objective.metric (what a search optimizes, with objective.direction)"),
    "hydra.sweeper.sampler": (OPTUNA_PLUGIN, "hydra.sweeper.seed and hydra.sweeper.n_startup_trials (TPE)"),
    "hydra.sweeper.sampler.seed": (OPTUNA_PLUGIN, "hydra.sweeper.seed"),
    "hydra.sweeper.sampler.n_startup_trials": (OPTUNA_PLUGIN, "hydra.sweeper.n_startup_trials"),
    "hydra.sweeper.sampler._target_": (OPTUNA_PLUGIN, TPE_ONLY),
    "hydra.sweeper.sampler.consider_endpoints": (OPTUNA_PLUGIN, TPE_ONLY),
    "hydra.sweeper.sampler.multivariate": (OPTUNA_PLUGIN, TPE_ONLY),
    "hydra.sweeper.direction": (OPTUNA_PLUGIN, "objective.direction (max or min)"),
    "hydra.sweeper.search_space": (OPTUNA_PLUGIN, "hydra.sweeper.params"),
    "hydra.sweeper.custom_search_space": (OPTUNA_PLUGIN, "hydra.sweeper.params"),
    # A run trains, then tests its best checkpoint; testing alone is a mode of its own.
    "train": (TEMPLATE, "mode=train (the default) or mode=eval resume=<run dir> to only test a trained run"),
    "test": (TEMPLATE, "mode=eval resume=<run dir> (every training run tests its best checkpoint as it ends)"),
}
# lightning-hydra-template's trainer options, which this project's hardware and strategy groups stand for.
TEMPLATE_TRAINERS = {
    "gpu": "hardware=1gpu",
    "cpu": "hardware=cpu",
    "ddp": "hardware=4gpu (or hardware.devices=N) with strategy=ddp",
    "ddp_sim": "hardware=cpu hardware.devices=2 strategy=ddp",
}
# The groups whose options are added side by side: `group.<option>.KEY=` needs the option in the run first.
ADDED_GROUPS = {"callbacks": "default", "logger": "csv"}


def template_key(key: str) -> str | None:
    """The refusal of another tool's key that this project spells otherwise, else None."""
    if key not in TEMPLATE_KEYS:
        return None
    owner, instead = TEMPLATE_KEYS[key]
    return f"{key} is {owner}'s key; this project takes {instead} in its place"


def planned_trainer_key(key: str) -> str | None:
    """The refusal of `trainer.<key>` (or a typed model config's `model.lr`) when the plan owns it, else None."""
    if key in PLANNED_MODEL:
        return set_by_plan(key, PLANNED_MODEL[key])
    short = key.removeprefix("trainer.")
    return set_by_plan(f"trainer.{short}", PLANNED[short]) if key.startswith("trainer.") and short in PLANNED else None


@dataclass
class HardwareConf:
    accelerator: Accelerator = Accelerator.auto  # type: ignore[attr-defined]
    devices: Any = "auto"  # an integer or auto
    num_nodes: int = 1
    cpus_per_task: Any = "auto"  # an integer or auto
    mem_gb: Any = "auto"  # a number or auto
    # More CPU processes than this machine has cores, knowingly (the plan refuses them otherwise).
    oversubscribe: bool = False


@dataclass
class StrategyConf:
    name: StrategyName = StrategyName.auto  # type: ignore[attr-defined]
    find_unused_parameters: bool = False
    timeout_s: int = 1800
    # fsdp only: the submodules sharded one by one before the root (each child of a ModuleList/Sequential,
    # else the module itself), and how checkpoints are written (one file, or a folder of per-rank shards).
    shard: list[str] = field(default_factory=list)
    checkpoint: CheckpointForm = CheckpointForm.full  # type: ignore[attr-defined]


@dataclass
class BatchConf:
    global_size: int = 128
    max_per_device: int | None = None
    accumulation: Any = "auto"  # an integer or auto
    reference_size: int | None = None
    num_workers: Any = "auto"  # an integer or auto
    pin_memory: Any = "auto"  # true, false or auto
    drop_last: bool = True
    eval_size: int = 1000


@dataclass
class OptimConf:
    lr: float = 1.0e-3
    lr_scaling: LrScaling = LrScaling.none  # type: ignore[attr-defined]
    optimizer: Any = None  # a `_target_` spec, `_partial_: true`
    scheduler: Any = None


@dataclass
class ModuleOptions:
    """The project's options of any module's config (applied by the core, never passed to its constructor):
    a module option's schema extends it."""

    sync_batchnorm: bool = False
    invariant_dropout: bool = True


@dataclass
class TrainerConf:
    """Lightning Trainer arguments the user sets (the others are planned: see PLANNED)."""

    precision: Precision = Precision["32-true"]
    max_epochs: int | None = None
    min_epochs: int | None = None
    max_steps: int = -1
    min_steps: int | None = None
    max_time: Any = None  # "DD:HH:MM:SS" or {hours: 1}
    limit_train_batches: Any = None  # int: batches, float: fraction
    limit_val_batches: Any = None
    limit_test_batches: Any = None
    limit_predict_batches: Any = None
    overfit_batches: Any = 0.0
    val_check_interval: Any = None
    check_val_every_n_epoch: int | None = 1
    num_sanity_val_steps: int | None = None
    log_every_n_steps: int | None = None
    enable_checkpointing: bool | None = None
    enable_progress_bar: bool | None = None
    enable_model_summary: bool | None = None
    gradient_clip_val: float | None = None
    gradient_clip_algorithm: str | None = None
    deterministic: Any = None  # true, false or "warn"
    benchmark: bool | None = None
    inference_mode: bool = True
    profiler: Any = None  # a name or a `_target_` spec
    detect_anomaly: bool = False
    barebones: bool = False
    reload_dataloaders_every_n_epochs: int = 0
    fast_dev_run: Any = False  # true or a number of batches
    enable_autolog_hparams: bool = True
    model_registry: str | None = None


@dataclass
class PathsConf:
    root_dir: str = "."
    # None where Hydra runs no job (`--cfg job --resolve`): its ${hydra:runtime.output_dir} is not set there.
    output_dir: str | None = "."
    data_dir: str = "data"
    log_dir: str | None = "."
    work_dir: str = "."


@dataclass
class ClusterConf:
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    timeout_min: int = 60
    signal_delay_s: int = 120
    max_requeues: int = 3
    sbatch: dict[str, Any] = field(default_factory=dict)
    setup: list[str] = field(default_factory=list)


@dataclass
class ObjectiveConf:
    """What `main` returns to a sweeper: a validation metric, never a test one."""

    metric: str = "val/acc"
    direction: Direction = Direction.max  # type: ignore[attr-defined]


@dataclass
class ExtrasConf:
    """Conveniences at the start of a run, as lightning-hydra-template's `extras` names them."""

    ignore_warnings: bool = False  # Python warnings are not shown
    enforce_tags: bool = False  # a run without `tags` is refused
    print_config: bool = False  # the composed config is printed before the run starts


@dataclass
class PredictConf:
    """`mode=predict`: what to predict on (null: the test split of the data)."""

    source: str | None = None  # a folder of images (class folders optional), or a text file for charlm


@dataclass
class TrainConf:
    seed: int = 42
    mode: Mode = Mode.train  # type: ignore[attr-defined]
    ckpt_path: str | None = None
    init_from: str | None = None
    resume: str = "auto"  # auto, never or a run dir
    plan: bool = False
    # Labels of the run (the manifest, wandb's run tags) and the name of its task (recorded), as
    # lightning-hydra-template's experiments set them.
    tags: list[str] = field(default_factory=list)
    task_name: str = "train"
    extras: ExtrasConf = field(default_factory=ExtrasConf)
    objective: ObjectiveConf = field(default_factory=ObjectiveConf)
    predict: PredictConf = field(default_factory=PredictConf)
    hardware: HardwareConf = field(default_factory=HardwareConf)
    strategy: StrategyConf = field(default_factory=StrategyConf)
    trainer: TrainerConf = field(default_factory=TrainerConf)
    batch: BatchConf = field(default_factory=BatchConf)
    optim: OptimConf = field(default_factory=OptimConf)
    paths: PathsConf = field(default_factory=PathsConf)
    cluster: ClusterConf = field(default_factory=ClusterConf)
    # Groups whose options bring their own schema (`defaults: [schema]` in the option), or none.
    model: Any = None
    data: Any = None
    logger: dict[str, Any] = field(default_factory=dict)
    callbacks: dict[str, Any] = field(default_factory=dict)


def register(options: Mapping[str, type] | None = None) -> None:
    """Put the schemas where the config files name them: `- train_schema`, and each of `options` (the typed
    configs that model and data options extend, `- /schema@_here_: <name>`) under its name."""
    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainConf)
    # In a group of their own, so that they are no options of `model` or `data` (a glob() would pick them).
    for name, node in (options or {}).items():
        store.store(group="schema", name=name, node=node)


def explain(err: BaseException, overrides: list[str]) -> str:
    """One line for a composition error: the key, the value and what is allowed."""
    causes = []
    while err is not None:
        causes.append(err)
        err = err.__cause__ or err.__context__  # type: ignore[assignment]
    text = " ".join(str(c) for c in causes)
    key_match = re.search(r"full_key: (\S+)", text)
    key = key_match.group(1) if key_match else None
    given = {override_key(o): o.split("=", 1)[1] for o in overrides if "=" in o}
    where = f"{key}={given[key]}" if key in given else key
    if m := re.search(r"Invalid value '(.*?)', expected one of \[(.*?)\]", text):
        return f"{key}={m.group(1)} is not allowed; use one of {m.group(2)}"
    if m := re.search(r"Value '(.*?)' (?:of type '\w+' )?could not be converted to (\w+)", text):
        kind = {"Integer": "an integer", "Float": "a number", "Boolean": "true or false"}.get(m.group(2), m.group(2))
        return f"{key}={m.group(1)} is not {kind}; give {key} {kind}"
    if m := re.search(r"Multiple values for ([\w/.]+)\. To override a value use 'override [\w/.@]+: (.*?)'", text):
        group, value = m.group(1), m.group(2)
        return (
            f"+{group}={value} adds a second {group} to the one the config chooses; choose it instead: {group}={value}"
        )
    if m := re.search(r"Ambiguous value for argument '(.*?)'", text):
        return f"{m.group(1)} holds a list of values: add -m to sweep over them, or quote it (key='a,b') as one value"
    if m := re.search(r"Value '(.*?)' is not a valid bool", text):
        return f"{key}={m.group(1)} is not true or false; give {key} true or false"
    if re.search(r"Non optional field cannot be assigned None|field '[\w.]+' is not Optional", text):
        return f"{key}=null is not allowed; give {key} a value"
    m = re.search(r"Could not override '([\w.-]+)'\.\s*To append to your config use \+", text)
    if m and given.get(m.group(1), "").lstrip().startswith("{"):  # a dict given to a dict key (not a typo)
        name, value = m.group(1), given[m.group(1)]
        return (
            f"{name}={value} adds keys to {name}, which an override can only replace: write "
            f"'++{name}={value}' (or +{name}.KEY=VALUE for one key)"
        )
    if m := re.search(r"Key '(\w+)' not in '(\w+)'|Key '(\w+)' is not in struct", text):
        name = key or m.group(1) or m.group(3)
        group, continued = name.split(".")[0], given.get("resume", "auto") not in ("auto", "never")
        if continued and group in ("model", "data") and not any(k in given for k in (group, "experiment")):
            # The command line is composed from the defaults before the run's own config is read.
            return (
                f"{name} is not a key of the default {group} config; resume={given['resume']} continues with that "
                f"run's own config: drop {name}, or name the run's {group}= option too"
            )
        from_file = not any(k.split(".")[0] == name for k in given)
        known = planned_trainer_key(name) or template_key(name)  # another template's habit: said as such
        if not known and "." not in name and (from_file or (name in given and _options(name))):
            # Added by a config file (a config group of the user's, an experiment's block), not a command-line key.
            source = f"the option {name}={given[name]}" if name in given else "a config file"
            return (
                f"{source} adds the top-level key {name}, which the run's config does not have: a config file sets "
                f"keys the config has (--cfg job lists them), so a misspelt one is refused; add keys of your own from "
                f"the command line (+{name}.KEY=VALUE)"
            )
        return known or unknown_key(name)
    if "Config group override must be a string or a list. Got NoneType" in text:
        group = next((k for k, v in given.items() if v in ("null", "None") and "." not in k), None)
        if group is not None:
            options = _options(group)
            own = f", or name your own with {group}._target_=..." if group in ("model", "data") else ""
            return f"{group}=null: the {group} group needs one of its options ({', '.join(options)}); pick one{own}"
    if m := re.search(r"Could not load '([\w/]+)/([^']+)'", text):  # an option misspelt in a list of them
        group, name = m.group(1).split("/")[-1], m.group(2)
        if options := _options(m.group(1)):
            return not_an_option(group, name, ", ".join(options))
    if re.search(r"Invalid value assigned: \w+ is not a ListConfig", text) and key in given:
        return f"{key}={given[key]} is not a list; write {key}=[{given[key]}]"
    if "Config group override must be a string or a list" in text:  # `precision=16`: a number for an option name
        for item in overrides:
            group, _, value = item.lstrip("+~").partition("=")
            if re.fullmatch(r"[\w]+", group) and re.fullmatch(r"[\d.eE+-]+", value) and (options := _options(group)):
                return not_an_option(group, value, ", ".join(options))
    if m := re.search(r"Could not find '([\w/]+)/([^']+)'(?s:.*?)Available options in '[\w/]+':\n((?:\t.*\n?)*)", text):
        options = ", ".join(o.strip() for o in m.group(3).split() if o.strip())
        # Hydra's own groups are named with their path on the command line (hydra/launcher=...).
        group = m.group(1) if m.group(1).startswith("hydra/") else m.group(1).split("/")[-1]
        return not_an_option(group, m.group(2), options)
    first = next((line.strip() for line in str(causes[-1]).splitlines() if line.strip()), type(causes[-1]).__name__)
    return f"{where}: {first}" if where else first


def unknown_key(name: str) -> str:
    """The refusal of a key the config does not have: with the option to add first when it is an option of a
    group whose options are added side by side (`callbacks.early_stopping.patience=1`)."""
    group, _, rest = name.partition(".")
    option = rest.split(".")[0]
    if group in ADDED_GROUPS and option in _options(group):
        return (
            f"{name} belongs to the {group} option {option}, which this run does not have: add it first, "
            f"'{group}=[{ADDED_GROUPS[group]},{option}]', then set its keys ({group}.{option}.KEY=VALUE)"
        )
    return f"{name} is not a config key; check the spelling (`--cfg job` prints the config)"


def not_an_option(group: str, name: str, options: str) -> str:
    """The refusal of `group=name` naming the group's options (and, for another template's habit, this project's
    way to say it)."""
    habit = (
        f" (lightning-hydra-template's trainer={name} is {TEMPLATE_TRAINERS[name]} here)"
        if (group == "trainer" and name in TEMPLATE_TRAINERS)
        else ""
    )
    return f"{group}={name} is not an option of {group}; use one of {options}{habit}"


def _options(group: str) -> list[str]:
    """The options of a config group: the shipped ones and those of ./conf."""
    from hydralight.config.folders import SHIPPED_CONF, user_conf

    folders = [SHIPPED_CONF / group, *([user / group] if (user := user_conf()) is not None else [])]
    return sorted({path.stem for folder in folders if folder.is_dir() for path in folder.glob("*.yaml")})
