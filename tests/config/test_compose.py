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
    Invocation(("--cfg", "job", "-p", "trainer", "hydra.run.dir=my runs", "~seed", "-m", "a=1,2")).check_readable()


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
    result = run_cli(["hardware=cpu", *args], tmp_path / "unused", cwd=tmp_path)
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


def compositions(monkeypatch) -> list[int]:
    from hydra._internal.hydra import Hydra

    counted: list[int] = []
    original = Hydra.compose_config
    monkeypatch.setattr(Hydra, "compose_config", lambda self, *a, **k: counted.append(1) or original(self, *a, **k))
    return counted


def test_a_large_sweep_checks_every_value_it_sweeps_without_composing_every_job(monkeypatch, capsys):
    """A 100 x 100 x 2 grid: one config for each choice of the swept group, every value of the other keys set
    on the first job's config; its first job starts in seconds, not after 20,000 compositions."""
    from hydralight.config.compose import compose_jobs
    from hydralight.train import CONFIG_DIR

    counted = compositions(monkeypatch)
    configs = compose_jobs(CONFIG_DIR, "train", Invocation(("-m", *LARGE_GRID, "model=mlp,cnn")))
    assert [c.model._target_.rsplit(".", 1)[-1] for c in configs] == ["Classifier", "Classifier"]
    assert len(counted) <= 3 and len(configs) == 2  # the groups' names, and one config a model
    assert "sweep of 20000 jobs: checking every value it sweeps first (2 configs composed)" in capsys.readouterr().err
    # A wrong value anywhere in the grid is found before the first job, naming it.
    with pytest.raises(UserError, match=r"optim.lr=abc is not a number"):
        compose_jobs(CONFIG_DIR, "train", Invocation(("-m", *LARGE_GRID, "optim.lr=0.1,0.2,abc")))
    with pytest.raises(UserError, match=r"model=cnnx is not an option of model"):
        compose_jobs(CONFIG_DIR, "train", Invocation(("-m", *LARGE_GRID, "model=mlp,cnnx")))
    with pytest.raises(UserError, match=r"optim.lr=range\(5\),abc cannot be expanded into values"):
        compose_jobs(CONFIG_DIR, "train", Invocation(("-m", "seed=1,2", "optim.lr=range(5),abc")))


def test_hydras_check_of_a_large_batch_composes_one_job_for_each_swept_choice():
    """The default sweeper (hydra/sweeper=hydralight_basic) checks a batch before launching it as Hydra's does,
    but of a large grid only the jobs that give a choice no job before gave (here: the first, and model=cnn)."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from hydra_plugins.hydralight_launchers import CheckedSweeper
    from hydralight.config import compose

    loaded = []
    loader = SimpleNamespace(load_sweep_config=lambda master_config, sweep_overrides: loaded.append(sweep_overrides))
    sweeper = CheckedSweeper(max_batch_size=None)
    sweeper.hydra_context = SimpleNamespace(config_loader=loader)
    sweeper.config = OmegaConf.create({"hydra": {"runtime": {"choices": {"model": "mlp", "optim": "adam"}}}})
    batch = [
        [f"seed={s}", f"optim.lr={lr}", f"model={m}"] for m in ("mlp", "cnn") for s in range(100) for lr in range(3)
    ]
    compose._checked_sweep.clear()
    sweeper.validate_batch_is_legal(batch)
    assert loaded == [batch[0], batch[300]]
    compose._checked_sweep.append(len(batch))  # train.py checked it already: not again
    loaded.clear()
    sweeper.validate_batch_is_legal(batch)
    assert loaded == []
    compose._checked_sweep.clear()
