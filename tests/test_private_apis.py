"""Private and internal library APIs the project relies on, each checked the way the project uses it.

pytorch-lightning, hydra-core, hydra-submitit-launcher and submitit (and a few torch, torchmetrics and dstack
details) move such APIs between releases without a deprecation period. Every test below exercises one hook
and fails with a message naming the library version, the hook and the project file that depends on it, so an
upgrade that breaks one says where to look. Only the libraries are imported: the project's modules may move.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf, open_dict
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.loggers import Logger
from torch.utils.data import DataLoader, Dataset, Sampler, TensorDataset

# Lightning's hints (loader workers, log intervals, srun, its own deprecations) are noise for runs of a few batches.
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers"),
    pytest.mark.filterwarnings("ignore:.*log_every_n_steps"),
    pytest.mark.filterwarnings("ignore:.*is not empty"),
    pytest.mark.filterwarnings("ignore:.*srun"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),
]


class _Absent:
    def __repr__(self) -> str:
        return "<absent>"


ABSENT = _Absent()  # what a missing attribute or key reads as
ROOT = Path(__file__).resolve().parents[1]
RESOURCE_KEYS = ("nodes", "tasks_per_node", "gpus_per_node", "cpus_per_task", "mem_gb")


def version(lib: str) -> str:
    try:
        return metadata.version(lib.replace("_", "-"))
    except metadata.PackageNotFoundError:
        try:
            return str(getattr(importlib.import_module(lib), "__version__", "?"))
        except ImportError:
            return "(not installed)"


@dataclasses.dataclass(frozen=True)
class Hook:
    lib: str  # import name of the library that owns the API
    api: str  # what the project touches (a dotted path where it can be imported)
    user: str  # project files, ", "-separated: relative to src/hydralight/ unless they start with src/
    why: str

    def __post_init__(self) -> None:
        # The files named are the ones that use the API: a stale name would send the reader to the wrong place.
        for user in self.user.split(", "):
            path = ROOT / user if user.startswith("src/") else ROOT / "src" / "hydralight" / user
            assert path.is_file(), f"{self.api}: the project file {user} does not exist"

    def moved(self, detail: str = "") -> str:
        where = ", ".join(u if u.startswith("src/") else f"src/hydralight/{u}" for u in self.user.split(", "))
        return f"{self.lib} {version(self.lib)} moved {self.api} (used by {where} for {self.why})" + (
            f": {detail}" if detail else ""
        )


def reach(dotted: str) -> Any:
    """The object at a dotted path (longest importable module, then attributes), or ABSENT."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name, ABSENT)
            if obj is ABSENT:
                return ABSENT
        return obj
    return ABSENT


def dig(obj: Any, path: str) -> Any:
    """`obj.a.b.c` for path "a.b.c", or ABSENT where an attribute is missing."""
    for name in path.split("."):
        obj = getattr(obj, name, ABSENT)
        if obj is ABSENT:
            return ABSENT
    return obj


def item(mapping: Any, *keys: str) -> Any:
    """`mapping[k1][k2]...`, or ABSENT where a key is missing."""
    for key in keys:
        if not isinstance(mapping, dict) or key not in mapping:
            return ABSENT
        mapping = mapping[key]
    return mapping


def fits(fn: Callable[..., Any], nargs: int, keywords: tuple[str, ...]) -> bool:
    """Whether `fn(<nargs positionals>, **keywords)` binds to the signature (self/cls left out)."""
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    if params and params[0].name in ("self", "cls"):
        sig = sig.replace(parameters=params[1:])
    try:
        sig.bind(*range(nargs), **dict.fromkeys(keywords))
    except TypeError:
        return False
    return True


# --- Import paths ----------------------------------------------------------------------------------------------

IMPORTS = [
    Hook(
        "pytorch_lightning",
        "pytorch_lightning.strategies.launchers.subprocess_script._SubprocessScriptLauncher",
        "lightning_internals.py, training/strategy.py",
        "starting a job's extra DDP ranks from its saved config",
    ),
    Hook(
        "lightning_fabric",
        "lightning_fabric.utilities.rank_zero.rank_zero_only",
        "training/loggers.py",
        "forgetting rows of a failed attempt on rank 0 only",
    ),
    Hook(
        "lightning_fabric", "lightning_fabric.plugins.TorchCheckpointIO", "training/checkpoint_io.py", "atomic writes"
    ),
    Hook(
        "lightning_fabric",
        "lightning_fabric.plugins.environments.SLURMEnvironment",
        "training/trainer.py",
        "turning Lightning's own SLURM requeue off",
    ),
    Hook("hydra", "hydra.core.singleton.Singleton", "launch/launchers.py", "carrying Hydra's state into each job"),
    Hook("hydra", "hydra.core.utils.run_job", "launch/launchers.py", "running a sweep job in its submitit process"),
    Hook("hydra", "hydra.core.utils.setup_globals", "launch/launchers.py", "Hydra's resolvers in the job process"),
    Hook("hydra", "hydra.core.utils.filter_overrides", "launch/launchers.py", "logging each job's overrides"),
    Hook("hydra", "hydra.core.utils.JobReturn", "launch/launchers.py", "the launcher's return type"),
    Hook(
        "hydra",
        "hydra.core.hydra_config.HydraConfig",
        "train.py",
        "the job's overrides and dirs",
    ),
    Hook("hydra", "hydra.types.RunMode.MULTIRUN", "train.py", "telling a sweep job from a single run"),
    Hook(
        "hydra", "hydra.experimental.callback.Callback", "launch/summary.py", "the summary line at the end of a sweep"
    ),
    Hook(
        "hydra_submitit_launcher",
        "hydra_plugins.hydra_submitit_launcher.config.BaseQueueConf",
        "launch/launchers.py",
        "which launcher keys submitit takes unprefixed",
    ),
    Hook(
        "hydra_submitit_launcher",
        "hydra_plugins.hydra_submitit_launcher.config.SlurmQueueConf",
        "launch/launchers.py",
        "the base of the planned SLURM launcher's config",
    ),
    Hook(
        "hydra_submitit_launcher",
        "hydra_plugins.hydra_submitit_launcher.config.LocalQueueConf",
        "launch/launchers.py",
        "the base of the planned local launcher's config",
    ),
    Hook(
        "hydra_submitit_launcher",
        "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",
        "src/hydra_plugins/hydralight_launchers/__init__.py",
        "the base class of hydra/launcher=slurm",
    ),
    Hook(
        "hydra_submitit_launcher",
        "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher",
        "src/hydra_plugins/hydralight_launchers/__init__.py",
        "the base class of hydra/launcher=local",
    ),
    Hook("submitit", "submitit.core._submit", "launch/launchers.py", "the command written into dry-run sbatch scripts"),
    Hook(
        "dstack",
        "dstack._internal.core.models.configurations.parse_run_configuration",
        "launch/dstack.py",
        "validating the generated dstack tasks",
    ),
]


def test_hydra_reads_the_mode_through_the_hook_the_project_answers() -> None:
    """Hydra 1.3 composes the config once more to read `hydra.mode`; the project answers that call itself."""
    hook = Hook("hydra", "hydra._internal.hydra.Hydra.get_mode(config_name, overrides)", "config/hydra_internals.py",
                "telling Hydra the mode the command line's check read, instead of composing again")  # fmt: skip
    hydra_cls = reach("hydra._internal.hydra.Hydra")
    assert hydra_cls is not ABSENT, hook.moved("Hydra can no longer be imported from there")
    parameters = list(inspect.signature(dig(hydra_cls, "get_mode")).parameters)
    assert parameters == ["self", "config_name", "overrides"], hook.moved(f"its parameters are {parameters}")
    run_hydra = inspect.getsource(reach("hydra._internal.utils._run_hydra"))
    assert "get_mode(" in run_hydra, hook.moved("_run_hydra no longer asks for the mode this way")


def test_hydra_composes_a_run_through_the_hook_the_project_answers() -> None:
    """Hydra 1.3 composes a single run's config when it starts it; the project hands it the config its check
    composed, and does what Hydra's compose_config does after composing."""
    hook = Hook("hydra", "hydra._internal.hydra.Hydra.compose_config", "config/hydra_internals.py",
                "handing Hydra the run's config the command line's check composed, instead of composing again")  # fmt: skip
    hydra_cls = reach("hydra._internal.hydra.Hydra")
    assert hydra_cls is not ABSENT, hook.moved("Hydra can no longer be imported from there")
    parameters = list(inspect.signature(dig(hydra_cls, "compose_config")).parameters)
    expected = ["self", "config_name", "overrides", "run_mode", "with_log_configuration", "from_shell",
                "validate_sweep_overrides"]  # fmt: skip
    assert parameters == expected, hook.moved(f"its parameters are {parameters}")
    body = inspect.getsource(dig(hydra_cls, "compose_config"))
    after = body.split("load_configuration(", 1)[-1]
    for step in ("configure_log(cfg.hydra.hydra_logging, cfg.hydra.verbose)", "log = logging.getLogger(__name__)",
                 "self._print_debug_info(config_name, overrides, run_mode)"):  # fmt: skip
        assert step in after, hook.moved(f"after composing it no longer does {step}")
    assert "self.compose_config(" in inspect.getsource(dig(hydra_cls, "run")), hook.moved("run composes otherwise")
    run_app = inspect.getsource(reach("hydra._internal.utils._run_app"))
    assert 'overrides.extend(["hydra.mode=RUN"])' in run_app, hook.moved("a run's mode is no longer added this way")


def test_basic_sweeper_is_extended_as_the_default_sweeper() -> None:
    """The default sweeper checks every job before Hydra's sweep writes anything, reading the jobs as Hydra's
    sweep does (its config's params, then the command line's), and hands its launcher the loader it set up."""
    hook = Hook("hydra", "hydra._internal.core_plugins.basic_sweeper.BasicSweeper.sweep/_parse_config/setup",
                "config/hydra_internals.py, src/hydra_plugins/hydralight_launchers/__init__.py",
                "the default sweeper, which checks every job before the sweep writes its record")  # fmt: skip
    sweeper = reach("hydra._internal.core_plugins.basic_sweeper.BasicSweeper")
    assert callable(dig(sweeper, "validate_batch_is_legal")), hook.moved("it is gone")
    assert reach("hydra._internal.core_plugins.basic_sweeper.BasicSweeperConf") is not ABSENT, hook.moved("no conf")
    sweep = inspect.getsource(dig(sweeper, "sweep"))
    read = sweep.index("params_conf = self._parse_config()")
    assert read < sweep.index("params_conf.extend(arguments)") < sweep.index("multirun.yaml"), hook.moved(
        "sweep() no longer reads its jobs from _parse_config() + the arguments before writing its record"
    )
    setup = inspect.getsource(dig(sweeper, "setup"))
    assert "hydra_context=hydra_context" in setup and "self.hydra_context = hydra_context" in setup, hook.moved(
        "setup() no longer hands its launcher the context (the loader) it was given"
    )


@pytest.mark.parametrize("hook", IMPORTS, ids=[h.api for h in IMPORTS])
def test_import_path(hook: Hook) -> None:
    if hook.lib == "dstack":
        pytest.importorskip("dstack", reason="dstack is a dev extra (pip install -e '.[dev]')")
    assert reach(hook.api) is not ABSENT, hook.moved("it can no longer be imported from there")


# --- Call shapes: the positional count and keywords the project (or the library calling the project) uses ------

SIGNATURES = [
    (
        Hook("hydra", "hydra.core.utils.run_job", "launch/launchers.py", "running a sweep job in its submitit process"),
        0,
        ("hydra_context", "task_function", "config", "job_dir_key", "job_subdir_key"),
    ),
    (
        Hook("hydra", "hydra.core.utils.setup_globals", "launch/launchers.py", "Hydra's resolvers in the job process"),
        0,
        (),
    ),
    (Hook("hydra", "hydra.core.utils.filter_overrides", "launch/launchers.py", "logging each job's overrides"), 1, ()),
    (
        Hook(
            "hydra", "hydra.core.singleton.Singleton.get_state", "launch/launchers.py", "the state sent with each job"
        ),
        0,
        (),
    ),
    (
        Hook("hydra", "hydra.core.singleton.Singleton.set_state", "launch/launchers.py", "restoring it inside the job"),
        1,
        (),
    ),
    (
        Hook(
            "hydra",
            "hydra.core.config_loader.ConfigLoader.load_sweep_config",
            "launch/launchers.py",
            "composing each job's config (per-job resources, and the job itself)",
        ),
        2,
        (),
    ),
    (
        # Hydra's sweeper calls launch(batch, initial_job_idx=...) on the project's override.
        Hook(
            "hydra", "hydra.plugins.launcher.Launcher.launch", "launch/launchers.py", "the planned launchers' launch()"
        ),
        1,
        ("initial_job_idx",),
    ),
    (
        # Hydra calls it with config= and config_name=; the project's override takes config and **kwargs.
        Hook("hydra", "hydra.experimental.callback.Callback.on_multirun_end", "launch/summary.py", "the sweep summary"),
        0,
        ("config", "config_name"),
    ),
    (
        Hook(
            "hydra",
            "hydra.core.config_store.ConfigStore.store",
            "src/hydra_plugins/hydralight_launchers/__init__.py",
            "registering the hydralight launchers",
        ),
        0,
        ("group", "name", "node", "provider"),
    ),
    (
        Hook(
            "hydra_submitit_launcher",
            "hydra_plugins.hydra_submitit_launcher.submitit_launcher.BaseSubmititLauncher.setup",
            "launch/launchers.py",
            "the config, context and task function the planned launchers read",
        ),
        0,
        ("hydra_context", "task_function", "config"),
    ),
    (
        Hook("submitit", "submitit.AutoExecutor", "launch/launchers.py", "the executor of every sweep"),
        0,
        ("folder", "cluster", "slurm_max_num_timeout"),
    ),
    (
        Hook(
            "submitit",
            "submitit.slurm.slurm.SlurmExecutor._make_submission_file_text",
            "launch/launchers.py",
            "dry_run=true: writing the sbatch scripts without submitting",
        ),
        2,
        (),
    ),
    (
        Hook(
            "submitit",
            "submitit.local.local.LocalExecutor._make_submission_file_text",
            "launch/launchers.py",
            "dry_run=true with hydra/launcher=local",
        ),
        2,
        (),
    ),
    (
        Hook(
            "pytorch_lightning",
            "pytorch_lightning.strategies.launchers.subprocess_script._SubprocessScriptLauncher",
            "lightning_internals.py, training/strategy.py",
            "building the job-script launcher (cluster_environment, num_processes, num_nodes)",
        ),
        3,
        (),
    ),
    (
        Hook(
            "pytorch_lightning",
            "pytorch_lightning.strategies.launchers.subprocess_script._SubprocessScriptLauncher._call_children_scripts",
            "lightning_internals.py, training/strategy.py",
            "starting ranks 1..N-1 as `python -m hydralight.worker`",
        ),
        0,
        (),
    ),
    (
        Hook(
            "pytorch_lightning",
            "pytorch_lightning.loops.training_epoch_loop._TrainingEpochLoop._should_check_val_fx",
            "lightning_internals.py, resume/last_checkpoint.py",
            "whether a validation follows the batch that just ended (a periodic save waits for it)",
        ),
        1,
        (),
    ),
    (
        Hook(
            "pytorch_lightning",
            "pytorch_lightning.strategies.launchers.subprocess_script._SubprocessScriptLauncher._check_can_spawn_children",
            "lightning_internals.py, training/strategy.py",
            "the launcher's own guard before starting ranks",
        ),
        0,
        (),
    ),
    (
        Hook(
            "pytorch_lightning",
            "pytorch_lightning.strategies.DDPStrategy._configure_launcher",
            "lightning_internals.py, training/strategy.py",
            "swapping in the job-script launcher",
        ),
        0,
        (),
    ),
    (
        Hook(
            "pytorch_lightning",
            "pytorch_lightning.trainer.connectors.logger_connector.logger_connector._LoggerConnector"
            ".update_train_step_metrics",
            "lightning_internals.py, resume/preemption.py",
            "logging the last step's metrics before exiting on a signal",
        ),
        0,
        (),
    ),
    (
        Hook(
            "pytorch_lightning",
            "pytorch_lightning.loops.evaluation_loop._EvaluationLoop.run",
            "lightning_internals.py",
            "validating the final weights when training ended between validations",
        ),
        0,
        (),
    ),
    (
        Hook("pytorch_lightning", "pytorch_lightning.Trainer.fit", "train.py", "resuming with weights_only=True"),
        1,
        ("datamodule", "ckpt_path", "weights_only"),
    ),
    (
        Hook("pytorch_lightning", "pytorch_lightning.Trainer.test", "train.py", "testing with weights_only=True"),
        1,
        ("datamodule", "ckpt_path", "verbose", "weights_only"),
    ),
    (
        Hook(
            "lightning_fabric",
            "lightning_fabric.plugins.TorchCheckpointIO.save_checkpoint",
            "training/checkpoint_io.py",
            "the atomic checkpoint write Lightning calls",
        ),
        2,
        ("storage_options",),
    ),
    (
        Hook(
            "lightning_fabric",
            "lightning_fabric.plugins.environments.SLURMEnvironment",
            "training/trainer.py",
            "turning Lightning's own SLURM requeue off",
        ),
        0,
        ("auto_requeue",),
    ),
    (
        Hook(
            "lightning_fabric",
            "lightning_fabric.plugins.environments.SLURMEnvironment.detect",
            "training/trainer.py",
            "knowing when the job runs under srun",
        ),
        0,
        (),
    ),
    (
        Hook(
            "torch",
            "torch.load",
            "training/guards.py, resume/policy.py",
            "reading a checkpoint without unpickling code",
        ),
        1,
        ("map_location", "weights_only", "mmap"),
    ),
    (
        Hook(
            "dstack",
            "dstack._internal.core.models.configurations.parse_run_configuration",
            "launch/dstack.py",
            "validating the generated dstack tasks",
        ),
        1,
        (),
    ),
]


@pytest.mark.parametrize(("hook", "nargs", "keywords"), SIGNATURES, ids=[h.api for h, *_ in SIGNATURES])
def test_call_shape(hook: Hook, nargs: int, keywords: tuple[str, ...]) -> None:
    if hook.lib == "dstack":
        pytest.importorskip("dstack", reason="dstack is a dev extra (pip install -e '.[dev]')")
    fn = reach(hook.api)
    assert fn is not ABSENT, hook.moved("it is gone")
    used = ", ".join([*(["<arg>"] * nargs), *(f"{k}=..." for k in keywords)])
    assert fits(fn, nargs, keywords), hook.moved(f"called as ({used}); its signature is now {inspect.signature(fn)}")


# --- hydra-submitit-launcher configs and launchers -------------------------------------------------------------

QUEUE_FIELDS = [
    *(("BaseQueueConf", key, "launch/launchers.py", "resources set per job from its plan") for key in RESOURCE_KEYS),
    ("BaseQueueConf", "submitit_folder", "launch/launchers.py", "the executor's folder"),
    ("BaseQueueConf", "timeout_min", "conf/hydra/launcher/slurm.yaml", "the job time limit"),
    ("BaseQueueConf", "stderr_to_stdout", "conf/hydra/launcher/slurm.yaml", "one log per task"),
    ("SlurmQueueConf", "_target_", "launch/launchers.py", "pointing the config at the planned launcher"),
    ("SlurmQueueConf", "setup", "launch/launchers.py", "cluster.setup lines before srun"),
    ("SlurmQueueConf", "max_num_timeout", "launch/launchers.py", "the requeue count given to the executor"),
    ("SlurmQueueConf", "signal_delay_s", "conf/hydra/launcher/slurm.yaml", "the warning before the limit"),
    ("SlurmQueueConf", "partition", "conf/hydra/launcher/slurm.yaml", "cluster.partition"),
    ("SlurmQueueConf", "account", "conf/hydra/launcher/slurm.yaml", "cluster.account"),
    ("SlurmQueueConf", "qos", "conf/hydra/launcher/slurm.yaml", "cluster.qos"),
    ("SlurmQueueConf", "constraint", "conf/hydra/launcher/slurm.yaml", "cluster.constraint"),
    ("SlurmQueueConf", "additional_parameters", "conf/hydra/launcher/slurm.yaml", "cluster.sbatch"),
    ("LocalQueueConf", "_target_", "launch/launchers.py", "pointing the config at the planned launcher"),
    ("LocalQueueConf", "timeout_min", "conf/hydra/launcher/local.yaml", "the job time limit"),
    ("LocalQueueConf", "submitit_folder", "conf/hydra/launcher/local.yaml", "the executor's folder"),
]


@pytest.mark.parametrize(("conf", "field", "user", "why"), QUEUE_FIELDS, ids=[f"{c}.{f}" for c, f, *_ in QUEUE_FIELDS])
def test_queue_conf_field(conf: str, field: str, user: str, why: str) -> None:
    from hydra_plugins.hydra_submitit_launcher import config as queue

    hook = Hook("hydra_submitit_launcher", f"{conf}.{field}", user, why)
    cls = getattr(queue, conf, ABSENT)
    assert cls is not ABSENT, hook.moved(f"{conf} is gone")
    assert field in {f.name for f in dataclasses.fields(cls)}, hook.moved(f"{conf} has no field {field}")


def launcher_params(executor: str, folder: Path) -> tuple[str, int, dict[str, Any], dict[str, Any]]:
    """(folder, max_num_timeout, settings, resources) as the planned launchers derive them from the queue config."""
    from hydra_plugins.hydra_submitit_launcher import config as queue

    conf = {"slurm": queue.SlurmQueueConf, "local": queue.LocalQueueConf}[executor]
    params = OmegaConf.to_container(OmegaConf.structured(conf))
    params.pop("_target_")  # Hydra drops it when it instantiates the launcher
    params.update(name="job", submitit_folder=str(folder / "%j"))  # interpolations in the real config
    folder_ = params.pop("submitit_folder")
    max_num_timeout = params.pop("max_num_timeout", 0)
    # Keys of BaseQueueConf are submitit's generic names; the others take the executor's prefix.
    generic = set(OmegaConf.structured(queue.BaseQueueConf).keys())
    base = {k if k in generic else f"{executor}_{k}": v for k, v in params.items() if k not in RESOURCE_KEYS}
    # What a plan asks for: a 2x4-GPU SLURM job; a local job is one process that starts the other ranks itself.
    asked = {"slurm": (2, 4, 4, 3, 64), "local": (1, 1, None, 3, None)}[executor]
    resources = dict(zip(RESOURCE_KEYS, asked, strict=True))
    return folder_, max_num_timeout, base, resources


@pytest.mark.parametrize("executor", ["slurm", "local"])
def test_queue_conf_maps_onto_auto_executor(tmp_path: Path, executor: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real submissions: the launcher settings, prefixed as the planned launchers do it, given to AutoExecutor."""
    import submitit

    hook = Hook(
        "submitit",
        f"AutoExecutor(cluster={executor!r}) parameter names",
        "launch/launchers.py",
        "submitting the launcher's settings (generic names bare, the others with the executor's prefix)",
    )
    # The SLURM executor refuses to start where no srun is found; this test only needs its parameters.
    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 1), raising=False)
    folder, max_num_timeout, base, resources = launcher_params(executor, tmp_path)
    try:
        auto = submitit.AutoExecutor(
            folder=folder, cluster=executor, **{f"{executor}_max_num_timeout": max_num_timeout}
        )
        auto.update_parameters(**base, **resources)
    except Exception as err:  # submitit names the parameter it no longer knows
        pytest.fail(hook.moved(f"{type(err).__name__}: {err}"))


@pytest.mark.parametrize("executor", ["slurm", "local"])
def test_dry_run_script_writer(tmp_path: Path, executor: str) -> None:
    """dry_run=true: the executor itself, converted parameters and the job script, with no SLURM on the host."""
    import submitit

    hook = Hook(
        "submitit",
        f"{executor} executor: affinity / _convert_parameters / _internal_update_parameters / "
        "_make_submission_file_text(command, uid)",
        "launch/launchers.py",
        "dry_run=true: writing the sbatch scripts without submitting, on a host without SLURM",
    )
    folder, max_num_timeout, base, resources = launcher_params(executor, tmp_path)
    if executor == "slurm":

        class Refusing(submitit.SlurmExecutor):
            @classmethod
            def affinity(cls) -> int:
                return -1

        class ScriptWriter(submitit.SlurmExecutor):
            @classmethod
            def affinity(cls) -> int:
                return 1

        # The writer's affinity() override is what lets it start without srun: the executor must consult it.
        try:
            Refusing(folder, max_num_timeout=max_num_timeout)
            consulted = False
        except RuntimeError:
            consulted = True
        assert consulted, hook.moved("SlurmExecutor() no longer asks affinity() whether SLURM is there")
        writer: Any = ScriptWriter(folder, max_num_timeout=max_num_timeout)
    else:
        writer = submitit.LocalExecutor(folder)
    prefix = f"{executor}_"
    asked = {**base, **resources}
    try:
        params = writer._convert_parameters({k: v for k, v in asked.items() if not k.startswith(prefix)})
        params.update({k.removeprefix(prefix): v for k, v in asked.items() if k.startswith(prefix)})
        writer._internal_update_parameters(**params)
        text = writer._make_submission_file_text("python -u -m submitit.core._submit <folder>", "dry-run")
    except Exception as err:  # a method gone or renamed, or a parameter the executor no longer takes
        pytest.fail(hook.moved(f"{type(err).__name__}: {err}"))
    assert isinstance(text, str), hook.moved(f"it returned {type(text).__name__}, not the script text")
    if executor == "slurm":
        lines = (
            "--nodes=2",
            "--ntasks-per-node=4",
            "--gpus-per-node=4",
            "--cpus-per-task=3",
            "--mem=64GB",
            "--time=60",
        )
        for line in (*lines, "--job-name=job"):
            assert f"#SBATCH {line}" in text, hook.moved(f"the script lacks #SBATCH {line}:\n{text}")
        # The Preemption callback waits for SIGUSR2 (conf/callbacks/default.yaml): submitit must ask for it.
        signal = Hook(
            "submitit",
            "the SLURM warning signal (USR2, signal_delay_s ahead)",
            "lightning_internals.py, resume/preemption.py",
            "checkpointing and requeueing before the time limit",
        )
        assert f"--signal=USR2@{base['slurm_signal_delay_s']}" in text, signal.moved(f"the script says:\n{text}")


def test_submitit_launcher_base_class() -> None:
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher, SlurmLauncher

    hook = Hook(
        "hydra_submitit_launcher",
        "BaseSubmititLauncher._EXECUTOR / params / setup()",
        "launch/launchers.py",
        "the executor name, launcher settings, config and context the planned launchers read",
    )
    executors = (getattr(SlurmLauncher, "_EXECUTOR", ABSENT), getattr(LocalLauncher, "_EXECUTOR", ABSENT))
    assert executors == ("slurm", "local"), hook.moved(f"_EXECUTOR is now {executors}")
    launcher = SlurmLauncher(partition="p", additional_parameters=OmegaConf.create({"a": 1}))
    params = getattr(launcher, "params", ABSENT)
    assert params == {"partition": "p", "additional_parameters": {"a": 1}}, hook.moved(f"params is {params!r}")
    context, config = object(), OmegaConf.create({"x": 1})

    def task(cfg: Any) -> None:
        return None

    launcher.setup(hydra_context=context, task_function=task, config=config)
    seen = tuple(getattr(launcher, name, ABSENT) for name in ("hydra_context", "task_function", "config"))
    assert seen == (context, task, config), hook.moved("setup() no longer stores hydra_context/task_function/config")


# --- Hydra's job machinery, as the planned launchers drive it in a submitit process ------------------------------


def test_singleton_state_travels_with_cloudpickle() -> None:
    import cloudpickle
    from hydra.core.config_store import ConfigStore
    from hydra.core.singleton import Singleton

    hook = Hook(
        "hydra", "Singleton.get_state / set_state", "launch/launchers.py", "Hydra's global state inside each job"
    )
    store = ConfigStore.instance()
    store.store(group="private_apis", name="sent", node={"a": 1})
    # submitit pickles the job's arguments (this state among them) with cloudpickle.
    state = cloudpickle.loads(cloudpickle.dumps(Singleton.get_state()))
    store.store(group="private_apis", name="not_sent", node={"a": 1})
    Singleton.set_state(state)
    # The job sees the submitting process's state as it was sent, and nothing registered after.
    listed = ConfigStore.instance().list("private_apis")
    assert listed == ["sent.yaml"], hook.moved(f"the restored config store lists {listed}")


class _NoCallbacks:
    """What run_job needs of Hydra's callbacks object."""

    def on_job_start(self, **kwargs: Any) -> None:
        pass

    def on_job_end(self, **kwargs: Any) -> None:
        pass


def test_load_sweep_config_and_run_job(tmp_path: Path) -> None:
    """A sweep job composed with load_sweep_config, edited as the launcher does, and run through run_job."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import JobStatus, run_job, setup_globals
    from hydra.types import HydraContext

    load = Hook("hydra", "ConfigLoader.load_sweep_config", "launch/launchers.py", "composing each job's config")
    run = Hook(
        "hydra", "hydra.core.utils.run_job", "launch/launchers.py", "running a sweep job in its submitit process"
    )
    conf = tmp_path / "conf"
    conf.mkdir()
    sweep = tmp_path / "sweep"
    (conf / "job.yaml").write_text(f"x: 1\nhydra:\n  sweep:\n    dir: {sweep}\n    subdir: ${{hydra.job.num}}\n")

    def task(cfg: Any) -> tuple[int, int, str]:
        hc = HydraConfig.get()
        return cfg.x, hc.job.num, hc.runtime.output_dir

    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        master = compose(config_name="job", return_hydra_config=True)
        loader = GlobalHydra.instance().hydra.config_loader
        setup_globals()
        for num, quiet in ((0, False), (1, True)):
            job = loader.load_sweep_config(master, [f"x={num + 5}"])
            assert job.x == num + 5 and "hydra" in job, load.moved("the job's override or hydra node is missing")
            with open_dict(job.hydra):
                job.hydra.job.id = f"job{num}"
                job.hydra.job.num = num
                if quiet:  # what ranks > 0 get: no Hydra record in the job dir
                    job.hydra.output_subdir = None
            try:
                result = run_job(
                    hydra_context=HydraContext(config_loader=loader, callbacks=_NoCallbacks()),
                    task_function=task,
                    config=job,
                    job_dir_key="hydra.sweep.dir",
                    job_subdir_key="hydra.sweep.subdir",
                    configure_logging=False,  # leave pytest's logging alone
                )
            except TypeError as err:  # a keyword the launchers pass is gone
                pytest.fail(run.moved(str(err)))
            assert result.status == JobStatus.COMPLETED, run.moved(f"the job failed: {result.return_value!r}")
            assert result.return_value == (num + 5, num, str(sweep / str(num))), run.moved(
                f"the job saw {result.return_value!r}"
            )
            written = (sweep / str(num) / ".hydra").is_dir()
            assert written != quiet, run.moved(f"hydra.output_subdir=None no longer decides the record ({written=})")


HYDRA_CONF_KEYS = [
    ("sweep.dir", "train.py", "the sweep a job belongs to (wandb group)"),
    ("sweep.subdir", "launch/launchers.py", "each job's dir in the sweep"),
    ("job.id", "launch/launchers.py", "the SLURM job id in the job's config"),
    ("job.num", "launch/launchers.py", "the job's number in the sweep"),
    ("job.override_dirname", "train.py", "wandb run names"),
    ("runtime.output_dir", "train.py", "the run dir"),
    ("overrides.task", "train.py", "the overrides recorded in manifest.json"),
    ("mode", "train.py", "telling a sweep job from a single run"),
    ("output_subdir", "conf/hydra/default.yaml", "no Hydra record from ranks > 0 or over a continued run's"),
    ("job_logging", "conf/hydra/job_logging/project.yaml", "no log file from ranks > 0"),
    ("run.dir", "conf/hydra/default.yaml", "the run dir resuming or a torchrun or srun launch names"),
]


@pytest.mark.parametrize(("key", "user", "why"), HYDRA_CONF_KEYS, ids=[k for k, *_ in HYDRA_CONF_KEYS])
def test_hydra_conf_key(key: str, user: str, why: str) -> None:
    from hydra.conf import HydraConf

    hook = Hook("hydra", f"hydra.{key}", user, why)
    assert dig(HydraConf(), key) is not ABSENT, hook.moved("HydraConf no longer has it")


def test_sweep_overrides_split_into_jobs() -> None:
    """Expanding a `-m` command line into its jobs, as the basic sweeper does, before anything runs."""
    split = Hook(
        "hydra",
        "hydra._internal.core_plugins.basic_sweeper.BasicSweeper.split_arguments(overrides, max_batch_size)",
        "config/hydra_internals.py, config/compose.py",
        "checking every job of a sweep before its sweep dir is written",
    )
    parse = Hook(
        "hydra",
        "OverridesParser.create().parse_overrides() -> Override.input_line / is_sweep_override()",
        "config/schema.py, config/compose.py",
        "reading a sweep's overrides (and the fixed ones, under another sweeper)",
    )
    parser_cls = reach("hydra.core.override_parser.overrides_parser.OverridesParser")
    sweeper = reach("hydra._internal.core_plugins.basic_sweeper.BasicSweeper")
    assert parser_cls is not ABSENT, parse.moved("OverridesParser can no longer be imported from there")
    assert callable(dig(sweeper, "split_arguments")), split.moved("it is gone")
    parsed = parser_cls.create().parse_overrides(["a=1,2", "b=x"])
    seen = [(dig(o, "input_line"), o.is_sweep_override()) for o in parsed]
    assert seen == [("a=1,2", True), ("b=x", False)], parse.moved(f"the overrides read as {seen}")
    batches = sweeper.split_arguments(parsed, None)
    jobs = [job for batch in batches for job in batch]
    assert jobs == [["a=1", "b=x"], ["a=2", "b=x"]], split.moved(f"the jobs came out as {batches}")


# A schema with what the project's schemas use: a choice built with Enum's functional API, typed fields, a group.
Mode = enum.Enum("Mode", {"a": "a", "b": "b-c"}, type=str)


@dataclasses.dataclass
class Inner:
    mode: Mode = Mode.a
    n: int = 1
    x: float = 1.0
    flag: bool = True


@dataclasses.dataclass
class Schema:
    inner: Inner = dataclasses.field(default_factory=Inner)
    group: Any = None


# The wording of OmegaConf's and Hydra's composition errors, which schema.py turns into one line per mistake.
ERROR_WORDING = [
    ("omegaconf", "inner.mode=x", r"Invalid value 'x', expected one of \[.+\]", "a choice that is not allowed"),
    ("omegaconf", "inner.n=abc", r"Value 'abc' (of type '\w+' )?could not be converted to Integer", "a wrong type"),
    ("omegaconf", "inner.x=abc", r"Value 'abc' (of type '\w+' )?could not be converted to Float", "a wrong type"),
    ("omegaconf", "inner.flag=maybe", r"Value 'maybe' is not a valid bool", "a value that is not true or false"),
    (
        "omegaconf",
        "inner.n=null",
        r"field 'inner\.n' is not Optional|Non optional field cannot be assigned None",
        "null",
    ),
    ("omegaconf", "inner.nope=1", r"Key 'nope' not in 'Inner'|Key 'nope' is not in struct", "an unknown key"),
    (
        "hydra",
        "group=three",
        r"Could not find 'group/three'.*Available options in 'group':\n\tone",
        "an unknown option",
    ),
]


@pytest.mark.parametrize(("lib", "override", "pattern", "what"), ERROR_WORDING, ids=[o for _, o, *_ in ERROR_WORDING])
def test_composition_error_wording(tmp_path: Path, lib: str, override: str, pattern: str, what: str) -> None:
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore

    hook = Hook(
        lib,
        f"the composition error for {what}",
        "config/schema.py, config/compose.py",
        "naming the key, value and allowed values",
    )
    ConfigStore.instance().store(name="private_apis_schema", node=Schema)
    (tmp_path / "group").mkdir()
    (tmp_path / "group" / "one.yaml").write_text("v: 1\n")
    (tmp_path / "main.yaml").write_text("defaults:\n  - private_apis_schema\n  - group: one\n  - _self_\n")
    with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):
        try:
            compose(config_name="main", overrides=[override])
        except Exception as err:  # the text of the whole chain of causes, as schema.py reads it
            causes: list[BaseException] = []
            cause: BaseException | None = err
            while cause is not None:
                causes.append(cause)
                cause = cause.__cause__ or cause.__context__
            text = " ".join(str(c) for c in causes)
        else:
            pytest.fail(hook.moved(f"{override} was accepted"))
    assert re.search(pattern, text, re.DOTALL), hook.moved(f"the error no longer matches {pattern!r}: {text!r}")
    key = override.split("=", 1)[0]
    if key.startswith("inner."):
        assert f"full_key: {key}" in text, hook.moved(f"the error no longer names full_key: {key}: {text!r}")


# --- pytorch_lightning: a tiny model trained for a step or two on random tensors on the CPU ----------------------


def samples(n: int = 8, seed: int = 0) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 4, generator=gen), torch.randint(0, 2, (n,), generator=gen))


class Tiny(pl.LightningModule):
    def __init__(self, scheduler: bool = False, loader: Callable[[], Any] | None = None) -> None:
        super().__init__()
        self.save_hyperparameters("scheduler")
        self.layer = torch.nn.Linear(4, 2)
        self.loader = loader or (lambda: DataLoader(samples(), batch_size=2))
        self.counts: Counter[str] = Counter()
        self.loaded_with: list[Any] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.layer(x), y)
        self.log("loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.counts["validation_step"] += 1

    def train_dataloader(self) -> Any:
        self.counts["train_dataloader"] += 1
        return self.loader()

    def val_dataloader(self) -> DataLoader:
        return DataLoader(samples(2), batch_size=2)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        if not self.hparams.scheduler:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1)}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # model.py reads `_trainer` here: `trainer` raises when load_from_checkpoint has no trainer.
        trainer = getattr(self, "_trainer", ABSENT)
        self.loaded_with.append(trainer if trainer is None or trainer is ABSENT else trainer.state.fn == "fit")


def tiny_trainer(tmp_path: Path, **options: Any) -> pl.Trainer:
    settings: dict[str, Any] = {
        "max_steps": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "accelerator": "cpu",
        "devices": 1,
        "num_sanity_val_steps": 0,
        "limit_val_batches": 1,
        "use_distributed_sampler": False,  # as the project's plan sets it
        "default_root_dir": tmp_path,
    }
    settings.update(options)
    return pl.Trainer(**settings)


class Recorder(Logger):
    """Keeps every (step, metrics) Lightning logs."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.rows.append((step, dict(metrics)))


BATCHES_THAT_STEPPED = Hook(
    "pytorch_lightning",
    "trainer.fit_loop.epoch_loop._batches_that_stepped",
    "lightning_internals.py",
    "keeping the logging step equal to the optimizer step across resumes and the final validation",
)


def test_batches_that_stepped_counts_optimizer_steps(tmp_path: Path) -> None:
    trainer = tiny_trainer(tmp_path, max_steps=2)
    trainer.fit(Tiny())
    loop = trainer.fit_loop.epoch_loop
    value = getattr(loop, "_batches_that_stepped", ABSENT)
    assert type(value) is int and value == trainer.global_step == 2, BATCHES_THAT_STEPPED.moved(
        f"it is {value!r} after {trainer.global_step} steps"
    )
    # What the project writes is what a checkpoint records.
    loop._batches_that_stepped = 7
    saved = item(trainer.fit_loop.state_dict(), "epoch_loop.state_dict", "_batches_that_stepped")
    assert saved == 7, BATCHES_THAT_STEPPED.moved(f"the fit loop's state_dict holds {saved!r}, not the value set")


def test_batches_that_stepped_is_the_logging_step(tmp_path: Path) -> None:
    class Shift(pl.Callback):
        def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
            assert dig(trainer, "fit_loop.epoch_loop._batches_that_stepped") is not ABSENT, BATCHES_THAT_STEPPED.moved()
            trainer.fit_loop.epoch_loop._batches_that_stepped = 100 + trainer.global_step

    logger = Recorder()
    trainer = tiny_trainer(tmp_path, max_steps=2, logger=logger, log_every_n_steps=1, callbacks=[Shift()])
    trainer.fit(Tiny())
    steps = [step for step, metrics in logger.rows if "loss" in metrics]
    assert steps == [100, 101], BATCHES_THAT_STEPPED.moved(f"step metrics were logged at steps {steps}")


def test_update_train_step_metrics_logs_now(tmp_path: Path) -> None:
    hook = Hook(
        "pytorch_lightning",
        "trainer._logger_connector.update_train_step_metrics()",
        "lightning_internals.py, resume/preemption.py",
        "logging the last step's metrics before exiting on a signal",
    )
    logger = Recorder()

    class FlushEarly(pl.Callback):
        flushed: list[list[tuple[int | None, dict[str, float]]]] = []

        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            update = dig(trainer, "_logger_connector.update_train_step_metrics")
            assert callable(update), hook.moved("it is gone")
            before = len(logger.rows)
            update()
            self.flushed.append(logger.rows[before:])

    trainer = tiny_trainer(tmp_path, max_steps=2, logger=logger, log_every_n_steps=1, callbacks=[FlushEarly()])
    trainer.fit(Tiny())
    logged = [[(step, "loss" in metrics) for step, metrics in rows] for rows in FlushEarly.flushed]
    assert logged == [[(0, True)], [(1, True)]], hook.moved(f"inside on_train_batch_end it logged {FlushEarly.flushed}")


@pytest.mark.parametrize("reset", [True, False], ids=["cleared", "kept"])
def test_combined_loader_cleared_after_estimate(tmp_path: Path, reset: bool) -> None:
    hook = Hook(
        "pytorch_lightning",
        "trainer.fit_loop._combined_loader",
        "lightning_internals.py, resume/state.py",
        "building the training loader again after a restore, so it gets the saved position in the epoch",
    )
    seen: dict[str, Any] = {}

    class Estimating(Tiny):
        def configure_optimizers(self) -> Any:
            seen["steps"] = self.trainer.estimated_stepping_batches
            seen["built"] = getattr(self.trainer.fit_loop, "_combined_loader", ABSENT)
            if reset:
                self.trainer.fit_loop._combined_loader = None
            return super().configure_optimizers()

    model = Estimating()
    tiny_trainer(tmp_path, max_epochs=1).fit(model)  # with max_epochs unset the estimate needs no loader
    assert seen["built"] is not ABSENT, hook.moved("the fit loop has no such attribute")
    assert seen["built"] is not None, hook.moved("estimated_stepping_batches no longer leaves the loader there")
    # Cleared, the loader is requested again for training; kept, it is not (why the project clears it).
    wanted = 2 if reset else 1
    got = model.counts["train_dataloader"]
    assert got == wanted, hook.moved(f"train_dataloader() was called {got} times, expected {wanted}")


def test_val_loop_run_after_fit(tmp_path: Path) -> None:
    hook = Hook(
        "pytorch_lightning",
        "trainer.fit_loop.epoch_loop.val_loop.run()",
        "lightning_internals.py",
        "validating the final weights when training ended between validations",
    )

    class FinalValidation(pl.Callback):
        ran: list[int] = []
        training_after: list[bool] = []

        def on_train_end(self, trainer: pl.Trainer, pl_module: Tiny) -> None:
            loop = trainer.fit_loop.epoch_loop
            assert callable(dig(loop, "val_loop.run")), hook.moved("it is gone")
            before = pl_module.counts["validation_step"]
            trainer.validating = True
            try:
                loop.val_loop.run()
            finally:
                trainer.training = True
            self.ran.append(pl_module.counts["validation_step"] - before)
            self.training_after.append(trainer.training)

    # One step of a four-batch epoch: no validation of its own before on_train_end.
    tiny_trainer(tmp_path, callbacks=[FinalValidation()]).fit(Tiny())
    assert FinalValidation.ran == [1], hook.moved(f"it ran {FinalValidation.ran} validation batches, expected [1]")
    assert FinalValidation.training_after == [True], hook.moved("trainer.training = True no longer restores the stage")


@pytest.mark.parametrize(("max_steps", "whole_epoch"), [(-1, True), (2, False)], ids=["epoch", "cut"])
def test_batch_progress(tmp_path: Path, max_steps: int, whole_epoch: bool) -> None:
    hook = Hook(
        "pytorch_lightning",
        "trainer.fit_loop.epoch_loop.batch_progress (current.processed, is_last_batch)",
        "lightning_internals.py, data/images.py, tasks/classifier.py",
        "the position in the epoch saved with the loader, and telling a whole epoch from one cut by a budget",
    )

    class Watch(pl.Callback):
        batches: list[tuple[int, Any, Any]] = []
        epoch_ends: list[Any] = []

        def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, i: int) -> None:
            progress = dig(trainer, "fit_loop.epoch_loop.batch_progress")
            self.batches.append((i, dig(progress, "current.processed"), dig(progress, "is_last_batch")))

        def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
            self.epoch_ends.append(dig(trainer, "fit_loop.epoch_loop.batch_progress.is_last_batch"))

    tiny_trainer(tmp_path, max_steps=max_steps, max_epochs=1, callbacks=[Watch()]).fit(Tiny())
    n = 4 if whole_epoch else 2
    expected = [(i, i + 1, i == 3) for i in range(n)]
    assert Watch.batches == expected, hook.moved(f"(batch_idx, processed, is_last_batch) were {Watch.batches}")
    assert Watch.epoch_ends == [whole_epoch], hook.moved(f"is_last_batch at epoch end was {Watch.epoch_ends}")


def test_plateau_steps_come_after_the_epoch_end_hooks_and_are_skipped_on_resuming_from_there(tmp_path: Path) -> None:
    hook = Hook(
        "pytorch_lightning",
        "trainer.fit_loop.epoch_loop._num_ready_batches_reached, fit_loop.epoch_progress.current (processed, completed)",
        "lightning_internals.py, resume/state.py",
        "a checkpoint saved at an epoch's end carries the plateau steps Lightning skips when it resumes from it",
    )
    from hydralight.lightning_internals import plateau_step_pending

    class Plateau(Tiny):
        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
                optimizer, patience=0, threshold=10, threshold_mode="abs"
            )
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": plateau, "monitor": "loss"}}

    class Save(pl.Callback):
        seen: list[tuple[bool, int]] = []

        def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
            scheduler = trainer.lr_scheduler_configs[0].scheduler
            self.seen.append((plateau_step_pending(trainer), scheduler.last_epoch))
            trainer.save_checkpoint(tmp_path / "end.ckpt")

        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            self.seen.append((plateau_step_pending(trainer), -1))

    tiny_trainer(tmp_path, max_steps=-1, max_epochs=1, callbacks=[Save()]).fit(Plateau())
    assert Save.seen == [(False, -1)] * 4 + [(True, 0)], hook.moved(f"(pending, steps) were {Save.seen}")
    resumed = tiny_trainer(tmp_path, max_steps=-1, max_epochs=2)
    resumed.fit(Plateau(), ckpt_path=tmp_path / "end.ckpt")
    steps = resumed.lr_scheduler_configs[0].scheduler.last_epoch
    assert steps == 1, hook.moved(f"resumed from the epoch's end, the plateau scheduler took {steps} step(s), not 1")


class Stateful(DataLoader):
    """A training loader with a state, as the project's resumable loader has."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loaded: list[dict[str, int]] = []

    def state_dict(self) -> dict[str, int]:
        return {"position": 5}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.loaded.append(state)


CHECKPOINT_KEYS = [
    *(
        (("loops", "fit_loop", progress, part, count), "lightning_internals.py")
        for progress in ("epoch_progress", "epoch_loop.batch_progress")
        for part in ("total", "current")
        for count in ("ready", "started", "processed", "completed")
    ),
    (("loops", "fit_loop", "epoch_loop.batch_progress", "is_last_batch"), "lightning_internals.py"),
    (("loops", "fit_loop", "epoch_loop.state_dict", "_batches_that_stepped"), "lightning_internals.py"),
    (("loops", "fit_loop", "state_dict", "combined_loader"), "lightning_internals.py, data/loaders.py"),
    (("epoch",), "lightning_internals.py"),
    (("global_step",), "resume/policy.py"),
    (("state_dict",), "resume/policy.py"),
    (("loops",), "resume/policy.py"),
    (("hyper_parameters",), "resume/policy.py"),
    (("lr_schedulers",), "lightning_internals.py, resume/state.py"),
]


def test_checkpoint_layout_and_resume(tmp_path: Path) -> None:
    """The checkpoint dict the project edits in on_save_checkpoint, saved and resumed as the project does it."""
    from lightning_fabric.plugins import TorchCheckpointIO

    path = tmp_path / "mid.ckpt"
    made: list[Stateful] = []

    def loader() -> Stateful:
        made.append(Stateful(samples(), batch_size=2))
        return made[-1]

    class WritingIO(TorchCheckpointIO):
        written: list[Any] = []

        def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
            self.written.append(path)
            super().save_checkpoint(checkpoint, path, storage_options)

    class SaveMidEpoch(pl.Callback):
        seen: dict[str, Any] = {}

        def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, i: int) -> None:
            if i == 1:
                trainer.save_checkpoint(path)

        def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: Any, checkpoint: dict[str, Any]) -> None:
            self.seen["checkpoint"] = checkpoint
            state = item(checkpoint, "loops", "fit_loop", "epoch_loop.state_dict")
            if state is not ABSENT:
                state["_batches_that_stepped"] = 41  # an edit, as LastCheckpoint makes: it must reach the file

    io = WritingIO()
    tiny_trainer(tmp_path, max_steps=3, plugins=[io], callbacks=[SaveMidEpoch()]).fit(Tiny(True, loader))

    writes = Hook("lightning_fabric", "TorchCheckpointIO.save_checkpoint", "training/checkpoint_io.py", "atomic writes")
    assert [Path(p) for p in WritingIO.written] == [path], writes.moved(f"Lightning wrote through it {io.written}")
    checkpoint = SaveMidEpoch.seen.get("checkpoint", {})
    for keys, user in CHECKPOINT_KEYS:
        hook = Hook("pytorch_lightning", "checkpoint[" + "][".join(map(repr, keys)) + "]", user, "the saved loop state")
        assert item(checkpoint, *keys) is not ABSENT, hook.moved("the checkpoint has no such entry")
    loader_state = Hook(
        "pytorch_lightning",
        "checkpoint['loops']['fit_loop']['state_dict']['combined_loader']",
        "lightning_internals.py, data/loaders.py",
        "saving the training loader's position in the epoch",
    )
    saved = item(checkpoint, "loops", "fit_loop", "state_dict", "combined_loader")
    assert saved == [{"position": 5}], loader_state.moved(f"it holds {saved!r}")

    weights = Hook(
        "torch", "torch.load(weights_only=True)", "resume/policy.py", "reading checkpoints without pickled code"
    )
    try:
        on_disk = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # an unpicklable type in Lightning's checkpoint
        pytest.fail(weights.moved(f"a Lightning checkpoint no longer loads: {err}"))
    edited = item(on_disk, "loops", "fit_loop", "epoch_loop.state_dict", "_batches_that_stepped")
    assert edited == 41, BATCHES_THAT_STEPPED.moved(
        f"an edit in on_save_checkpoint did not reach the file ({edited!r})"
    )

    # Resume as train.py does: the loader gets its saved position, the module sees the trainer in on_load_checkpoint.
    resumed = Tiny(True, loader)
    tiny_trainer(tmp_path, max_steps=3).fit(resumed, ckpt_path=path, weights_only=True)
    assert made[-1].loaded == [{"position": 5}], loader_state.moved(f"the resumed loader got {made[-1].loaded}")
    module_trainer = Hook(
        "pytorch_lightning",
        "LightningModule._trainer and trainer.state.fn",
        "lightning_internals.py, resume/state.py",
        "checks that apply only when fit restores a checkpoint",
    )
    assert resumed.loaded_with == [True], module_trainer.moved(f"on_load_checkpoint saw {resumed.loaded_with}")
    alone = Tiny.load_from_checkpoint(path, map_location="cpu", weights_only=True)
    assert alone.loaded_with == [None], module_trainer.moved(f"without a trainer it saw {alone.loaded_with}")


def test_set_epoch_reaches_batch_sampler(tmp_path: Path) -> None:
    hook = Hook(
        "lightning_fabric",
        "_set_sampler_epoch on dataloader.batch_sampler.sampler",
        "data/sampling.py",
        "a new sample order every epoch from the global batch sampler",
    )

    class Batches(Sampler):
        epochs: list[int] = []

        @property
        def sampler(self) -> Batches:
            return self

        def set_epoch(self, epoch: int) -> None:
            self.epochs.append(epoch)

        def __iter__(self) -> Iterator[list[int]]:
            return iter([[0, 1], [2, 3]])

        def __len__(self) -> int:
            return 2

    model = Tiny(loader=lambda: DataLoader(samples(4), batch_sampler=Batches()))
    tiny_trainer(tmp_path, max_steps=-1, max_epochs=2, limit_val_batches=0).fit(model)
    assert Batches.epochs == [0, 1], hook.moved(f"set_epoch was called with {Batches.epochs}")


def test_ddp_launcher_is_configured_by_the_strategy() -> None:
    from pytorch_lightning.strategies import DDPStrategy
    from pytorch_lightning.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

    hook = Hook(
        "pytorch_lightning",
        "DDPStrategy._configure_launcher / _launcher",
        "lightning_internals.py, training/strategy.py",
        "replacing Lightning's launcher with one that starts ranks from the job's saved config",
    )
    configured: list[type] = []

    class Recording(DDPStrategy):
        def _configure_launcher(self) -> None:
            super()._configure_launcher()
            configured.append(type(getattr(self, "_launcher", None)))

    strategy = Recording()
    pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    assert configured == [_SubprocessScriptLauncher], hook.moved(f"the Trainer configured {configured}")
    assert strategy.launcher is strategy._launcher, hook.moved("the strategy's launcher is no longer `_launcher`")
    launcher = strategy._launcher
    fields = {k: dig(launcher, k) for k in ("num_processes", "num_nodes", "procs")}
    assert fields == {"num_processes": 2, "num_nodes": 1, "procs": []}, hook.moved(f"the launcher has {fields}")
    assert dig(launcher, "cluster_environment") is strategy.cluster_environment, hook.moved("no cluster_environment")


def test_subprocess_launcher_starts_children_through_the_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    import pytorch_lightning.strategies.launchers.subprocess_script as script
    from lightning_fabric.plugins.environments import LightningEnvironment

    hook = Hook(
        "pytorch_lightning",
        "_SubprocessScriptLauncher.launch -> _call_children_scripts / procs",
        "lightning_internals.py, training/strategy.py",
        "starting ranks 1..N-1 as `python -m hydralight.worker` and having Lightning watch them",
    )
    monkeypatch.delenv("LOCAL_RANK", raising=False)  # this process is the one that starts the others
    monkeypatch.setenv("OMP_NUM_THREADS", str(torch.get_num_threads()))  # launch() then leaves threads alone
    observed: list[Any] = []
    monkeypatch.setattr(script, "_launch_process_observer", observed.append, raising=False)

    class Recording(script._SubprocessScriptLauncher):
        def _call_children_scripts(self) -> None:
            self._check_can_spawn_children()
            self.procs = ["rank 1"]  # stands for the started processes

    launcher = Recording(LightningEnvironment(), 2, 1)
    assert launcher.launch(lambda: "ran") == "ran", hook.moved("launch() no longer runs the function")
    assert observed == [["rank 1"]], hook.moved(f"the process observer watched {observed}, not the override's procs")


def test_the_ranks_watch_stops_the_ranks_and_leaves_this_process_to_end_its_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The project's watch over the ranks it started is Lightning's `_ChildProcessObserver` (`_run` polls the
    children and calls `_terminate_all` on a failure) with another `_terminate_all`."""
    import signal
    import subprocess
    import sys

    from hydralight.lightning_internals import JobRanksObserver

    hook = Hook(
        "lightning_fabric",
        "_ChildProcessObserver._run -> _terminate_all / _child_processes, _main_pid, _termination_signal",
        "lightning_internals.py",
        "stopping the other ranks when one fails, without killing the sweep this process runs",
    )
    failed = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    failed.wait()
    killed: list[tuple[int, int]] = []
    real_kill = os.kill
    monkeypatch.setattr(
        "os.kill", lambda pid, signum: killed.append((pid, signum)) if pid == os.getpid() else real_kill(pid, signum)
    )
    over = JobRanksObserver([failed, running], job_over=lambda: True)
    assert over._run() is True, hook.moved("a failed child no longer ends the watch")
    assert running.wait(timeout=10) == -signal.SIGKILL, hook.moved("the other ranks were not stopped")
    assert killed == [], "this process was killed although its job had ended"
    stuck = JobRanksObserver([failed], job_over=lambda: False, grace_s=0.1)
    assert stuck._run() is True and killed == [(os.getpid(), signal.SIGKILL)], hook.moved("no kill after the grace")


@pytest.mark.parametrize(
    "strategy, method", [("DDPStrategy", "setup_distributed"), ("ModelParallelStrategy", "_setup_distributed")]
)
def test_the_process_group_forms_in_the_method_the_ranks_meet_before(strategy: str, method: str) -> None:
    """The launching rank waits for the ranks it started before the group forms: in the method that forms it."""
    import inspect

    import pytorch_lightning.strategies as strategies

    hook = Hook(
        "pytorch_lightning",
        f"{strategy}.{method} -> _init_dist_connection / _timeout",
        "lightning_internals.py",
        "refusing at once when a started rank ended before the process group formed",
    )
    cls = getattr(strategies, strategy)
    assert callable(getattr(cls, method, None)), hook.moved(f"{strategy} has no {method}")
    assert "_init_dist_connection(" in inspect.getsource(getattr(cls, method)), hook.moved("the group forms elsewhere")
    kwargs = {"data_parallel_size": 2, "tensor_parallel_size": 1} if strategy == "ModelParallelStrategy" else {}
    timeout = dig(cls(**kwargs), "_timeout")
    assert timeout is None or hasattr(timeout, "total_seconds"), hook.moved(f"_timeout is {timeout!r}")


# --- torch and torchmetrics details -----------------------------------------------------------------------------


def test_mean_metric_states() -> None:
    from torchmetrics import MeanMetric

    hook = Hook(
        "torchmetrics",
        "MeanMetric.mean_value / weight",
        "tasks/classifier.py",
        "carrying the epoch's running training loss through a mid-epoch checkpoint",
    )
    metric = MeanMetric()
    metric.update(torch.tensor([1.0, 3.0]))
    states = (getattr(metric, "mean_value", ABSENT), getattr(metric, "weight", ABSENT))
    assert all(torch.is_tensor(s) for s in states), hook.moved(f"the states are {states}")
    assert [float(s) for s in states] == [4.0, 2.0], hook.moved(f"they hold {states}, not (sum, count)")
    metric.mean_value = torch.tensor(10.0)
    metric.weight = torch.tensor(4.0)
    assert float(metric.compute()) == 2.5, hook.moved("setting them no longer sets the mean")


def test_dataset_getitems_fetches_whole_batches() -> None:
    hook = Hook(
        "torch",
        "Dataset.__getitems__ (used by the DataLoader's map fetcher)",
        "data/loaders.py",
        "the tensor loader: one index operation per batch instead of one call per sample",
    )

    class Whole(Dataset):
        per_sample = 0

        def __len__(self) -> int:
            return 4

        def __getitem__(self, index: int) -> Any:
            Whole.per_sample += 1
            return index

        def __getitems__(self, indices: torch.Tensor) -> tuple[str, list[int]]:
            return "batch", [int(i) for i in indices]

    loader = DataLoader(Whole(), batch_sampler=[torch.tensor([0, 1]), torch.tensor([2, 3])], collate_fn=lambda b: b)
    got = list(loader)
    assert got == [("batch", [0, 1]), ("batch", [2, 3])] and Whole.per_sample == 0, hook.moved(f"batches were {got}")


def test_should_update_logs_says_which_training_steps_are_written(tmp_path: Path) -> None:
    """The classifier hands Lightning its step loss only at the steps Lightning writes, which it computes from
    public fields: (global_step + 1) % log_every_n_steps == 0. Lightning's own rule must stay that."""
    hook = Hook(
        "pytorch_lightning",
        "trainer._logger_connector.should_update_logs == (global_step + 1) % log_every_n_steps == 0",
        "tasks/classifier.py",
        "logging the step loss only at the steps Lightning writes to the loggers",
    )
    logger = Recorder()
    asked: list[bool] = []

    class Asking(Tiny):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            value = dig(self.trainer, "_logger_connector.should_update_logs")
            assert isinstance(value, bool), hook.moved(f"it is {value!r}")
            rule = (self.global_step + 1) % self.trainer.log_every_n_steps == 0
            assert value == rule, hook.moved(f"at step {self.global_step} it says {value}, the rule {rule}")
            asked.append(value)
            return super().training_step(batch, batch_idx)

    trainer = tiny_trainer(tmp_path, max_steps=6, logger=logger, log_every_n_steps=3)
    trainer.fit(Asking())
    written = [step for step, metrics in logger.rows if "loss" in metrics]
    assert [i for i, due in enumerate(asked) if due] == written == [2, 5], hook.moved(f"asked {asked}, wrote {written}")


def test_weight_averaging_counts_its_updates_and_swaps_with_the_module(tmp_path: Path) -> None:
    """The averaging callbacks read how many weights the average holds and exchange it with the module."""
    from pytorch_lightning.callbacks import WeightAveraging

    from hydralight.lightning_internals import averaged_updates, swap_average

    hook = Hook(
        "pytorch_lightning",
        "callbacks.WeightAveraging._average_model.n_averaged, WeightAveraging._swap_models",
        "lightning_internals.py, training/averaging.py",
        "validating and saving the trained weights until the average has taken any in",
    )
    seen: list[int] = []

    class EverySecondStep(WeightAveraging):
        def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
            return step_idx is not None and step_idx % 2 == 1

        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            super().on_train_batch_end(trainer, *args)
            assert dig(self, "_average_model.n_averaged") is not ABSENT, hook.moved("no _average_model.n_averaged")
            seen.append(averaged_updates(self))

    averaging = EverySecondStep()
    module = Tiny()
    tiny_trainer(tmp_path, max_steps=4, callbacks=[averaging]).fit(module)
    assert seen == [0, 1, 1, 2], hook.moved(f"n_averaged went {seen}")
    assert callable(dig(averaging, "_swap_models")), hook.moved("no _swap_models")
    before = [p.detach().clone() for p in module.parameters()]
    average = [p.detach().clone() for p in averaging._average_model.module.parameters()]
    swap_average(averaging, module)
    assert all(torch.equal(p, a) for p, a in zip(module.parameters(), average, strict=True)), hook.moved()
    assert all(torch.equal(p, b) for p, b in zip(averaging._average_model.module.parameters(), before, strict=True))


def test_model_parallel_launcher_is_configured_by_the_strategy() -> None:
    """strategy=fsdp swaps the launcher of Lightning's ModelParallelStrategy as DDP's is swapped."""
    from pytorch_lightning.strategies import ModelParallelStrategy
    from pytorch_lightning.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

    hook = Hook(
        "pytorch_lightning",
        "ModelParallelStrategy._configure_launcher / _launcher",
        "lightning_internals.py, training/strategy.py",
        "starting the fsdp ranks from the job's saved config, as DDP's are",
    )
    configured: list[type] = []

    class Recording(ModelParallelStrategy):
        def _configure_launcher(self) -> None:
            super()._configure_launcher()
            configured.append(type(getattr(self, "_launcher", None)))

    strategy = Recording(data_parallel_size=2, tensor_parallel_size=1)
    pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    assert configured == [_SubprocessScriptLauncher], hook.moved(f"the Trainer configured {configured}")
    assert strategy.launcher is strategy._launcher, hook.moved("the strategy's launcher is no longer `_launcher`")
    fields = {k: dig(strategy._launcher, k) for k in ("num_processes", "num_nodes", "procs")}
    assert fields == {"num_processes": 2, "num_nodes": 1, "procs": []}, hook.moved(f"the launcher has {fields}")
    assert dig(strategy._launcher, "cluster_environment") is strategy.cluster_environment, hook.moved()


def test_a_training_step_s_values_for_the_loggers(tmp_path: Path) -> None:
    """Step values a module logs reach the loggers at the steps a report needs (training/step_metrics.py): read
    through the epoch loop's `_should_accumulate()`, `_results.metrics(True)["log"]` and
    `_batches_that_stepped`."""
    from hydralight.lightning_internals import accumulating, logging_step, step_values_for_loggers

    hook = Hook("pytorch_lightning", "fit_loop.epoch_loop._results / _should_accumulate / _batches_that_stepped",
                "training/step_metrics.py", "writing step values Lightning's log_every_n_steps skipped")  # fmt: skip
    seen: list[tuple[bool, int, set[str]]] = []

    class Reading(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            values = step_values_for_loggers(trainer)
            assert all(torch.is_tensor(v) for v in values.values()), hook.moved(f"values are {values}")
            seen.append((accumulating(trainer), logging_step(trainer), set(values)))

    tiny_trainer(tmp_path, max_steps=2, accumulate_grad_batches=2, callbacks=[Reading()]).fit(Tiny())
    assert seen == [(True, 0, {"loss"}), (False, 0, {"loss"}), (True, 1, {"loss"}), (False, 1, {"loss"})], hook.moved(
        f"saw {seen}"
    )


def test_best_checkpoint_names_the_epoch_of_its_last_step(tmp_path: Path) -> None:
    """BestCheckpoint replaces `epoch` among ModelCheckpoint's private `_monitor_candidates` (its file name's
    values) and keeps Lightning's state key."""
    from hydralight.lightning_internals import BestCheckpoint

    hook = Hook("pytorch_lightning", "ModelCheckpoint._monitor_candidates / state_key", "lightning_internals.py",
                "naming the best checkpoint after the epoch of its last step")  # fmt: skip
    asked: list[dict[str, Any]] = []

    class Watching(BestCheckpoint):
        def _monitor_candidates(self, trainer: pl.Trainer) -> dict[str, torch.Tensor]:
            asked.append(candidates := super()._monitor_candidates(trainer))
            return candidates

    best = Watching(dirpath=tmp_path / "ckpt", filename="{epoch:03d}-{step:06d}", monitor="step", mode="max")
    tiny_trainer(tmp_path, max_steps=3, callbacks=[best], enable_checkpointing=True).fit(Tiny())
    assert asked and all({"epoch", "step"} <= set(c) for c in asked), hook.moved(f"candidates were {asked}")
    assert Path(best.best_model_path).name == "epoch=000-step=000003.ckpt", hook.moved(best.best_model_path)
    assert best.state_key == ModelCheckpoint(monitor="step", mode="max").state_key, hook.moved(best.state_key)


def test_callback_dispatch_skips_a_hook_that_is_not_callable(tmp_path: Path) -> None:
    """Lightning calls every callback at every step hook; one whose hook attribute is None is skipped
    (lightning_internals.skip_unused_step_hooks hides the no-ops so), and the hooks a callback overrides run."""
    from hydralight.lightning_internals import STEP_HOOKS, skip_unused_step_hooks

    hook = Hook("pytorch_lightning", "trainer.call._call_callback_hooks (callable check) / Callback step hooks",
                "lightning_internals.py", "keeping callbacks' no-op hooks out of every training step")  # fmt: skip
    ran: Counter[str] = Counter()

    class Counting(pl.Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            ran["end"] += 1

    assert all(callable(getattr(pl.Callback, name, None)) for name in STEP_HOOKS), hook.moved("a step hook is gone")
    counting, idle = Counting(), pl.Callback()
    skip_unused_step_hooks([counting, idle])
    assert counting.on_before_backward is None and callable(counting.on_train_batch_end)
    assert all(getattr(idle, name) is None for name in STEP_HOOKS)
    tiny_trainer(tmp_path, max_steps=3, callbacks=[counting, idle]).fit(Tiny())
    assert ran["end"] == 3, hook.moved(f"on_train_batch_end ran {ran['end']} times in 3 steps")


def test_values_logged_for_the_epoch_are_synced_when_asked_after_they_were_logged(tmp_path: Path) -> None:
    hook = Hook(
        "pytorch_lightning",
        "trainer._results[...].meta.sync.should",
        "lightning_internals.py, training/invariance.py",
        "averaging over ranks the values a module logs per epoch in validation and test without sync_dist",
    )

    class Logs(Tiny):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("v", torch.tensor(float(batch_idx)))  # on_step=False, on_epoch=True: validation's default
            self.log("s", torch.tensor(1.0), on_step=True)

    class Sync(pl.Callback):
        seen: list[tuple[str, bool]] = []

        def on_validation_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            results = dig(trainer, "_results")
            assert results is not ABSENT and hasattr(results, "valid_items"), hook.moved("no results collection")
            for _, metric in results.valid_items():
                meta = dig(metric, "meta")
                fields = [dig(meta, f) for f in ("on_epoch", "on_step", "is_custom_reduction", "sync.rank_zero_only")]
                assert ABSENT not in fields and dig(metric, "is_tensor") is not ABSENT, hook.moved(f"{fields}")
                if meta.on_epoch and not meta.on_step:
                    meta.sync.should = True  # what a later log() of the same value must not refuse, once put back
                    self.seen.append((meta.name, meta.sync.should))

        def on_validation_epoch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            for metric in trainer._results.values():
                metric.meta.sync.should = False

    trainer = tiny_trainer(tmp_path, max_epochs=2, max_steps=-1, limit_train_batches=1, callbacks=[Sync()])
    trainer.fit(Logs())
    assert ("v", True) in Sync.seen and all(name == "v" for name, _ in Sync.seen), hook.moved(f"{Sync.seen}")
    assert trainer.callback_metrics["v"] == 0.0, hook.moved(f"the epoch's value is {trainer.callback_metrics['v']}")


def test_the_values_a_modules_epoch_end_hook_logged_are_computed_after_it_returns(tmp_path: Path) -> None:
    from hydralight.lightning_internals import call_after_module_hook, restore_module_hooks

    hook = Hook(
        "pytorch_lightning",
        "_EvaluationLoop._on_evaluation_epoch_end (module hook, then the epoch's values computed)",
        "lightning_internals.py, training/invariance.py",
        "averaging over ranks the values a module logs in on_validation_epoch_end / on_test_epoch_end",
    )

    class Logs(Tiny):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("v", torch.tensor(float(batch_idx)))

        def on_validation_epoch_end(self) -> None:
            self.log("e", torch.tensor(2.0))

        test_step = validation_step
        test_dataloader = Tiny.val_dataloader

        def on_test_epoch_end(self) -> None:
            self.log("t", torch.tensor(3.0))

    seen: list[dict[str, bool]] = []

    class After(pl.Callback):
        def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
            for name in ("on_validation_epoch_end", "on_test_epoch_end"):
                call_after_module_hook(trainer, pl_module, name)

        def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
            restore_module_hooks(pl_module)

        def after_on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            # which values are logged and not yet computed, as the module's hook returns
            seen.append({key.split(".")[-1]: dig(m, "_computed") is None for key, m in trainer._results.valid_items()})

        after_on_test_epoch_end = after_on_validation_epoch_end

    module = Logs()
    trainer = tiny_trainer(tmp_path, max_epochs=1, max_steps=-1, limit_train_batches=1, callbacks=[After()])
    trainer.fit(module)
    trainer.test(module, verbose=False)
    # The steps' values were computed after the loader's last batch; the hook's not yet.
    assert seen[-2:] == [{"v": False, "e": True}, {"v": False, "t": True}], hook.moved(f"{seen}")
    assert trainer.callback_metrics["t"] == 3.0
    assert "on_validation_epoch_end" not in vars(module) and "on_test_epoch_end" not in vars(module)


def test_the_names_a_validation_logged_are_told_apart_from_training_s(tmp_path: Path) -> None:
    from hydralight.lightning_internals import logged_names

    hook = Hook(
        "pytorch_lightning",
        "trainer._results._forked_name",
        "lightning_internals.py, training/guards.py",
        "refusing an objective that validation does not log (a training metric is in callback_metrics too)",
    )

    class Logs(Tiny):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.log("t", torch.tensor(1.0))
            return super().training_step(batch, batch_idx)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("v", torch.tensor(float(batch_idx)))
            self.log("both", torch.tensor(1.0), on_step=True, on_epoch=True)

    class Names(pl.Callback):
        seen: list[set[str]] = []

        def on_validation_end(self, trainer: pl.Trainer, *args: Any) -> None:
            if not trainer.sanity_checking:
                self.seen.append(logged_names(trainer))

    class TwoLoaders(Logs):  # each value under its loader's suffix, as callback_metrics names it
        def val_dataloader(self) -> list[DataLoader]:
            return [DataLoader(samples(2), batch_size=2), DataLoader(samples(2), batch_size=2)]

        def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
            super().validation_step(batch, batch_idx)

    trainer = tiny_trainer(tmp_path, max_epochs=1, max_steps=-1, limit_train_batches=1, callbacks=[Names()])
    trainer.fit(Logs())
    assert "t" in trainer.callback_metrics, hook.moved(f"{sorted(trainer.callback_metrics)}")
    assert Names.seen == [{"v", "both", "both_step", "both_epoch"}], hook.moved(f"{Names.seen}")
    trainer = tiny_trainer(tmp_path, max_epochs=1, max_steps=-1, limit_train_batches=1, callbacks=[Names()])
    trainer.fit(TwoLoaders())
    suffixed = {f"{name}/dataloader_idx_{i}" for name in ("v", "both", "both_step", "both_epoch") for i in (0, 1)}
    assert Names.seen[-1] == suffixed, hook.moved(f"{Names.seen[-1]}")
    assert suffixed - {"both_step/dataloader_idx_0", "both_step/dataloader_idx_1"} <= set(trainer.callback_metrics)


def test_the_batches_a_test_stage_ran_are_the_test_loops_own_list(tmp_path: Path) -> None:
    hook = Hook(
        "pytorch_lightning",
        "trainer.test_loop._max_batches",
        "lightning_internals.py",
        "a ddp_spawn run's main process learning how many batches its workers' test ran (the last line's reason)",
    )

    class Tested(Tiny):
        test_step = Tiny.validation_step
        test_dataloader = Tiny.val_dataloader

    trainer = tiny_trainer(tmp_path)
    trainer.test(Tested(), verbose=False)
    batches = dig(trainer, "test_loop._max_batches")
    assert batches == [1] and trainer.num_test_batches == [1], hook.moved(f"{batches}")
    trainer.test_loop._max_batches = [3]  # as the launcher sets it in the main process
    assert trainer.num_test_batches == [3], hook.moved("num_test_batches is not the loop's list")
