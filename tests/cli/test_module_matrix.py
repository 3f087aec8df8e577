"""Researchers' own code through every path of `train.py`, unchanged: a lightning-hydra-template project, a module
written against `lightning`, and a manual-optimization GAN each run, continue, run on 2 processes, sweep and search."""

import json

import pytest
from conftest import HELPERS, run_cli

TEMPLATE, USER = HELPERS / "template_project", HELPERS / "user_project"
MODULES = {
    "template": (TEMPLATE, ["model=tpl_mnist", "data=tpl_mnist", "data.train_val_test_split=[600,100,100]",
                            "batch.global_size=32"], "model.optimizer.lr"),
    "lightning": (USER, ["model=lit", "data=lit_points", "objective.metric=val/mse", "objective.direction=min",
                         "batch.global_size=32"], "model.lr"),
    "gan": (USER, ["model=gan", "data.val_size=100", "batch.global_size=32", "batch.eval_size=50",
                   "objective.metric=val/d_loss", "objective.direction=min", "strategy.find_unused_parameters=true",
                   "strategy=ddp"], "model.lr"),
}  # fmt: skip
# How a GAN's batch counts: both optimizers step, so Lightning counts 2 steps a batch.
STEPS = {"template": 1, "lightning": 1, "gan": 2}


def run(name, args, where, data):
    folder, own, _ = MODULES[name]
    flags = [a for a in args if a == "-m"]  # before every override: Hydra reads them as one group
    done = run_cli([*flags, "hardware=cpu", *own, *(a for a in args if a not in flags)], where, data, cwd=folder,
                   PYTHONPATH=str(folder))  # fmt: skip
    assert done.returncode == 0, (name, args, done.stdout[-2000:], done.stderr[-3000:])
    assert "Traceback" not in done.stderr
    return done


def results(folder):
    return json.loads((folder / "results.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODULES))
def test_run_continue_two_processes(name, tiny_data, tmp_path):
    per = STEPS[name]
    one = tmp_path / "one"
    run(name, [f"trainer.max_steps={4 * per}"], one, tiny_data)
    assert results(one)["global_step"] == 4 * per
    run(name, [f"trainer.max_steps={8 * per}"], one, tiny_data)  # the same dir, a larger budget: continued
    assert results(one)["global_step"] == 8 * per
    assert "continuing from this run's own" in (one / "train.log").read_text()
    two = tmp_path / "two"
    run(name, [f"trainer.max_steps={4 * per}", "hardware.devices=2"], two, tiny_data)
    ranks = sorted(p.name for p in (two / "ranks").glob("rank*.json"))
    assert ranks == ["rank0.json", "rank1.json"] and results(two)["global_step"] == 4 * per


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODULES))
def test_sweep_and_search(name, tiny_data, tmp_path):
    per, key = STEPS[name], MODULES[name][2]
    sweep = tmp_path / "sweep"
    run(
        name,
        ["-m", f"trainer.max_steps={2 * per}", f"{key}=0.001,0.01", f"hydra.sweep.dir={sweep}"],
        tmp_path,
        tiny_data,
    )
    assert sorted(results(sweep / str(i))["global_step"] for i in (0, 1)) == [2 * per, 2 * per]
    search = tmp_path / "search"
    run(name, ["-m", f"trainer.max_steps={2 * per}", "hparams_search=optuna", "hydra.sweeper.n_trials=2",
               "hydra.sweeper.n_jobs=1", f"{key}=tag(log, interval(1e-3, 1e-1))", f"hydra.sweep.dir={search}"],
        tmp_path, tiny_data)  # fmt: skip
    found = json.loads((search / "search.json").read_text())
    assert [t["state"] for t in found["trials"]] == ["COMPLETE", "COMPLETE"], found["trials"]
    assert all(key in {k.lstrip("+") for k in t["params"]} for t in found["trials"]), found["trials"]
