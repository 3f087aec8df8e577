"""A user's own LightningModule and LightningDataModule (tests/helpers/user_project: a package and ./conf of
the folder the run starts from, written without any part of hydralight) through `train.py`: trained as
they are, judged by their own validation metric, continued, refused in one line where they cannot run."""

import json
import os
import re
import signal

import pytest
import torch
import yaml
from conftest import HELPERS, TINY, csv_rows, one_line, run_cli

PROJECT = HELPERS / "user_project"
# A regression module on dict batches, judged by its validation mean squared error.
# 512 training points in global batches of 32: 16 steps an epoch.
REGRESSION = ["model=regressor", "data=points", "hardware=cpu", "objective.metric=val/mse", "batch.global_size=32",
              "objective.direction=min", "trainer.max_epochs=3", "trainer.log_every_n_steps=2"]  # fmt: skip


def user_run(args, run, data=None, **env):
    return run_cli(args, run, data, cwd=PROJECT, **{"PYTHONPATH": str(PROJECT), **env})


def ok(result):
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
    return result


def results(run):
    return json.loads((run / "results.json").read_text())


def test_a_user_module_trains_as_it_is_and_is_judged_by_its_own_metric(tmp_path):
    run = tmp_path / "run"
    result = ok(user_run([*REGRESSION, "optim.lr=0.01"], run))
    lines = result.stdout.splitlines()
    # The plan line shows the learning rate the module received; the last line its own test metric.
    assert lines[0].startswith("plan: 1 cpu process") and "lr 0.01" in lines[0] and "Regressor" in lines[0]
    assert lines[-1].startswith("test/mse=") and "Traceback" not in result.stderr
    found = results(run)
    validated = [float(r["val/mse"]) for r in csv_rows(run) if "val/mse" in r]
    assert len(validated) == 3 and found["objective"] == {"metric": "val/mse", "direction": "min",
                                                            "value": pytest.approx(min(validated))}  # fmt: skip
    assert found["test"]["test/mse"] == pytest.approx(float(lines[-1].split()[0].split("=")[1]), abs=1e-4)
    assert "test/acc" not in found  # the classifier's headline only where a module measures accuracy
    assert "epoch000-step" not in found["best_checkpoint"] or min(validated) == validated[0]
    # Its constructor got the plan's lr and the data's input size; its own hyperparameters are saved plain.
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["hyper_parameters"] == {"in_features": 4, "hidden": 32, "lr": 0.01, "dropout": 0.1}
    assert json.loads((run / "ranks" / "rank0.json").read_text())["lr"] == 0.01
    # Its dropout is keyed by the project where it can be: these batches carry no sample ids, and it says so.
    reasons = found["world_size_invariance"]["reasons"]
    assert any("no sample ids" in r for r in reasons) and any("does not shard by rank" in r for r in reasons)


@pytest.mark.slow
def test_a_user_module_continues_after_a_stop_and_a_larger_budget_and_refuses_other_settings(tmp_path):
    run = tmp_path / "run"
    stop = ["+callbacks.zz_signal._target_=signal_at.SignalAt", "+callbacks.zz_signal.step=5"]
    first = user_run([*REGRESSION, *stop], run, PYTHONPATH=f"{PROJECT}:{HELPERS}")
    assert first.returncode == 128 + signal.SIGTERM, first.stderr[-2000:]
    taken = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    assert 0 < taken < 16
    ok(user_run(REGRESSION, run))  # the same command: continues from its own checkpoint
    # Its loader keeps no position inside an epoch: the stopped epoch starts over, whole; its steps stay taken.
    found = results(run)
    assert found["global_step"] == 3 * 16 + taken and found["epochs"] == 3, found
    assert "start of the epoch" in found["resumed_at"]
    ok(user_run([*REGRESSION, "trainer.max_epochs=4"], run))
    assert results(run)["global_step"] == 4 * 16 + taken
    # Another architecture is refused, naming the key; a new learning rate (no schedule) is applied.
    line = one_line(user_run([*REGRESSION, "trainer.max_epochs=5", "model.hidden=64"], run))
    assert "model.hidden differs" in line and "(32, now 64)" in line and "init_from=" in line
    applied = ok(user_run([*REGRESSION, "trainer.max_epochs=5", "optim.lr=0.003"], run))
    assert "learning rate 0.001 -> 0.003: applied to the restored optimizer" in applied.stderr + applied.stdout
    steps = [int(r["step"]) for r in csv_rows(run) if "val/mse" in r]
    assert steps == sorted(set(steps)) and len(steps) == 5  # one validation per epoch, each once


@pytest.mark.slow
def test_a_user_loader_stopped_after_the_first_batch_of_an_epoch_starts_that_epoch_over_and_says_so(tmp_path):
    # 16 steps an epoch: a step budget of 17 stops one batch into the second epoch.
    run = tmp_path / "run"
    ok(user_run([*REGRESSION, "trainer.max_steps=17"], run))
    assert results(run)["global_step"] == 17
    ok(user_run(REGRESSION, run))
    found = results(run)
    assert found["global_step"] == 3 * 16 + 1 and "start of the epoch" in found["resumed_at"], found


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["model.lr=0.1", "optim.lr=0.2"], "optim.lr=0.2 is given, but model.lr in its own config decides its lr"),
        (["+model.width=3"], "model.width is not an argument of Regressor (it takes dropout, hidden, in_features, lr)"),
        (["optim=sgd"], "optim=sgd is given, but Regressor takes no optimizer argument"),
        (["model=template", "optim.lr=0.1"], "optim.lr=0.1 is given, but TemplateModule takes no lr argument"),
        (["model._target_=torch.nn.Linear"], "is a torch nn.Module, not a LightningModule"),
        (["model._target_=my_tasks.nowhere.Module"], "model._target_=my_tasks.nowhere.Module cannot be imported"),
        (
            ["objective.metric=val/mae"],
            "objective.metric=val/mae is not logged in validation by Regressor; it logs val/mse there",
        ),
        (  # what training logs is no objective: the best checkpoint and a sweep choose by validation
            ["objective.metric=train/mse", "objective.direction=min"],
            "objective.metric=train/mse is not logged in validation by Regressor (it is logged in training); it "
            "logs val/mse there",
        ),
        (["+data.shuffle=true"], "data.shuffle is not an argument of RegressionData"),
        (["model.hidden=-3"], "my_tasks.regression.Regressor could not be built from its config: RuntimeError: "),
        (["+model.in_features=7"], "model.in_features=7 differs from the in_features the data states (4)"),
    ],
)
def test_what_a_user_module_cannot_take_is_one_line(tmp_path, args, said):
    result = user_run([*REGRESSION, *args], tmp_path / "run")
    line = one_line(result)
    assert said in line, line
    assert "Error getting" not in result.stderr  # Hydra's own account of a path it cannot import: ours is the line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("swept", ["model.hidden=8,abc", "data.noise=0.1,loud", "model.hidden=8,1.5"])
def test_a_sweep_checks_the_values_it_gives_a_user_module_before_its_first_job(tmp_path, swept):
    sweep = tmp_path / "sweep"
    result = run_cli(["-m", *REGRESSION, swept, f"hydra.sweep.dir={sweep}"], tmp_path, cwd=PROJECT,
                     PYTHONPATH=str(PROJECT))  # fmt: skip
    line = one_line(result)
    key, value = swept.split("=")[0], swept.split(",")[-1]
    assert line.startswith("error: sweep job 1 (") and f"{key}={value} is not " in line, line
    assert not sweep.exists()  # no job ran


def test_a_module_named_on_the_command_line_leaves_out_the_options_classifier_arguments(tmp_path):
    """`model._target_=...` over the default model option: its classifier arguments (net, _recursive_) are
    not the new module's; one the command line gives is still checked against its constructor."""
    named = ["model._target_=my_tasks.regression.Regressor", *(a for a in REGRESSION if not a.startswith("model="))]
    run = tmp_path / "run"
    ok(user_run(named, run))
    assert results(run)["objective"]["value"] is not None
    # The run's record holds what was built: no classifier arguments under the regressor.
    recorded = yaml.safe_load((run / "config.yaml").read_text())["model"]
    assert recorded["_target_"] == "my_tasks.regression.Regressor" and not {"net", "_recursive_"} & set(recorded)
    line = one_line(user_run([*named, "model.label_smoothing=0.1"], tmp_path / "other"))
    assert "model.label_smoothing is not an argument of Regressor" in line and not (tmp_path / "other").exists()


@pytest.mark.slow
def test_values_a_module_logs_without_sync_dist_are_those_of_the_whole_data_on_two_processes(tmp_path):
    """`self.log("val/mse", ...)` and `self.log("test/mse", ...)` without sync_dist, as Lightning's docs write them:
    on 2 processes the objective and the test result are those of every rank's samples, as one process measures
    them with the same weights (Lightning alone keeps rank 0's half)."""
    two, one = tmp_path / "two", tmp_path / "one"
    ok(user_run([*REGRESSION, "trainer.max_epochs=2", "hardware.devices=2", "strategy=ddp"], two))
    found = results(two)
    best = found["best_checkpoint"]
    ok(user_run([*REGRESSION, "mode=eval", f"ckpt_path={best}"], one))
    assert found["test"]["test/mse"] == pytest.approx(results(one)["test"]["test/mse"], rel=1e-5)
    # The objective is the best validation value over both halves, as the csv records it.
    validated = [float(r["val/mse"]) for r in csv_rows(two) if "val/mse" in r]
    assert found["objective"]["value"] == pytest.approx(min(validated))


@pytest.mark.slow
def test_values_a_module_logs_at_an_epochs_end_are_those_of_the_whole_data_on_two_processes(tmp_path):
    """The mean of the steps' errors logged in `on_validation_epoch_end` and `on_test_epoch_end` without sync_dist,
    as Lightning's docs write it: on 2 processes the objective and the test result are those of every rank's samples,
    as one process measures them with the same weights; a value rank 0 alone logs there is its own (no rank waits
    for a reduction the others never make)."""
    two, one = tmp_path / "two", tmp_path / "one"
    module = "model._target_=my_tasks.regression.EpochEndRegressor"
    ok(user_run([*REGRESSION, module, "trainer.max_epochs=2", "hardware.devices=2", "strategy=ddp"], two))
    found = results(two)
    ok(user_run([*REGRESSION, module, "mode=eval", f"ckpt_path={found['best_checkpoint']}"], one))
    assert found["test"]["test/mse"] == pytest.approx(results(one)["test"]["test/mse"], rel=1e-5)
    rows = csv_rows(two)
    validated = [float(r["val/mse"]) for r in rows if r.get("val/mse")]
    assert len(validated) == 2 and found["objective"]["value"] == pytest.approx(min(validated))
    # 64 validation points: rank 0 holds half of them.
    assert {float(r["val/rank0_samples"]) for r in rows if r.get("val/rank0_samples")} == {32.0}


def test_an_objective_of_one_of_several_validation_loaders_is_taken_by_its_name(tmp_path):
    """Two validation loaders: Lightning logs `val/mse/dataloader_idx_0` and `.._1`; either is an objective (it was
    refused as "logged in training"), and the plain name is refused naming them."""
    run = tmp_path / "run"
    two = ["model._target_=my_tasks.regression.TwoSetRegressor", "data._target_=my_tasks.regression.TwoValidationSets"]
    metric = "val/mse/dataloader_idx_1"
    ok(user_run([*REGRESSION, *two, "trainer.max_epochs=2", f"objective.metric={metric}"], run))
    validated = [float(r[metric]) for r in csv_rows(run) if r.get(metric)]
    assert len(validated) == 2 and results(run)["objective"]["value"] == pytest.approx(min(validated))
    line = one_line(user_run([*REGRESSION, *two, "trainer.max_epochs=1"], tmp_path / "plain"))
    assert "objective.metric=val/mse is not logged in validation by TwoSetRegressor; it logs " in line, line
    assert "val/mse/dataloader_idx_0, val/mse/dataloader_idx_1 there" in line and "in training" not in line


def test_how_a_module_runs_is_the_evaluating_runs_choice_even_where_its_training_kept_the_default(tmp_path):
    """An argument of the module's `how_it_runs` the training run left at its default, set for `mode=eval`: the
    evaluation runs with it (it was dropped: the checkpoint's config did not list it)."""
    run = tmp_path / "run"
    module = "model._target_=my_tasks.regression.CountingRegressor"
    ok(user_run([*REGRESSION, module, "trainer.max_epochs=1"], run))
    assert "test/samples" not in results(run)["test"]
    checkpoint = f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}"
    ok(user_run([*REGRESSION, module, "mode=eval", checkpoint, "+model.count_samples=true"], tmp_path / "eval"))
    assert results(tmp_path / "eval")["test"]["test/samples"] == 64


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_a_module_trained_by_manual_optimization_is_validated_as_its_checkpoint_holds_it(
    tmp_path, strategy, monkeypatch
):
    """BatchNorm's running statistics, on 2 processes, under manual optimization: each rank's batches left its own,
    and rank 1 scored its half with statistics no checkpoint holds. The objective is the saved model's score."""
    monkeypatch.syspath_prepend(str(PROJECT))
    from my_tasks.normed import ManualNormedRegressor
    from my_tasks.regression import RegressionData

    run = tmp_path / "run"
    module = "model._target_=my_tasks.normed.ManualNormedRegressor"
    ok(user_run([*REGRESSION, module, "trainer.max_epochs=2", "hardware.devices=2", f"strategy={strategy}"], run))
    found = results(run)
    data = RegressionData()
    data.setup("validate")
    saved = ManualNormedRegressor.load_from_checkpoint(found["best_checkpoint"], map_location="cpu").eval()
    points = data.parts["val"]
    with torch.no_grad():
        measured = torch.nn.functional.mse_loss(saved(points.x), points.y).item()
    assert found["objective"]["value"] == pytest.approx(measured, rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "at", "saving"),
    [("SIGTERM", 3, []), ("SIGKILL", 4, ["callbacks.last_checkpoint.every_n_steps=3"])],
    ids=["stopped", "killed"],
)
def test_what_a_module_does_in_its_own_on_train_batch_end_is_in_the_checkpoint_it_continues_from(
    tiny_data, tmp_path, signum, at, saving
):
    """An EMA of the weights updated in the module's `on_train_batch_end`: the checkpoint was saved in a callback's
    hook, which Lightning calls before the module's, so it held the weights after step 3 and the EMA after step 2;
    continued, step 3's update was never made. Stopped after step 3 (SIGTERM), or killed after the periodic save at
    step 3, and continued, the run ends as an uninterrupted one, bit for bit."""
    args = [*TINY, "model._target_=my_tasks.flat_images.AveragedFlatImages", "trainer.precision=64-true",
            "trainer.limit_train_batches=null", "trainer.max_steps=6", "objective.metric=val_acc", *saving]  # fmt: skip
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    ok(user_run(args, whole, tiny_data))
    signal_at = ["+callbacks.zz_signal._target_=signal_at.SignalAt", f"+callbacks.zz_signal.step={at}",
                 f"+callbacks.zz_signal.signum={signum}"]  # fmt: skip
    first = user_run([*args, *signal_at], stopped, tiny_data, PYTHONPATH=f"{PROJECT}:{HELPERS}")
    assert first.returncode in (128 + signal.Signals[signum], -signal.Signals[signum]), first.stderr[-2000:]
    assert torch.load(stopped / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 3
    ok(user_run(args, stopped, tiny_data))
    ends = [torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"] for run in (whole, stopped)]
    assert ends[0]["ema"].abs().sum() > 0
    assert all(torch.equal(ends[0][k], ends[1][k]) for k in ends[0]), {
        k: float((ends[0][k] - ends[1][k]).abs().max()) for k in ends[0]
    }


@pytest.mark.parametrize(("precision", "dtype"), [("64-true", "float64"), ("bf16-true", "bfloat16")])
def test_a_module_that_takes_images_as_they_come_gets_them_in_its_precision(tiny_data, tmp_path, precision, dtype):
    """The built-in image data normalizes its uint8 images after Lightning converted the batch for the precision:
    a module that does not cast its input (as Lightning's examples do not) gets them in its own dtype."""
    run = tmp_path / "run"
    args = [*TINY, "model._target_=my_tasks.flat_images.FlatImages", f"trainer.precision={precision}",
            "objective.metric=val_acc", "trainer.max_steps=4"]  # fmt: skip
    ok(user_run(args, run, tiny_data))
    weights = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert str(weights["layer.weight"].dtype) == f"torch.{dtype}" and results(run)["objective"]["value"] is not None


@pytest.mark.parametrize("data", ["my_tasks.regression.TrainAndValOnly", "my_tasks.regression.PointsWithoutTest"])
def test_data_without_a_test_set_trains_and_says_there_are_no_test_metrics(tmp_path, data):
    run = tmp_path / "run"
    result = ok(user_run([*REGRESSION, f"data._target_={data}", "~data.n"], run))
    assert result.stdout.splitlines()[-1].startswith("no test metrics (no test step in the module, or no test data)")
    found = results(run)
    assert found["objective"]["metric"] == "val/mse" and found["objective"]["value"] is not None
    assert found["test"] == {} and "Traceback" not in result.stderr


def test_a_module_without_validation_keeps_its_last_checkpoint_and_has_no_objective(tmp_path):
    run = tmp_path / "run"
    result = ok(user_run(["model=novalidation", "data=points", "hardware=cpu", "trainer.max_steps=6"], run))
    found = results(run)
    assert found["objective"]["value"] is None and found["best_checkpoint"] == str(run / "checkpoints" / "last.ckpt")
    assert "no validation step" in result.stderr + result.stdout
    assert result.stdout.splitlines()[-1].startswith(
        "no test metrics (no test step in the module, or no test data); no"
    )
    search = user_run(["-m", "model=novalidation", "data=points", "hparams_search=optuna",
                       f"hydra.sweep.dir={tmp_path / 'search'}"], tmp_path)  # fmt: skip
    assert "a search tunes val/acc" in one_line(search) and not (tmp_path / "search").exists()


@pytest.mark.slow
def test_a_lightning_hydra_template_module_gets_its_network_and_optimizer_built_by_hydra(tiny_data, tmp_path):
    run = tmp_path / "run"
    args = ["model=template", "hardware=cpu", "data.val_size=100", "batch.global_size=32", "trainer.max_steps=4"]
    ok(user_run(args, run, tiny_data))
    # Hydra built the network and a partial optimizer; the checkpoint holds their configs, readable without code.
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["hyper_parameters"]["optimizer"] == {"_target_": "torch.optim.Adam", "_partial_": True, "lr": 0.001}
    ok(user_run([*args[:-1], "trainer.max_steps=8"], run, tiny_data))
    assert results(run)["global_step"] == 8
    line = one_line(user_run([*args, "optim=sgd"], tmp_path / "other", tiny_data))
    assert "model.optimizer in its own config decides its optimizer" in line


def test_the_built_in_classifier_refuses_batches_it_cannot_train_on_and_leaves_no_run_dir(tmp_path):
    line = one_line(user_run(["data=points", "hardware=cpu", "model=mlp", "trainer.max_steps=2"], tmp_path / "run"))
    assert "the built-in classifier trains on batches (inputs, labels)" in line and "dicts with keys x, y" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_user_module_on_two_processes_sweeps_and_searches_its_own_metric(tmp_path):
    run = tmp_path / "ddp"
    ok(user_run([*REGRESSION, "hardware.devices=2", "trainer.max_epochs=2"], run))
    assert [json.loads((run / "ranks" / f"rank{r}.json").read_text())["world_size"] for r in (0, 1)] == [2, 2]
    sweep = tmp_path / "sweep"
    ok(user_run(["-m", *REGRESSION, "trainer.max_epochs=2", "model.hidden=8,32", f"hydra.sweep.dir={sweep}"], tmp_path))
    from hydralight.reports.sweep import write_report

    summary = write_report(sweep)
    assert summary["finished"] == 2 and "best val/mse" in (sweep / "report.md").read_text()
    best = [float(r[3]) for r in summary["rows"]]
    assert best == sorted(best)  # lowest first: the objective's direction
    search = tmp_path / "search"
    # The preset's space: optim.lr (the module takes lr) and batch.global_size (the plan's).
    fixed = [a for a in REGRESSION if not a.startswith("batch.global_size=")]
    result = user_run(["-m", *fixed, "trainer.max_epochs=2", "hparams_search=optuna", "hydra.sweeper.n_trials=3",
                       "hydra.sweeper.n_jobs=1", f"hydra.sweep.dir={search}"], tmp_path)  # fmt: skip
    ok(result)
    found = json.loads((search / "search.json").read_text())
    assert found["objective"] == {"metric": "val/mse", "direction": "min"}
    done = [t for t in found["trials"] if t["state"] == "COMPLETE"]
    assert len(done) == 3 and found["best"]["value"] == min(t["value"] for t in done)
    assert yaml.safe_load((search / "best.yaml").read_text())["test"]["test/mse"] is not None


@pytest.mark.slow
def test_the_language_model_example_learns_a_text(tmp_path):
    text = tmp_path / "text.txt"
    words = [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "the",
        "lazy",
        "dog",
        "while",
        "a",
        "model",
        "learns",
        "to",
        "spell",
    ]
    text.write_text("\n".join(" ".join(words[(i * 7 + j) % len(words)] for j in range(10)) for i in range(400)))
    run = tmp_path / "run"
    result = ok(run_cli(["experiment=charlm", f"data.path={text}", "hardware=cpu", "trainer.max_epochs=2",
                         "model.width=64", "model.layers=1", "data.block_size=32"], run))  # fmt: skip
    assert result.stdout.splitlines()[-1].startswith("test/loss=")
    losses = [float(r["val/loss"]) for r in csv_rows(run) if "val/loss" in r]
    vocab = len(set(text.read_text()))
    assert losses[-1] < losses[0] < torch.log(torch.tensor(float(vocab))).item()  # better than uniform, and learning
    assert results(run)["objective"]["direction"] == "min"
    assert "data.path=" in one_line(run_cli(["experiment=charlm", "hardware=cpu"], tmp_path / "nopath"))


@pytest.mark.slow
def test_timm_networks_train_for_the_built_in_classifier(tiny_data, tmp_path):
    pytest.importorskip("timm", reason="timm is an optional extra: pip install 'hydralight[timm]'")
    run = tmp_path / "run"
    ok(run_cli([*TINY, "model=timm", "model.net.name=resnet18", "trainer.limit_train_batches=2"], run, tiny_data))
    assert results(run)["test/acc"] is not None


LIGHTNING = ["model=lit", "hardware=cpu", "objective.metric=val/mse", "objective.direction=min", "batch.global_size=32",
             "trainer.max_steps=20", "+callbacks.count._target_=my_tasks.lightning_namespace.StepCounter"]  # fmt: skip


@pytest.mark.parametrize(
    "extra",
    [
        ["data=lit_points"],  # all of it written against `lightning`
        pytest.param(["data=points", "hardware.devices=2", "strategy=ddp"], marks=pytest.mark.slow),  # mixed, 2 ranks
    ],
)
def test_modules_data_and_callbacks_of_the_lightning_namespace_train_unchanged(extra, tmp_path):
    run = tmp_path / "run"
    ok(user_run([*LIGHTNING, *extra], run))
    assert results(run)["global_step"] == 20 and results(run)["test"]["test/mse"] > 0
    assert json.loads((run / "steps.json").read_text()) == {"steps": 20, "module_is_lightning": True}


def test_a_module_of_a_lightning_package_imported_before_hydralight_is_one_line(tmp_path, monkeypatch):
    import sys
    import types

    from torch import nn

    from hydralight.errors import UserError
    from hydralight.training.modules import module_class

    # What `lightning.pytorch.LightningModule` is when the real package was imported first: another class.
    base = type("LightningModule", (nn.Module,), {"__module__": "lightning.pytorch.core.module"})
    mine = types.ModuleType("their_tasks")
    mine.Lit = type("Lit", (base,), {"__module__": "their_tasks"})
    monkeypatch.setitem(sys.modules, "their_tasks", mine)
    with pytest.raises(UserError, match=r"is a LightningModule of the `lightning` package.*import hydralight first"):
        module_class({"_target_": "their_tasks.Lit"})


@pytest.mark.parametrize(
    ("args", "lr", "plan_says"),
    [
        ([], 0.01, "lr 0.01 (the module's own)"),  # LitRegressor's default: not replaced by optim.lr's 1e-3
        (["optim.lr=0.05"], 0.05, "lr 0.05;"),  # chosen on the command line (a sweep's or a search's value too)
        (["model.lr=0.07"], 0.07, "lr 0.07 (the module's own)"),  # any constructor argument, no + needed
    ],
)
def test_a_module_s_own_learning_rate_stands_unless_this_run_sets_one(tmp_path, args, lr, plan_says):
    run = tmp_path / "run"
    result = ok(user_run([*LIGHTNING[:-1], "data=lit_points", "trainer.max_steps=2", *args], run))
    assert plan_says in result.stdout.splitlines()[0], result.stdout
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["hyper_parameters"]["lr"] == lr


def test_the_built_in_classifier_s_learning_rate_is_optim_lr_only(tmp_path):
    line = one_line(run_cli(["+model.lr=0.1"], tmp_path / "run"))
    assert "model.lr is set by the plan; set optim.lr instead" in line


def test_the_batchnorm_advice_for_a_user_module_is_said_once_with_a_key_it_takes(tmp_path):
    normed = [*REGRESSION, "model._target_=my_tasks.normed.NormedRegressor", "trainer.max_epochs=1"]
    ok(user_run(normed, tmp_path / "plain"))
    reasons = results(tmp_path / "plain")["world_size_invariance"]["reasons"]
    said = [r for r in reasons if "BatchNorm" in r]
    # Its config has no sync_batchnorm key (model.sync_batchnorm=true would not be one): the advice adds it.
    advice = "add sync_batchnorm: true to the model's config, or ++model.sync_batchnorm=true on the command line"
    assert said == [f"2 BatchNorm layers (net.1, net.4) normalize each process's micro-batch; {advice}"], reasons
    # What it names is taken, and settles the BatchNorm.
    ok(user_run([*normed, "++model.sync_batchnorm=true"], tmp_path / "synced"))
    assert not [r for r in results(tmp_path / "synced")["world_size_invariance"]["reasons"] if "BatchNorm" in r]


@pytest.mark.slow
def test_a_search_tunes_a_module_without_an_lr_argument_on_its_own_keys(tiny_data, tmp_path):
    search = tmp_path / "search"
    # TemplateModule takes no lr: the preset's optim.lr is left out, its own optimizer's lr is searched.
    result = ok(user_run(["-m", "model=template", "data.val_size=100", "hardware=cpu", "batch.global_size=32",
                          "trainer.max_steps=4", "hparams_search=optuna", "hydra.sweeper.n_trials=2",
                          "hydra.sweeper.n_jobs=1", "model.optimizer.lr=tag(log, interval(1e-3, 1e-1))",
                          f"hydra.sweep.dir={search}"], tmp_path, tiny_data))  # fmt: skip
    found = json.loads((search / "search.json").read_text())
    done = [t for t in found["trials"] if t["state"] == "COMPLETE"]
    searched = {"model.optimizer.lr"}
    assert len(done) == 2 and all(set(t["params"]) == searched for t in done), found["trials"]
    assert "the search leaves the preset's optim.lr out" in result.stdout + result.stderr


@pytest.mark.slow
def test_a_checkpoint_of_your_module_is_evaluated_and_predicted_with_or_without_its_option(tmp_path):
    run = tmp_path / "run"
    common = [*LIGHTNING[:-1], "data=lit_points"]
    ok(user_run([*common, "trainer.max_steps=4", "model.hidden=4"], run))
    ckpt = f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}"
    plain = [a for a in common if not a.startswith("model=")]
    for i, args in enumerate([[], ["model=lit"], ["model._target_=my_tasks.lightning_namespace.LitRegressor"]]):
        done = ok(user_run([*plain, *args, "mode=eval", ckpt], tmp_path / f"eval{i}"))
        assert done.stdout.splitlines()[-1].startswith("test/mse="), (args, done.stdout[-500:])
    line = one_line(user_run([*plain, "model=lit", "model.hidden=8", "mode=eval", ckpt], tmp_path / "other"))
    assert "model.hidden differs: model.hidden=8" in line, line


def test_a_subclass_of_the_built_in_classifier_trains_with_its_optimizer_and_schedule(tiny_data, tmp_path):
    # Named by model._target_, it is built as a user's module is (recursively): its optimizer and schedule
    # arrive built, not as configs.
    (tmp_path / "sub.py").write_text(
        "from hydralight.tasks.classifier import Classifier\n\n\nclass Sub(Classifier):\n    pass\n"
    )
    args = [*TINY, "model._target_=sub.Sub", "optim=sgd"]
    result = run_cli(args, tmp_path / "run", tiny_data, cwd=tmp_path, PYTHONPATH=str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Sub(MLP)" in result.stdout


OWN_RATE = """
import pytorch_lightning as pl
import torch


class OwnRate(pl.LightningModule):
    def __init__(self, lr: float = 0.007):
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(784, 10)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
"""


def test_a_module_s_own_learning_rate_is_the_one_recorded_and_a_scaling_rule_alone_is_refused(tmp_path):
    (tmp_path / "own_rate.py").write_text(OWN_RATE)
    env = {"cwd": tmp_path, "PYTHONPATH": str(tmp_path)}
    base = ["hardware=cpu", "model._target_=own_rate.OwnRate", "batch.global_size=256", "plan=true"]
    planned = run_cli(base, tmp_path / "run", **env)
    assert planned.returncode == 0 and "0.007 (the module's own)" in planned.stdout, planned.stderr[-2000:]
    # A rule alone would scale optim.lr's default over the module's own rate.
    line = one_line(run_cli([*base, "optim.lr_scaling=linear"], tmp_path / "run", **env))
    assert "but OwnRate has a learning rate of its own (0.007)" in line
    assert "give the rate to scale: optim.lr=0.007 optim.lr_scaling=linear" in line
    scaled = run_cli([*base, "optim.lr=0.007", "optim.lr_scaling=linear"], tmp_path / "run", **env)
    assert scaled.returncode == 0 and re.search(r"│ lr +│ 0\.014 +│", scaled.stdout), scaled.stdout[-3000:]


BUILDS_ITS_OPTIMIZER = """
import pytorch_lightning as pl
import torch


class BuildsItsOptimizer(pl.LightningModule):
    def __init__(self, optimizer, scheduler=None):
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.layer = torch.nn.Linear(784, 10)

    def configure_optimizers(self):
        return self.hparams.optimizer(params=self.parameters())
"""


def test_a_module_that_builds_the_plan_s_optimizer_gets_the_plan_s_rate_in_it(tmp_path):
    # lightning-hydra-template's way: `optimizer` is a partial the module calls; it takes no lr of its own.
    (tmp_path / "builds.py").write_text(BUILDS_ITS_OPTIMIZER)
    env = {"cwd": tmp_path, "PYTHONPATH": str(tmp_path)}
    base = ["hardware=cpu", "model._target_=builds.BuildsItsOptimizer", "optim=sgd", "plan=true"]
    # optim=sgd's cosine schedule needs the run's length, which the module is not given: one line, not a traceback.
    line = one_line(run_cli(base, tmp_path / "run", **env))
    assert "optim.scheduler (CosineAnnealingLR) needs T_max" in line and "optim.scheduler=null" in line
    assert "give +optim.scheduler.T_max=..." in line  # the key as it can be given: the preset has none
    for extra, rate in (([], "0.05"), (["optim.lr=0.2"], "0.2")):  # sgd's rate, or the one given: not torch's
        planned = run_cli([*base, "optim.scheduler=null", *extra], tmp_path / "run", **env)
        assert planned.returncode == 0, planned.stderr[-2000:]
        assert re.search(rf"│ lr +│ {rate} +│", planned.stdout), planned.stdout[-3000:]


def test_the_rate_inside_the_plan_s_optimizer_is_the_one_it_trains_with(tiny_data, tmp_path):
    (tmp_path / "builds.py").write_text(BUILDS_TRAINS)
    args = [*TINY, "model._target_=builds.BuildsItsOptimizer", "optim=sgd", "optim.scheduler=null"]
    result = run_cli(args, tmp_path / "run", tiny_data, cwd=tmp_path, PYTHONPATH=str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((tmp_path / "run" / "ranks" / "rank0.json").read_text())["lr"] == 0.05 * 32 / 128


BUILDS_TRAINS = """
import pytorch_lightning as pl
import torch


class BuildsItsOptimizer(pl.LightningModule):
    def __init__(self, optimizer, scheduler=None):
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/acc", (self.net(x).argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return self.hparams.optimizer(params=self.parameters())
"""


STEP_AND_EPOCH = """\
import torch.nn.functional as F
from my_tasks.regression import Regressor


class StepAndEpoch(Regressor):  # as Lightning's docs show on_step and on_epoch together
    def validation_step(self, batch, batch_idx):
        self.log("val/mse", F.mse_loss(self(batch["x"]), batch["y"]), on_step=True, on_epoch=True)

    def test_step(self, batch, batch_idx):
        self.log("test/mse", F.mse_loss(self(batch["x"]), batch["y"]), on_step=True, on_epoch=True)
"""


@pytest.mark.slow
def test_values_logged_per_step_and_per_epoch_are_those_of_the_whole_data_on_two_processes(tmp_path):
    """`on_step=True, on_epoch=True` without sync_dist: the epoch's value (the objective, the best checkpoint, the
    test result) was rank 0's half of the data on 2 processes."""
    (tmp_path / "stepwise.py").write_text(STEP_AND_EPOCH)
    args = [*REGRESSION, "model._target_=stepwise.StepAndEpoch"]
    env = {"PYTHONPATH": f"{PROJECT}{os.pathsep}{tmp_path}"}
    two, one = tmp_path / "two", tmp_path / "one"
    ok(user_run([*args, "trainer.max_epochs=2", "hardware.devices=2", "strategy=ddp"], two, **env))
    found = results(two)
    ok(user_run([*args, "mode=eval", f"ckpt_path={found['best_checkpoint']}"], one, **env))
    assert found["test"]["test/mse_epoch"] == pytest.approx(results(one)["test"]["test/mse_epoch"], rel=1e-5)
    validated = [float(r["val/mse_epoch"]) for r in csv_rows(two) if r.get("val/mse_epoch")]
    assert found["objective"]["value"] == pytest.approx(min(validated))
