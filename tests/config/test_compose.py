"""The command line read before Hydra: an override Hydra cannot parse is one line that says how to write it."""

import re
import shlex

import pytest
from conftest import one_line, run_cli

from hydralight.config.compose import Invocation
from hydralight.errors import UserError

SPLIT = "error: hydra.run.dir=my runs/a reached Hydra as 2 words; a value with spaces needs quotes, in the value and "
SPACED = "a value with spaces needs quotes inside the override: "


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["seed=1", "hydra.run.dir=my", "runs/a"], "hydra.run.dir=my runs/a reached Hydra as 2 words"),
        (["hydra.run.dir=a", "b", "c", "seed=1"], "hydra.run.dir=a b c reached Hydra as 3 words"),
        (["x=it's a (b)"], """(unexpected "'" at character 5); """ + SPACED + '''"x=\\"it's a (b)\\""'''),
        (["optim.lr=1e-3)"], "(extraneous input ')' expecting <EOF>); to pass the value as written, quote it"),
        (["runs/a"], "runs/a is not an override (missing EQUAL at '<EOF>'); write key=value"),
    ],
)
def test_an_override_hydra_cannot_parse_is_one_line(argv, said):
    with pytest.raises(UserError) as err:
        Invocation(tuple(argv)).check_readable()
    assert said in str(err.value) and "\n" not in str(err.value)


def test_flags_and_their_values_are_no_overrides():
    Invocation(("--cfg", "job", "-p", "trainer", "-m", "hydra.run.dir=my runs", "~seed", "a=1,2")).check_readable()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["hydra.run.dir=my", "runs/a"], SPLIT + """around the override: "hydra.run.dir='my runs/a'\""""),
        (
            ["hydra.run.dir=outputs/my run (2)"],
            "error: hydra.run.dir=outputs/my run (2) cannot be read (mismatched input ' (' expecting <EOF>); "
            + SPACED
            + """"hydra.run.dir='outputs/my run (2)'\"""",
        ),
        (
            ["-m", "seed=1,2", "hydra.sweep.dir=my", "sweeps"],
            "error: hydra.sweep.dir=my sweeps reached Hydra as 2 words; a value with spaces needs quotes, in the "
            """value and around the override: "hydra.sweep.dir='my sweeps'\"""",
        ),
    ],
)
def test_an_unquoted_dir_with_spaces_is_refused_in_one_line_before_anything_is_written(tmp_path, args, line):
    flags = [a for a in args if a == "-m"]
    result = run_cli([*flags, "hardware=cpu", *(a for a in args if a not in flags)], tmp_path / "unused", cwd=tmp_path)
    assert one_line(result) == line
    assert result.stderr.strip().splitlines() == [line]
    assert list(tmp_path.iterdir()) == []  # no outputs/ or multirun/, no run dir
    # The form the line gives is the one Hydra reads as meant.
    (fixed,) = shlex.split(line.rsplit(": ", 1)[1])
    printed = run_cli(["hardware=cpu", fixed, "--cfg", "hydra"], tmp_path / "unused", cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr[-2000:]
    assert f"  dir: {fixed.split('=', 1)[1].strip(chr(39))}\n" in printed.stdout
    assert list(tmp_path.iterdir()) == []


def test_cfg_with_a_sweep_is_one_line():
    from hydralight.config.compose import compose_jobs
    from hydralight.train import CONFIG_DIR

    with pytest.raises(UserError, match="--cfg prints the config of one run; drop -m"):
        compose_jobs(CONFIG_DIR, "train", Invocation(("--cfg", "job", "-m", "optim.lr=1,2")))


@pytest.mark.parametrize("arg", ["+note=a\nrun dir: /etc", "seed=1\r", "x=\x1b[2Jcleared"])
def test_a_control_character_in_an_override_is_refused_escaped(arg):
    with pytest.raises(UserError) as err:
        Invocation((arg,)).check_readable()
    said = str(err.value)
    assert "holds a control character" in said and "\n" not in said and "\r" not in said and "\x1b" not in said


@pytest.mark.parametrize(("deleted", "said"), [("~objective", "set its keys (objective.KEY=...)"),
                                               ("~mode", "give it a value (mode=...)")])  # fmt: skip
def test_deleting_a_key_every_run_reads_is_one_line(deleted, said):
    from hydralight.config.compose import compose_jobs
    from hydralight.train import CONFIG_DIR

    with pytest.raises(UserError, match=re.escape(f"{deleted} deletes {deleted[1:]}, which every run reads; {said}")):
        compose_jobs(CONFIG_DIR, "train", Invocation((deleted,)))


@pytest.mark.parametrize("variables", [{"RANK": "1"}, {"LOCAL_RANK": "0"}, {"RANK": "0", "LOCAL_RANK": "1"}])
def test_rank_variables_of_another_launch_are_refused(monkeypatch, variables):
    from hydralight.rundir.launch import check_rank_variables

    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UserError, match="no launcher .torchrun, srun. started this process"):
        check_rank_variables()
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")  # torchrun's own ranks
    check_rank_variables()


def test_rank_zero_alone_is_no_stale_launch(monkeypatch):
    from hydralight.rundir.launch import check_rank_variables

    monkeypatch.setenv("RANK", "0")
    check_rank_variables()


def test_a_dict_value_for_a_dict_key_says_how_to_write_it():
    from hydralight.config.compose import compose_jobs
    from hydralight.train import CONFIG_DIR

    with pytest.raises(UserError, match=re.escape("write '++cluster.sbatch={mail-type: END}'")):
        compose_jobs(CONFIG_DIR, "train", Invocation(("cluster.sbatch={mail-type: END}",)))
    (cfg,) = compose_jobs(CONFIG_DIR, "train", Invocation(("++cluster.sbatch={mail-type: END}",)))
    assert dict(cfg.cluster.sbatch) == {"mail-type": "END"}


LARGE_GRID = ("seed=range(100)", "data.val_size=range(1000,1100)")  # 10,000 jobs


def checked_sweep(*overrides: str) -> tuple[list[list[str]], list[list[str]]]:
    """A sweep's jobs as the default sweeper checks them (its config composed as Hydra composes it), and the
    jobs whose configs it composed."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    from hydralight.config.compose import check_sweep
    from hydralight.config.resolve import check_task_values
    from hydralight.train import CONFIG_DIR

    composed: list[list[str]] = []
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        master = loader.load_configuration("train", list(overrides), run_mode=RunMode.MULTIRUN)
        groups = frozenset(str(name) for name in master.hydra.runtime.choices)
        parser = OverridesParser.create(config_loader=loader)
        jobs = check_sweep(
            list(overrides),
            groups,
            parser,
            lambda job: composed.append(job) or loader.load_sweep_config(master, job),
            check_task_values,
        )
    return jobs, composed


def test_a_large_sweep_checks_every_value_it_sweeps_without_composing_every_job(capsys):
    """A 100 x 100 x 2 grid: one config for each choice of the swept group, every value of the other keys set
    on the first job's config; its first job starts in seconds, not after 20,000 compositions."""
    jobs, composed = checked_sweep(*LARGE_GRID, "model=mlp,cnn")
    assert len(jobs) == 20_000 and [job[-1] for job in composed] == ["model=mlp", "model=cnn"]
    assert "sweep of 20000 jobs: checking every value it sweeps first (2 configs composed)" in capsys.readouterr().err
    # A wrong value anywhere in the grid is found before the first job, naming it.
    with pytest.raises(UserError, match=r"optim.lr=abc is not a number"):
        checked_sweep(*LARGE_GRID, "optim.lr=0.1,0.2,abc")
    # A value of the right type that the run refuses, too.
    with pytest.raises(UserError, match=r"\(optim.lr=-1\): optim.lr=-1.0 must be a positive number"):
        checked_sweep(*LARGE_GRID, "optim.lr=0.1,-1")
    with pytest.raises(UserError, match=r"model=cnnx is not an option of model"):
        checked_sweep(*LARGE_GRID, "model=mlp,cnnx")
    with pytest.raises(UserError, match=r"optim.lr=range\(5\),abc cannot be expanded into values"):
        checked_sweep("seed=1,2", "optim.lr=range(5),abc")
    # An interval without a search: a grid has no values to take from it.
    with pytest.raises(UserError, match=r"optim.lr=interval\(0.001,0.01\) is an interval, which only a search samples: "
                                        r"add hparams_search=optuna"):  # fmt: skip
        checked_sweep("seed=1,2", "optim.lr=interval(0.001,0.01)")


def test_a_small_sweep_composes_each_job_once_with_its_types():
    jobs, composed = checked_sweep("hardware=cpu,1gpu", "optim.lr=1e-3,2e-3")
    assert composed == jobs and len(jobs) == 4
    with pytest.raises(UserError, match=r"^sweep job 1 \(hardware=cpu optim.lr=abc\): optim.lr=abc is not a number"):
        checked_sweep("hardware=cpu,1gpu", "optim.lr=1e-3,abc")
    with pytest.raises(UserError, match=r"^sweep job 1 \(hardware=cpu batch.global_size=0\): batch.global_size=0 must"):
        checked_sweep("hardware=cpu,1gpu", "batch.global_size=32,0")


def test_the_launcher_runs_the_config_the_sweep_check_composed():
    """The sweeper's loader hands each job's checked config to the launcher once (a job given twice, twice);
    any other job is composed by Hydra's loader; the loader pickles with the launcher that holds it."""
    import pickle
    from types import SimpleNamespace

    from hydralight.config.compose import ComposedOnce

    composed = []
    hydra_loader = SimpleNamespace(
        load_sweep_config=lambda master, job: composed.append(job) or f"composed {job}", name="hydra's"
    )
    loader = ComposedOnce(hydra_loader)
    loader.keep(["seed=1"], "checked 1")
    loader.keep(["seed=1"], "checked 1 again")
    assert loader.load_sweep_config(None, ["seed=1"]) == "checked 1"
    assert loader.load_sweep_config(None, ["seed=1"]) == "checked 1 again"
    assert loader.load_sweep_config(None, ["seed=1"]) == "composed ['seed=1']" and composed == [["seed=1"]]
    assert loader.name == "hydra's"
    copied = pickle.loads(pickle.dumps(ComposedOnce({"a": 1})))
    assert copied._loader == {"a": 1} and copied._kept == {}


@pytest.mark.parametrize(
    ("argv", "fixed"),
    [
        (["seed=1", "-m", "optim.lr=1,2"], "python train.py -m seed=1 optim.lr=1,2"),
        (["optim.lr=2", "--cfg", "job", "seed=3"], "python train.py --cfg job optim.lr=2 seed=3"),
    ],
)
def test_overrides_on_both_sides_of_a_flag_are_one_line_saying_how_to_write_them(argv, fixed):
    """Hydra reads the command line as it is (it is never rewritten): what its parser would refuse with its usage
    text is one line."""
    with pytest.raises(UserError) as err:
        Invocation(tuple(argv)).check_readable()
    assert str(err.value).endswith(fixed) and "\n" not in str(err.value)
    assert Invocation(tuple(fixed.split()[2:])).override_args == [a for a in argv if "=" in a]


class _Mine:
    """A module of the user's, named over a shipped (typed) option on the command line."""

    def __init__(self, width: int = 4, crash: bool = False) -> None:
        self.width, self.crash = width, crash


@pytest.mark.parametrize("group", ["model", "data"])
def test_a_target_named_over_a_shipped_option_takes_its_own_arguments(group):
    """`model._target_=my.Module model.width=8`: the shipped option's schema says nothing of the new module's
    arguments; those its constructor takes are added (`++`) and pass the composed config's check, in a sweep too."""
    from hydralight.config.compose import compose_jobs, reach_module_arguments
    from hydralight.train import CONFIG_DIR

    argv = (f"{group}._target_={__name__}._Mine", f"{group}.width=8")
    reached = reach_module_arguments(CONFIG_DIR, "train", Invocation(argv))
    assert reached.argv == (argv[0], f"++{group}.width=8")
    (cfg,) = compose_jobs(CONFIG_DIR, "train", reached)
    assert cfg[group].width == 8
    handed: list = []
    (cfg,) = compose_jobs(CONFIG_DIR, "train", Invocation(argv), set(), handed, "train")  # as the command line gives it
    assert cfg[group].width == 8
    # Hydra's record (overrides.yaml, the job's name) says what was typed.
    assert list(handed[0].hydra.overrides.task) == list(argv) and "++" not in handed[0].hydra.job.override_dirname
    swept = reach_module_arguments(CONFIG_DIR, "train", Invocation(("-m", *argv[:1], f"{group}.crash=true,false")))
    assert swept.argv[-1] == f"++{group}.crash=true,false"
    # Not an argument of the module: one line naming what it takes.
    with pytest.raises(UserError, match=rf"{group}.depth is not an argument of _Mine \(it takes crash, width\)"):
        compose_jobs(CONFIG_DIR, "train", Invocation((*argv[:1], f"{group}.depth=2")))


@pytest.mark.slow
def test_a_sweep_into_a_dated_dir_keeps_its_jobs_in_it(tiny_data, tmp_path):
    """Without hydra.sweep.dir every job of a sweep lands in the one dated folder the sweep resolved (each job's
    config is composed before the sweep writes its record, and takes the sweep's time)."""
    from conftest import TINY

    done = run_cli(["-m", *TINY, "trainer.max_steps=1", "seed=1,2"], tmp_path / "unused", tiny_data, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    (sweep,) = (tmp_path / "multirun").glob("*/*")
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1"]
    assert (
        sweep / "multirun.yaml"
    ).is_file() and f"sweep {sweep.relative_to(tmp_path)}: 2 of 2 jobs done" in done.stdout
