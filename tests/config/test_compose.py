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
