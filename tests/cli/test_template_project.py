"""A lightning-hydra-template project run unchanged (tests/helpers/template_project: its module, data module and
configs in the template's shape, `${paths.data_dir}` included) through `train.py`."""

import json

import pytest
from conftest import HELPERS, run_cli

PROJECT = HELPERS / "template_project"
# Tiny MNIST: 600 training and 200 test images, split as the template splits the two together.
ARGS = ["model=tpl_mnist", "data=tpl_mnist", "data.train_val_test_split=[600,100,100]", "hardware=cpu"]


@pytest.mark.slow
def test_a_template_project_trains_unchanged_with_the_plan_s_batch(tiny_data, tmp_path):
    run = tmp_path / "run"
    result = run_cli([*ARGS, "batch.global_size=32", "trainer.max_steps=10"], run, tiny_data, cwd=PROJECT,
                     PYTHONPATH=str(PROJECT))  # fmt: skip
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
    out = result.stdout + result.stderr
    # Its data config's batch is the plan's (per device), said once; its own copy of `data=mnist` is hidden.
    assert (
        out.count("note: data.batch_size=128 in the data config is replaced by the plan's per-device batch of 32") == 1
    )
    assert out.count("note: conf/data/mnist.yaml is not used: the shipped option data=mnist comes first") == 1
    results = json.loads((run / "results.json").read_text())
    assert results["global_step"] == 10 and results["test/acc"] is not None
    assert results["objective"]["metric"] == "val/acc" and results["objective"]["value"] is not None
    # `${paths.data_dir}` resolved to the data folder DATA_DIR names.
    config = (run / "config.yaml").read_text()
    assert f"data_dir: {tiny_data}" in config and "${" not in config


def test_the_template_s_paths_keys_resolve(tmp_path):
    from conftest import compose_config

    cfg = compose_config("paths.data_dir=/datasets", run_dir=tmp_path)
    assert cfg.paths.data_dir == "/datasets" and cfg.data.data_dir == "/datasets"
    assert cfg.paths.log_dir == cfg.paths.output_dir == str(tmp_path)
    assert cfg.paths.work_dir == cfg.paths.root_dir


@pytest.mark.slow
def test_a_template_experiment_with_tags_task_name_and_extras_runs(tiny_data, tmp_path):
    run = tmp_path / "run"
    (tmp_path / "work").mkdir()
    result = run_cli(["experiment=digits", "hardware=cpu", "trainer.max_steps=3"], run, tiny_data, cwd=PROJECT,
                     PYTHONPATH=str(PROJECT))  # fmt: skip
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["tags"] == ["digits", "dense"] and manifest["status"] == "finished"
    assert "config:\n" in result.stdout and "task_name: train" in result.stdout  # extras.print_config
    refused = run_cli(["experiment=digits", "hardware=cpu", "tags=[]", "extras.enforce_tags=true"], tmp_path / "r",
                      tiny_data, cwd=PROJECT, PYTHONPATH=str(PROJECT))  # fmt: skip
    assert "extras.enforce_tags=true and the run has no tags" in refused.stderr and refused.returncode == 2


@pytest.mark.slow
def test_glob_sweeps_over_the_options_of_the_project_s_own_conf(tiny_data, tmp_path):
    sweep = tmp_path / "sweep"
    result = run_cli(["-m", "experiment=glob(digits*)", "hardware=cpu", "plan=true", f"hydra.sweep.dir={sweep}"],
                     tmp_path, tiny_data, cwd=PROJECT, PYTHONPATH=str(PROJECT))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Launching 2 jobs" in result.stdout + result.stderr
    assert "experiment=digits_wide" in result.stdout + result.stderr
    nothing = run_cli(["-m", "experiment=glob(none_such*)", "hardware=cpu", f"hydra.sweep.dir={sweep}2"], tmp_path,
                      tiny_data, cwd=PROJECT, PYTHONPATH=str(PROJECT))  # fmt: skip
    assert nothing.returncode == 2 and "the sweep has no jobs: experiment=glob(none_such*) matches no option" in (
        nothing.stderr
    )


@pytest.mark.slow
def test_the_template_s_habits_many_loggers_debug_presets_and_a_dotenv_file(tiny_data, tmp_path):
    (tmp_path / ".env").write_text(f"# the folder's own settings\nDATA_DIR={tiny_data}\nWANDB_MODE=offline\n")
    base = ["model=mlp", "data.val_size=100", "batch.global_size=32", "hardware=cpu"]
    run = tmp_path / "loggers"
    result = run_cli([*base, "logger=many_loggers", "trainer.max_steps=2"], run, cwd=tmp_path)  # DATA_DIR from .env
    assert result.returncode == 0, result.stderr[-3000:]
    assert (run / "tensorboard").is_dir() and list((run / "wandb").glob("offline-run-*"))
    assert (run / "mlflow" / "mlflow.db").is_file()  # no MLflow server: the run dir's own store
    assert (run / "csv" / "metrics.csv").is_file()
    limited = tmp_path / "limit"
    result = run_cli([*base, "debug=limit"], limited, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((limited / "results.json").read_text())["global_step"] == 15  # 3 epochs of 5 batches


@pytest.mark.slow
def test_a_template_module_trains_on_the_built_in_data_and_its_checkpoint_is_evaluated_without_model(
    tiny_data, tmp_path
):
    """The template's module unpacks `x, y = batch`: the built-in data gives it (x, y), its sample ids only to a
    module that takes them; its checkpoint is tested as README says, with no model= option."""
    run = tmp_path / "run"
    args = ["model=tpl_mnist", "hardware=cpu", "data.val_size=100", "batch.global_size=32", "trainer.max_steps=4"]
    trained = run_cli(args, run, tiny_data, cwd=PROJECT, PYTHONPATH=str(PROJECT))
    assert trained.returncode == 0, (trained.stdout[-2000:], trained.stderr[-3000:])
    results = json.loads((run / "results.json").read_text())
    tested = results["test"]["test/acc"]
    evaluated = run_cli(["mode=eval", f"ckpt_path={results['best_checkpoint']}", "hardware=cpu",
                         "data.val_size=100"], tmp_path / "eval", tiny_data, cwd=PROJECT, PYTHONPATH=str(PROJECT))  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    again = json.loads((tmp_path / "eval" / "results.json").read_text())["test"]["test/acc"]
    assert again == pytest.approx(tested)  # the same weights on the same test split


@pytest.mark.slow
def test_a_template_search_preset_is_refused_naming_this_project_s_keys_and_runs_once_renamed(tiny_data, tmp_path):
    """The template's preset (hydra-optuna-sweeper's keys, `optimized_metric`) is one line naming the keys to
    use instead; renamed, it runs as a search without -m (it sets multirun itself), as the shipped preset does."""
    sweep = tmp_path / "sweep"
    tiny = [*ARGS, "batch.global_size=32", "trainer.max_steps=2", f"hydra.sweep.dir={sweep}"]
    as_written = run_cli(["hparams_search=mnist_optuna", *tiny], tmp_path, tiny_data, cwd=PROJECT,
                         PYTHONPATH=str(PROJECT))  # fmt: skip
    assert as_written.returncode == 2 and "Traceback" not in as_written.stderr
    assert "optimized_metric is lightning-hydra-template's key; this project takes objective.metric" in (
        as_written.stderr
    )
    for habit, instead in [
        ("hydra.sweeper.sampler.n_startup_trials=5", "this project takes hydra.sweeper.n_startup_trials"),
        ("hydra.sweeper.direction=maximize", "this project takes objective.direction"),
    ]:
        refused = run_cli(["-m", "hparams_search=optuna", habit, *tiny], tmp_path, tiny_data)
        assert refused.returncode == 2 and instead in refused.stderr, refused.stderr[-2000:]
    renamed = run_cli(["hparams_search=mnist_optuna_here", *tiny], tmp_path, tiny_data, cwd=PROJECT,
                      PYTHONPATH=str(PROJECT))  # fmt: skip
    assert renamed.returncode == 0, renamed.stderr[-3000:]
    assert "2 of 2 trials done" in renamed.stdout + renamed.stderr
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1"]


@pytest.mark.parametrize(
    ("typo", "said"),
    [
        ("+model.optimizer.lrr=0.1", "model.optimizer.lrr is not an argument of Adam (it takes amsgrad, betas"),
        ("+model.scheduler.patiense=3", "model.scheduler.patiense is not an argument of ReduceLROnPlateau"),
    ],
)
def test_a_misspelt_argument_of_the_template_s_optimizer_or_scheduler_is_one_line(typo, said, tmp_path):
    # Partial configs the module calls itself in configure_optimizers: a traceback from its own code before.
    from conftest import one_line

    line = one_line(run_cli([*ARGS, typo, "plan=true"], tmp_path / "run", cwd=PROJECT, PYTHONPATH=str(PROJECT)))
    assert said in line and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_an_evaluation_limit_scores_the_same_samples_on_1_and_2_processes_with_the_template_s_loaders(
    tiny_data, tmp_path
):
    # Its evaluation loaders use the per-device batch (half as large on 2 processes): Lightning's count of
    # batches on each process then covers the samples of 1 process, and the plan leaves it so.
    env = {"cwd": PROJECT, "PYTHONPATH": str(PROJECT)}
    run = tmp_path / "run"
    trained = run_cli([*ARGS, "batch.global_size=32", "trainer.max_steps=10"], run, tiny_data, **env)
    assert trained.returncode == 0, trained.stderr[-3000:]
    ckpt = run / "checkpoints" / "last.ckpt"
    scored = {}
    for devices in (1, 2):
        args = [*ARGS, "batch.global_size=32", "mode=eval", f"ckpt_path={ckpt}", "trainer.limit_test_batches=3",
                f"hardware.devices={devices}", "strategy=ddp" if devices > 1 else "strategy=auto"]  # fmt: skip
        done = run_cli(args, tmp_path / f"eval{devices}", tiny_data, **env)
        assert done.returncode == 0, done.stderr[-3000:]
        scored[devices] = json.loads((tmp_path / f"eval{devices}" / "results.json").read_text())["test"]
    assert scored[2]["test/acc"] == pytest.approx(scored[1]["test/acc"], abs=1e-6)
    assert scored[2]["test/loss"] == pytest.approx(scored[1]["test/loss"], abs=1e-5)


@pytest.mark.parametrize(
    ("mistake", "said"),
    [
        ("model.net._target_=src.models.components.nowhere.Net", "model.net._target_=src.models.components.nowhere"),
        ("model.net.lin1_size=abc", "model.net.lin1_size=abc is not an integer, which SimpleDenseNet takes"),
        ("+model.net.lin1_sz=3", "model.net.lin1_sz is not an argument of SimpleDenseNet"),
        ("data.data_dir=null", "data.data_dir=null is no value for MNISTDataModule's data_dir: str"),
    ],
)
def test_a_mistake_in_the_template_s_nested_network_or_data_is_one_line_by_plan_true_too(
    tiny_data, tmp_path, mistake, said
):
    from conftest import one_line

    for extra in (["plan=true"], ["trainer.max_steps=1"]):
        line = one_line(run_cli([*ARGS, mistake, *extra], tmp_path / "run", tiny_data, cwd=PROJECT,
                                PYTHONPATH=str(PROJECT)))  # fmt: skip
        assert said in line, (extra, line)
        assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_run_continued_from_an_epoch_end_keeps_the_template_s_plateau_schedule(tiny_data, tmp_path):
    """The template's ReduceLROnPlateau is stepped after the epoch's end hooks, where the checkpoints are saved;
    Lightning skips that step when it resumes from one. 2 epochs then a 3rd trained the 3rd at the rate the
    schedule had cut (to 1e-4) in an uninterrupted run, at 1e-3 after continuing: other weights, silently."""
    import torch

    cut = [*ARGS, "batch.global_size=32", "model.scheduler.patience=0", "+model.scheduler.threshold_mode=abs",
           "+model.scheduler.threshold=10"]  # fmt: skip  # every epoch after the first counts as no better: a cut
    env = {"cwd": PROJECT, "PYTHONPATH": str(PROJECT)}
    straight, continued = tmp_path / "straight", tmp_path / "continued"
    for run, budgets in ((straight, [3]), (continued, [2, 3])):
        for epochs in budgets:
            result = run_cli([*cut, f"trainer.max_epochs={epochs}"], run, tiny_data, **env)
            assert result.returncode == 0, result.stderr[-3000:]
    a, b = (
        torch.load(r / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
        for r in (straight, continued)
    )
    assert a["global_step"] == b["global_step"] and a["lr_schedulers"] == b["lr_schedulers"]
    assert [g["lr"] for g in b["optimizer_states"][0]["param_groups"]] == pytest.approx([1e-4])
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
