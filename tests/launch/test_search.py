"""Hyperparameter search (hydralight.search): real trials through the CLI, Optuna's SQLite storage, SLURM."""

import json
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import TINY, csv_rows, one_line, run_cli
from hydra.core.override_parser.overrides_parser import OverridesParser
from test_slurm import cluster  # noqa: F401  (the fixture that brings the local SLURM cluster up)
from test_slurm import sweep as slurm_sweep

from hydralight.errors import UserError
from hydralight.launch.search import override_text, reproduce_command, to_dimension
from hydralight.reports.sweep import write_report

# A short trial: a few steps of the MLP on tiny data, so the learning rate decides the validation accuracy.
TRIAL = [*TINY, "trainer.limit_train_batches=3", "batch.global_size=choice(16, 32, 64)"]
NAN = {"optim.lr": 1e12, "batch.global_size": 32}  # SGD at this rate overflows within a step or two


def search(args: list[str], sweep_dir: Path, data: Path, preset: str = "hparams_search=optuna"):
    return run_cli(["-m", preset, "optim=sgd", "optim.lr_scaling=none", *TRIAL, *args,
                    f"hydra.sweep.dir={sweep_dir}"], sweep_dir, data)  # fmt: skip


def trials(sweep_dir: Path) -> list[dict]:
    return json.loads((sweep_dir / "search.json").read_text())["trials"]


def best_val(run: Path) -> float:
    return max(float(r["val/acc"]) for r in csv_rows(run) if "val/acc" in r)


def enqueue(*params: dict) -> str:
    items = ",".join("{" + ",".join(f"{k}:{v}" for k, v in p.items()) + "}" for p in params)
    return f"hydra.sweeper.enqueue=[{items}]"


def test_sweep_syntax_maps_to_optuna_distributions():
    parse = OverridesParser.create().parse_overrides
    lr, size, steps, width = parse(
        [
            "optim.lr=tag(log, interval(1e-4, 1e-1))",
            "batch.global_size=choice(32, 64)",
            "trainer.max_steps=range(10, 40, 10)",
            "x.width=tag(int, interval(8, 64))",
        ]  # fmt: skip
    )
    assert to_dimension(lr).describe() == {"kind": "float", "low": 1e-4, "high": 0.1, "step": None, "log": True}
    assert to_dimension(size).describe() == {"kind": "categorical", "choices": [32, 64]}
    assert to_dimension(steps).describe() == {"kind": "int", "low": 10, "high": 30, "step": 10, "log": False}
    assert to_dimension(width).describe() == {"kind": "int", "low": 8, "high": 64, "step": 1, "log": False}
    with pytest.raises(UserError, match="cannot be searched"):
        to_dimension(parse(["model=glob(*)"])[0])
    for bad, message in (("x=tag(lg, interval(1, 2))", "unknown tag lg"), ("x=range(5, 1)", "Optuna can sample"),
                         ("x=interval(2, 1)", "Optuna can sample"), ("x=tag(int, log, interval(0, 8))", "Optuna can sample")):  # fmt: skip
        with pytest.raises(UserError, match=message):
            to_dimension(parse([bad])[0])
    # A sampled value goes back to Hydra as the same value (strings that read as other types stay strings).
    for value in (1e-05, 0.003, 64, True, "a b", "relu", "true", "1e-3", "null", "x=y", "it's"):
        (parsed,) = parse([override_text("k", value)])
        assert parsed.value() == value
    assert reproduce_command(["hparams_search=optuna", "optim.lr=0.01"]) == "python train.py optim.lr=0.01"


@pytest.mark.slow
def test_a_search_survives_a_failing_trial_and_names_the_best(tiny_data, tmp_path):
    sweep_dir = tmp_path / "search"
    result = search(["hydra.sweeper.n_trials=4", enqueue(NAN, {"optim.lr": 0.05, "batch.global_size": 32})],
                    sweep_dir, tiny_data)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    found = trials(sweep_dir)
    assert [t["number"] for t in found] == [0, 1, 2, 3]
    assert found[0]["state"] == "FAIL" and "the loss is" in found[0]["reason"]
    complete = [t for t in found if t["state"] == "COMPLETE"]
    assert len(complete) == 3
    for trial in complete:
        # The objective is the job's best validation accuracy, never its test accuracy.
        assert trial["value"] == pytest.approx(best_val(sweep_dir / trial["job"]), abs=1e-6)
    best = yaml.safe_load((sweep_dir / "best.yaml").read_text())
    assert best["value"] == max(t["value"] for t in complete)
    assert best["metric"] == "val/acc" and best["test"]["test/acc"] is not None
    assert "hparams_search" not in best["command"] and f"optim.lr={best['params']['optim.lr']!r}" in best["command"]
    assert "search" in result.stdout + result.stderr and "1 failed" in result.stdout + result.stderr
    # The report of the search dir: trials ranked, the failed one with its reason, and the plots.
    summary = write_report(sweep_dir)
    assert {p.name for p in summary["files"]} >= {"history.png", "slice.png", "curves.png"}  # contour: 10 trials
    report = (sweep_dir / "report.md").read_text()
    assert "the loss is" in report and best["command"] in report
    # The command in best.yaml is the best trial again, as a single run.
    args = best["command"].split()[2:]
    rerun = run_cli(args, tmp_path / "rerun", tiny_data)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert best_val(tmp_path / "rerun") == pytest.approx(best["value"], abs=1e-6)


@pytest.mark.slow
def test_a_search_with_storage_continues_its_study(tiny_data, tmp_path):
    sweep_dir = tmp_path / "search"
    common = ["hydra/launcher=local", "hydra.sweeper.n_jobs=2", "hydra.sweeper.seed=3"]
    first = search([*common, "hydra.sweeper.n_trials=2"], sweep_dir, tiny_data)
    assert first.returncode == 0, first.stderr[-3000:]
    assert [t["state"] for t in trials(sweep_dir)] == ["COMPLETE", "COMPLETE"]
    stamps = lambda jobs: {job: (sweep_dir / job / "results.json").stat().st_mtime for job in jobs}  # noqa: E731
    first_two = stamps(["0", "1"])
    # A search stopped while trial 2 ran: the study holds it as running, its job dir is 2.
    storage = f"sqlite:///{sweep_dir / 'optuna.db'}"
    study = optuna.load_study(study_name="search", storage=storage)
    stopped = study.ask({"optim.lr": optuna.distributions.FloatDistribution(1e-4, 3e-2, log=True),
                         "batch.global_size": optuna.distributions.CategoricalDistribution([16, 32, 64])})  # fmt: skip
    stopped.set_user_attr("job", "2")

    again = search([*common, "hydra.sweeper.n_trials=4"], sweep_dir, tiny_data)
    assert again.returncode == 0, again.stderr[-3000:]
    found = trials(sweep_dir)
    assert [(t["number"], t["state"], t["job"]) for t in found] == [
        (0, "COMPLETE", "0"), (1, "COMPLETE", "1"), (2, "COMPLETE", "2"), (3, "COMPLETE", "3")
    ]  # fmt: skip
    assert found[2]["params"] == stopped.params  # the stopped trial ran as it was asked, in its own dir
    assert stamps(["0", "1"]) == first_two
    # Nothing left to do: the same command again runs no trial.
    all_four = stamps(["0", "1", "2", "3"])
    done = search([*common, "hydra.sweeper.n_trials=4"], sweep_dir, tiny_data)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(trials(sweep_dir)) == 4 and stamps(["0", "1", "2", "3"]) == all_four
    # Other choices cannot continue this study (Optuna keeps a parameter's choices): one line, nothing run.
    changed = search([*common, "hydra.sweeper.n_trials=5", "batch.global_size=choice(16, 32)"], sweep_dir, tiny_data)
    assert "search the same space to continue it" in one_line(changed)
    assert len(trials(sweep_dir)) == 4


@pytest.mark.slow
def test_values_the_plan_refuses_are_left_out_and_a_space_with_none_is_one_line(tiny_data, tmp_path):
    refused = search(["hardware.devices=2", "batch.global_size=choice(33, 35)"], tmp_path / "none", tiny_data)
    line = one_line(refused)
    assert "every value of batch.global_size is refused" in line and "divisible" in line
    assert not (tmp_path / "none").exists()
    misspelt = search(["optim.lrr=tag(log, interval(1e-4, 1e-2))"], tmp_path / "typo", tiny_data)
    assert "optim.lrr cannot be searched: optim.lrr is not a config key" in one_line(misspelt)
    outside = search([enqueue({"optim.lr": 0.01, "batch.global_size": 48})], tmp_path / "enqueued", tiny_data)
    assert "hydra.sweeper.enqueue has batch.global_size=48, not one of the values searched" in one_line(outside)
    # The preset is a multirun by itself (as the template's are): without -m it searches.
    single = run_cli(["hparams_search=optuna", *TINY, "hydra.sweeper.n_trials=1", f"hydra.sweep.dir={tmp_path / 's'}"],
                     tmp_path / "single", tiny_data)  # fmt: skip
    assert single.returncode == 0 and "1 of 1 trials done" in single.stdout + single.stderr, single.stderr[-2000:]
    nothing = search(["batch.global_size=16"], tmp_path / "empty", tiny_data, preset="hydra/sweeper=optuna")
    assert "nothing to search" in one_line(nothing)
    on_test = search(["objective.metric=test/acc"], tmp_path / "on_test", tiny_data)
    assert "objective.metric=test/acc is a test metric" in one_line(on_test) and not (tmp_path / "on_test").exists()
    assert (
        one_line(search(["hydra.sweeper.n_trials=0"], tmp_path / "none_tried", tiny_data)).removeprefix("error: ")
        == "hydra.sweeper.n_trials=0 must be at least 1"
    )


@pytest.mark.slow
def test_a_search_where_every_trial_fails_ends_non_zero_with_its_reasons(tiny_data, tmp_path):
    result = search(["hydra.sweeper.n_trials=1", "optim.lr=choice(1e12)", "batch.global_size=32"],
                    tmp_path / "search", tiny_data)  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stdout + result.stderr
    assert "0 of 1 trials done, 1 failed (#0 failed: the loss is" in result.stdout + result.stderr
    assert not (tmp_path / "search" / "best.yaml").exists()


@pytest.mark.slow
def test_a_refused_batch_size_is_never_tried(tiny_data, tmp_path):
    sweep_dir = tmp_path / "search"
    result = search(["hardware.devices=2", "hydra.sweeper.n_trials=2", "batch.global_size=choice(33, 32)"],
                    sweep_dir, tiny_data)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "batch.global_size=33 left out of the search" in result.stdout + result.stderr
    space = json.loads((sweep_dir / "search.json").read_text())["space"]
    assert space["batch.global_size"]["choices"] == [32]
    assert {t["params"]["batch.global_size"] for t in trials(sweep_dir)} == {32}


@pytest.mark.slow
@pytest.mark.usefixtures("cluster")
def test_search_trials_run_as_slurm_jobs(tiny_data, tmp_path):
    sweep_dir = tmp_path / "search"
    args = ["hparams_search=optuna", "optim=sgd", *TRIAL, "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=2"]
    code, output = slurm_sweep(args, sweep_dir, tiny_data)
    assert code == 0, output[-3000:]
    found = trials(sweep_dir)
    assert [t["state"] for t in found] == ["COMPLETE", "COMPLETE"]
    submitted = json.loads((sweep_dir / "jobs.json").read_text())
    assert sorted(submitted) == ["0", "1"] and all(entry["job_id"] for entry in submitted.values())
    for trial in found:
        assert trial["value"] == pytest.approx(best_val(sweep_dir / trial["job"]), abs=1e-6)


@pytest.mark.slow
def test_a_trial_over_several_seeds_is_scored_by_their_mean(tiny_data, tmp_path):
    sweep_dir = tmp_path / "search"
    result = search(["hydra.sweeper.n_trials=2", "hydra.sweeper.seeds=2", "seed=7"], sweep_dir, tiny_data)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((sweep_dir / "search.json").read_text())
    assert summary["seeds"] == 2
    found = summary["trials"]
    assert [t["state"] for t in found] == ["COMPLETE", "COMPLETE"]
    assert [t["jobs"] for t in found] == [["0", "1"], ["2", "3"]]  # one job per seed, numbered in turn
    for trial in found:
        objectives = []
        for run in trial["seeds"]:
            results = json.loads((sweep_dir / run["job"] / "results.json").read_text())
            overrides = yaml.safe_load((sweep_dir / run["job"] / ".hydra" / "overrides.yaml").read_text())
            # seed=7 on the command line is where the seeds start: 7 and 8, each job its own.
            assert [o for o in overrides if o.startswith("seed=")] == [f"seed={run['seed']}"]
            assert run["value"] == results["objective"]["value"] == pytest.approx(best_val(sweep_dir / run["job"]))
            objectives.append(results["objective"]["value"])
        assert [run["seed"] for run in trial["seeds"]] == [7, 8]
        assert trial["value"] == pytest.approx(sum(objectives) / len(objectives), abs=1e-12)
    # The optuna study holds the mean too: it is what TPE proposes from.
    study = optuna.load_study(study_name="search", storage=f"sqlite:///{sweep_dir / 'optuna.db'}")
    assert [t.value for t in study.trials] == [t["value"] for t in found]
    best = yaml.safe_load((sweep_dir / "best.yaml").read_text())
    assert best["value"] == max(t["value"] for t in found) and best["command"].endswith("seed=7,8")
    assert best["command"].startswith("python train.py -m ")
    # The report groups each trial's jobs into one row: the same mean, over n=2.
    report = write_report(sweep_dir)
    assert sorted(round(float(r[2]), 4) for r in report["group_rows"]) == sorted(round(t["value"], 4) for t in found)
    assert {r[1] for r in report["group_rows"]} == {"2"}
    text = (sweep_dir / "report.md").read_text()
    assert "Each trial's value is the mean over 2 seeds." in text and "| trial | state | val/acc | per seed |" in text
    first = found[0]["seeds"]
    assert f"{first[0]['seed']}: {first[0]['value']:.6g}, {first[1]['seed']}: {first[1]['value']:.6g}" in text
    # A continued study keeps its seeds; searching the seed itself cannot be averaged over seeds.
    fewer = search(["hydra.sweeper.n_trials=3", "hydra.sweeper.seeds=1", "seed=7"], sweep_dir, tiny_data)
    assert "scored each trial over 2 seed(s), not 1" in one_line(fewer)
    searched = search(["hydra.sweeper.seeds=2", "seed=choice(1, 2)"], tmp_path / "seeded", tiny_data)
    assert "seed cannot be searched as well" in one_line(searched) and not (tmp_path / "seeded").exists()


@pytest.mark.slow
def test_a_preset_dimension_set_to_null_is_left_out(tiny_data, tmp_path):
    done = search(["hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=1", "hydra.sweeper.params={optim.lr: null}"],
                  tmp_path / "s", tiny_data)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert [set(t["params"]) for t in trials(tmp_path / "s")] == [{"batch.global_size"}] * 2


def test_plan_true_prints_the_plan_trials_share_and_runs_no_trial(tiny_data, tmp_path):
    sweep_dir = tmp_path / "search"
    result = run_cli(["-m", "hparams_search=optuna", "hydra.sweeper.n_trials=3", *TINY, "plan=true",
                      f"hydra.sweep.dir={sweep_dir}"], tmp_path, tiny_data)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("Run plan") == 1 and "none of the search's 3 trials runs" in result.stdout
    # No study, no trial dir: a plan writes nothing a later search would continue.
    assert not sweep_dir.exists()
