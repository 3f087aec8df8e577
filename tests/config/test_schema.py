"""The typed config: a wrong type or choice is refused when the config is composed, in one line, for a run,
`--cfg job`, `plan=true` and every job of a sweep, before any run dir exists; `--cfg job` needs no torch."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, one_line, run_cli, run_python

from hydralight.config.compose import Invocation, compose_jobs
from hydralight.train import CONFIG_DIR

# (override, what the one line must say): the key, the value and what is allowed.
REJECTED = [
    ("optim.lr=abc", "optim.lr=abc is not a number"),
    ("seed=notanumber", "seed=notanumber is not an integer"),
    ("mode=tain", "mode=tain is not allowed; use one of train, eval, predict"),
    ("optim.lr_scaling=cubic", "optim.lr_scaling=cubic is not allowed; use one of none, linear, sqrt"),
    ("data.loader=pandas", "data.loader=pandas is not allowed; use one of tensor, torchvision"),
    ("strategy.name=deepspeed", "strategy.name=deepspeed is not allowed; use one of auto, ddp, ddp_spawn, fsdp"),
    ("hardware.accelerator=tpu", "hardware.accelerator=tpu is not allowed; use one of auto, cpu, gpu, cuda"),
    ("trainer.precision=bf17", "trainer.precision=bf17 is not allowed; use one of 32-true"),
    ("objective.direction=up", "objective.direction=up is not allowed; use one of max, min"),
    ("batch.global_size=1.5", "batch.global_size=1.5 is not an integer"),
    ("batch.drop_last=maybe", "batch.drop_last=maybe is not true or false"),
    ("trainer.max_epochs=two", "trainer.max_epochs=two is not an integer"),
    ("cluster.timeout_min=1h", "cluster.timeout_min=1h is not an integer"),
    ("model.sync_batchnorm=sure", "model.sync_batchnorm=sure is not true or false"),
    ("mode=null", "mode=null is not allowed"),
    ("hardware=tpu", "hardware=tpu is not an option of hardware; use one of 1gpu, 2x8gpu, 4gpu, 8gpu, auto, cpu"),
    ("precision=fp8", "precision=fp8 is not an option of precision"),
    ("precision=16", "precision=16 is not an option of precision; use one of 16-mixed, 32-true"),  # a number
    ("callbacks=[default,early_stoping]", "callbacks=early_stoping is not an option of callbacks; use one of"),
    ("tags=mnist", "tags=mnist is not a list; write tags=[mnist]"),
    ("data=null", "data=null: the data group needs one of its options (fashion_mnist, imagefolder, mnist, text)"),
    ("trainer.accelerator=gpu", "trainer.accelerator is set by the plan; set hardware.accelerator instead"),
    ("trainer.max_epoch=3", "trainer.max_epoch is not a config key"),
    ("+trainer.gradiant_clip_val=1", "trainer.gradiant_clip_val is not a config key"),
    ("+trainer.devices=2", "trainer.devices is set by the plan; set hardware.devices instead"),
    ("objective.metric=test/acc", "objective.metric=test/acc is a test metric"),
    ("seed=1,2", "seed=1,2 holds a list of values: add -m to sweep over them"),
    ("+model=mlp", "+model=mlp adds a second model to the one the config chooses; choose it instead: model=mlp"),
    # Hydra's own keys: the run's one composition checks them too.
    ("hydra.job.chdir=maybe", "hydra.job.chdir=maybe is not true or false"),
    ("hydra/launcher=nonesuch", "error: hydra/launcher=nonesuch is not an option of hydra/launcher; use one of basic"),
    # lightning-hydra-template's habits: said in this project's words.
    (
        "trainer=gpu",
        "trainer=gpu is not an option of trainer; use one of default (lightning-hydra-template's "
        "trainer=gpu is hardware=1gpu here)",
    ),
    ("test=false", "test is lightning-hydra-template's key; this project takes mode=eval resume=<run dir>"),
    (
        "callbacks.early_stopping.patience=1",
        "callbacks.early_stopping belongs to the callbacks option early_stopping, "
        "which this run does not have: add it first, 'callbacks=[default,early_stopping]'",
    ),
]


def no_run_dir_left(where: Path) -> None:
    assert not where.exists() or not any(where.iterdir()), sorted(p.name for p in where.iterdir())


@pytest.mark.parametrize("override,message", REJECTED, ids=[o for o, _ in REJECTED])
def test_a_run_refuses_a_wrong_value_in_one_line(override, message, tmp_path):
    run = tmp_path / "run"
    line = one_line(run_cli([override], run))
    assert message in line, line
    no_run_dir_left(run)


def test_a_key_of_a_continued_run_s_own_model_names_the_option_it_needs(tmp_path):
    # The command line is composed from the defaults before resume= reads the run's config: a key of the run's own
    # model is no typo.
    line = one_line(run_cli([f"resume={tmp_path / 'earlier'}", "model.width=32"], tmp_path / "run"))
    assert "model.width is not a key of the default model config; resume=" in line, line
    assert "name the run's model= option too" in line
    no_run_dir_left(tmp_path / "run")


@pytest.mark.parametrize("override,message", REJECTED[:3], ids=[o for o, _ in REJECTED[:3]])
def test_printing_and_planning_refuse_it_too(override, message, tmp_path):
    for extra in (["--cfg", "job"], ["plan=true"]):
        line = one_line(run_cli([override, *extra], tmp_path / "run"))
        assert message in line, (extra, line)
    no_run_dir_left(tmp_path / "run")


@pytest.mark.parametrize("sweep", ["optim.lr=1e-3,abc", "optim.lr=1e-3,-1", "mode=train,tain", "hardware=cpu,tpu"])
def test_every_job_of_a_sweep_is_checked_before_any_runs(sweep, tmp_path):
    sweep_dir = tmp_path / "sweep"
    line = one_line(run_cli(["-m", sweep, "trainer.max_steps=1", f"hydra.sweep.dir={sweep_dir}"], tmp_path))
    assert line.startswith("error: sweep job 1 (") and sweep.split("=")[0] in line, line
    no_run_dir_left(sweep_dir)


@pytest.mark.slow
def test_hydra_s_own_flags_and_sweeps_it_expands_itself_still_work(tmp_path):
    info = run_cli(["--info", "searchpath"], tmp_path / "run")
    assert info.returncode == 0 and "structured://" in info.stdout, info.stderr[-2000:]
    # Every model option's plan with the default data (MNIST); the character model needs text data's sizes.
    sweep = ["-m", "model=glob(*,exclude=charlm)", "plan=true", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    globbed = run_cli(sweep, tmp_path)
    models = len(list((ROOT / "src" / "hydralight" / "conf" / "model").glob("*.yaml"))) - 1
    assert globbed.returncode == 0 and globbed.stdout.count("Run plan") == models, globbed.stderr[-2000:]
    text_model = one_line(run_cli(["model=charlm", "plan=true"], tmp_path / "run"))
    assert "CharLM needs vocab_size, block_size" in text_model, text_model  # refused by plan=true as by the run
    command = [sys.executable, str(ROOT / "train.py"), "resume=some/run", "--cfg", "job"]
    resumed = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0 and "resume: some/run" in resumed.stdout, resumed.stderr[-2000:]


COUNTING = """\
import sys
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydralight.train import cli

composed = []
load_configuration = ConfigLoaderImpl.load_configuration
ConfigLoaderImpl.load_configuration = lambda self, *a, **k: composed.append(1) or load_configuration(self, *a, **k)
try:
    cli()
finally:
    print("composed", len(composed), file=sys.stderr)
"""


@pytest.mark.parametrize(
    ("args", "composed", "plans"),
    [
        ([], 1, 1),
        (["model.label_smoothing=0.1", "data.val_size=4000"], 1, 1),
        (["-m", "seed=1,2"], 3, 2),
        (["hydra.mode=MULTIRUN", "seed=1,2"], 3, 2),
    ],
)
def test_a_run_and_each_job_of_a_sweep_are_composed_once(args, composed, plans, tmp_path):
    """Every composition counted (Hydra's, the check's, the sweep's of its jobs): a run is composed once; a
    sweep once for its own config and once for each job, which the check composes and the launcher runs. Hydra
    1.3 composes everything once more only to read hydra.mode: the project has read it, but when the command
    line sets it, Hydra reads it itself."""
    script = tmp_path / "counting.py"
    script.write_text(COUNTING)
    where = f"hydra.sweep.dir={tmp_path / 'sweep'}" if "seed=1,2" in args else f"hydra.run.dir={tmp_path / 'run'}"
    result = run_python([sys.executable, str(script), *args, "plan=true", where], cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    counted = int(result.stderr.rsplit("composed ", 1)[1].split()[0])
    asked_hydra = 1 if "hydra.mode=MULTIRUN" in args else 0
    assert counted == composed + asked_hydra and result.stdout.count("Run plan") == plans, result.stdout[-2000:]


RUN_CONFIG = """\
import contextlib, sys
from hydra._internal import hydra
from omegaconf import OmegaConf
import hydralight.train as train

if sys.argv.pop(1) == "hydra-composes":  # the handover off: Hydra composes the run itself
    train.run_composed = lambda *handed: contextlib.nullcontext()
run_job = hydra.run_job

def recorded(**kwargs):
    print("RUN CONFIG", OmegaConf.to_yaml(kwargs["config"]), "END", file=sys.stderr, flush=True)
    return run_job(**kwargs)

hydra.run_job = recorded
train.cli()
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "args", [["experiment=fast", "optim.lr=2e-3", "hydra.run.dir=RUN"], ["seed=3", "+hydra.job.env_set.A=1"]]
)
def test_a_run_is_composed_once_and_runs_the_config_hydra_would_compose(args, tmp_path):
    """The config the command line's check composed is the one Hydra runs (Hydra does not compose it again):
    the same, key for key, as the config Hydra composes itself."""
    script = tmp_path / "record.py"
    script.write_text(RUN_CONFIG)
    configs = []
    for way in ("handed", "hydra-composes"):
        given = [a.replace("RUN", str(tmp_path / "run")) for a in args]  # without it: a dated dir in outputs/
        command = [sys.executable, str(script), way, *given, "plan=true"]
        result = run_python(command, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-2000:]
        configs.append(result.stderr.split("RUN CONFIG", 1)[1].split("END", 1)[0])
    assert configs[0] == configs[1] and "mode: RUN" in configs[0]


def test_a_good_config_composes_with_its_types():
    (cfg,) = compose_jobs(
        CONFIG_DIR, "train", Invocation(tuple(["optim.lr=2e-3", "precision=bf16-mixed", "mode=eval"]))
    )
    assert cfg.optim.lr == 2e-3 and cfg.trainer.precision == "bf16-mixed" and cfg.mode == "eval"
    assert f"{cfg.trainer.precision}" == "bf16-mixed"  # choices print as their value
    # A sweep's own config: its swept values are its jobs' (the sweeper checks each).
    (swept,) = compose_jobs(CONFIG_DIR, "train", Invocation(("-m", "hardware=cpu,1gpu", "optim.lr=3e-3,2e-3")))
    assert swept.optim.lr != 3e-3 and "hydra" not in swept


def test_trainer_schema_covers_every_argument_the_user_may_set():
    """Each Lightning Trainer argument is either typed in the trainer schema or set by the plan."""
    import inspect

    import pytorch_lightning as pl

    from hydralight.config.schema import PLANNED, TrainerConf

    lightning = set(inspect.signature(pl.Trainer.__init__).parameters) - {"self"}
    typed = set(TrainerConf.__dataclass_fields__)
    assert lightning - typed - set(PLANNED) == set(), "new Trainer arguments: add them to TrainerConf"
    assert typed - lightning == set(), "TrainerConf names arguments Lightning no longer has"


def test_printing_the_config_imports_no_torch(tmp_path):
    # A `torch` that refuses to import, first on the path: `--cfg job` and `plan=true` must not need it.
    blocker = tmp_path / "blocker" / "torch"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('torch was imported')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(blocker.parent), str(ROOT / "src")])}
    result = run_cli(["--cfg", "job", "optim.lr=2e-3"], tmp_path / "run", **env)
    assert result.returncode == 0 and "lr: 0.002" in result.stdout, result.stderr[-2000:]


def test_a_top_level_key_a_config_file_adds_is_refused_as_such_not_as_a_misspelling(tmp_path):
    """A config group of the user's (`+mygroup=b`) or an experiment's block of new keys was refused with "check
    the spelling", of a key nobody misspelt; the line says where it came from and how keys of one's own go in."""
    (tmp_path / "conf" / "mygroup").mkdir(parents=True)
    (tmp_path / "conf" / "mygroup" / "b.yaml").write_text("foo: 2\n")
    (tmp_path / "conf" / "experiment").mkdir()
    (tmp_path / "conf" / "experiment" / "mine.yaml").write_text("# @package _global_\nnotes:\n  owner: me\n")
    group = one_line(run_cli(["+mygroup=b", "--cfg", "job"], tmp_path / "run", cwd=tmp_path))
    assert group.startswith("error: the option mygroup=b adds the top-level key mygroup, which the run's config "), (
        group
    )
    assert group.endswith("add keys of your own from the command line (+mygroup.KEY=VALUE)")
    block = one_line(run_cli(["experiment=mine", "--cfg", "job"], tmp_path / "run", cwd=tmp_path))
    assert block.startswith("error: a config file adds the top-level key notes, which the run's config "), block
    assert one_line(run_cli(["sede=1", "--cfg", "job"], tmp_path / "run", cwd=tmp_path)).startswith(
        "error: sede is not a config key; check the spelling"
    )
    added = run_cli(["+notes.owner=me", "--cfg", "job"], tmp_path / "run", cwd=tmp_path)
    assert added.returncode == 0 and "owner: me" in added.stdout


def test_a_primary_config_that_does_not_build_on_the_project_s_is_one_line_and_leaves_no_run_dir(tmp_path):
    """`-cn standalone` with a config of the user's alone: a traceback (`Key 'plan' is not in struct`), and the run
    dir Hydra had made left behind."""
    (tmp_path / "mycfg").mkdir()
    (tmp_path / "mycfg" / "standalone.yaml").write_text("foo: 1\n")
    (tmp_path / "mycfg" / "mine.yaml").write_text("defaults:\n  - train\n  - _self_\nseed: 3\n")
    run = tmp_path / "run"
    line = one_line(run_cli(["-cd", "mycfg", "-cn", "standalone"], run, cwd=tmp_path))
    assert line.startswith("error: the primary config (--config-name) has none of hardware, strategy,"), line
    assert "start it with `defaults: [train, _self_]`" in line and not run.exists()
    built = run_cli(["-cd", "mycfg", "-cn", "mine", "plan=true"], run, cwd=tmp_path)
    assert built.returncode == 0 and "run dir" in built.stdout, built.stderr[-2000:]


def test_options_that_folders_added_to_the_search_hide_are_said_as_those_of_conf_are(tmp_path):
    """`-cd DIR` and `hydra.searchpath=[file://DIR]` come after the shipped options: a DIR/model/cnn.yaml or a
    DIR/train.yaml was never used, without a word (./conf's were said)."""
    (tmp_path / "extra" / "model").mkdir(parents=True)
    (tmp_path / "extra" / "model" / "cnn.yaml").write_text("_target_: mine.Net\n")
    (tmp_path / "extra" / "train.yaml").write_text("seed: 3\n")
    for added, folder in (
        (["-cd", "extra"], "extra"),
        ([f"hydra.searchpath=[file://{tmp_path / 'extra'}]"], tmp_path / "extra"),
    ):
        done = run_cli(["--cfg", "job", *added, "model=cnn"], tmp_path / "run", cwd=tmp_path)
        hidden = f"note: {folder}/model/cnn.yaml is not used: the shipped option model=cnn comes first"
        assert done.returncode == 0 and done.stderr.count(hidden) == 1, done.stderr[-2000:]
        assert f"note: {folder}/train.yaml is not used: the shipped primary config train.yaml" in done.stderr
    shipped = run_cli(["-cd", str(ROOT / "conf"), "--cfg", "job"], tmp_path / "run", cwd=tmp_path)
    assert shipped.returncode == 0 and "note:" not in shipped.stderr
