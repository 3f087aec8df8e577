"""results.json of a finished run, from the trainer's counters and the metrics the module logged."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from hydralight.config.plan import ObjectivePlan
from hydralight.training.records import Throughput, result_line, run_results


def finished(metrics, metric="val/acc", direction="max", tested=None):
    # The counters run_results reads; no checkpoint callback, so the objective is the last logged value.
    trainer = SimpleNamespace(
        global_step=8, current_epoch=2, max_steps=-1, max_epochs=2, checkpoint_callback=None, checkpoint_callbacks=[]
    )
    if tested is None:
        tested = {k: v for k, v in metrics.items() if k.startswith("test")}
    fitted = {k: v for k, v in metrics.items() if k not in tested}
    return run_results(trainer, fitted, tested, None, ObjectivePlan(metric, direction), 128.0)


def test_the_classifier_headline_is_kept_where_the_module_logs_test_accuracy():
    found = finished({"val/acc": 0.9, "test/acc": 0.875, "test/loss": 0.3})
    assert found["test/acc"] == 0.875 and found["test"] == {"test/acc": 0.875, "test/loss": 0.3}


@pytest.mark.parametrize("metrics", [{"val/mse": 0.2, "test/mse": 0.25}, {"val/mse": 0.2}])
def test_a_module_without_test_accuracy_has_no_null_headline(metrics):
    found = finished(metrics, "val/mse", "min")
    # Absent, not null: nothing says accuracy was measured.
    assert "test/acc" not in found and found["objective"]["value"] == 0.2
    assert found["test"] == {k: v for k, v in metrics.items() if k.startswith("test/")}
    line = result_line(found, "run")
    assert line.startswith("test/mse=0.2500") if found["test"] else line.startswith("no test metrics")


@pytest.mark.parametrize(
    "metric,logged,first",
    [
        ("val_loss", {"test_loss": 0.5, "test_acc": 0.8}, "test_loss=0.5000"),  # Lightning's docs
        ("val/acc", {"test/acc": 0.9, "test/loss": 0.2}, "test/acc=0.9000"),
        ("loss/val", {"loss/test": 0.3}, "loss/test=0.3000"),
        ("val_acc", {"test_acc/dataloader_idx_0": 0.7, "test_acc/dataloader_idx_1": 0.6}, "test_acc/dataloader_idx_0"),
    ],
)
def test_what_the_test_stage_logged_is_the_test_record_under_the_module_s_names(metric, logged, first):
    found = finished({metric: 0.4}, metric, "min", tested=logged)
    assert found["test"] == logged and found["metrics"][metric] == 0.4
    assert result_line(found, "run").startswith(first)


def test_a_validation_metric_s_test_counterpart():
    from hydralight.rundir.outcome import test_counterpart

    pairs = {"val/acc": "test/acc", "val_loss": "test_loss", "valid_acc": "test_acc", "loss/val": "loss/test",
             "validation/f1": "test/f1", "val/acc_best": "test/acc_best", "interval_len": "test_interval_len"}  # fmt: skip
    assert {m: test_counterpart(m) for m in pairs} == pairs


def test_an_attempt_that_trains_no_step_reports_the_throughput_of_the_attempt_that_did():
    """Killed in its test and continued: the continuing attempt's fit trains nothing (Lightning skips its
    loop); its samples/s are the trained attempt's, carried in the checkpoint, not its steps over no time."""
    trainer = SimpleNamespace(global_step=0)
    trained, into = Throughput(32, into={}, warmup=1), {}
    trained.on_fit_start(trainer, None)
    trained.on_train_start(trainer, None)
    for step in range(1, 11):
        trainer.global_step = step
        trained.on_train_batch_end(trainer, None, None, None, step - 1)
    state = trained.state_dict()
    assert state["train_samples_per_second"] > 0 and state["samples_per_second"] > 0
    continued = Throughput(32, into=into, warmup=1)
    continued.setup(trainer, None, "fit")
    continued.load_state_dict(state)
    continued.on_fit_start(trainer, None)  # no on_train_start: the fit loop is skipped
    assert continued.samples_per_second(trainer, fit_seconds=0.001) == state["samples_per_second"]
    assert into["train_samples_per_second"] == state["train_samples_per_second"]
    assert continued.state_dict() == state  # and the next checkpoint carries them on
    # mode=eval tests the checkpoint: no speed of training is its own.
    tested, into = Throughput(32, into={}, warmup=1), {}
    tested.into = into
    tested.setup(trainer, None, "test")
    tested.load_state_dict(state)
    assert tested.samples_per_second(trainer, fit_seconds=None) is None and into == {}


@pytest.mark.parametrize(("hparams", "recorded"), [({"lr": 0.01}, 0.01), ({}, 0.1)])
def test_a_rank_records_the_learning_rate_it_trains_with(hparams, recorded, tmp_path):
    """The module's `lr` argument, or (a module that takes none: Lightning's BoringModel sets SGD's) its optimizer's."""
    import json

    import torch

    from hydralight.training.records import RankRecord

    net = torch.nn.Linear(2, 2)
    trainer = SimpleNamespace(global_rank=0, local_rank=0, node_rank=0, world_size=1, strategy=None,
                              optimizers=[torch.optim.SGD(net.parameters(), lr=0.1)])  # fmt: skip
    module = SimpleNamespace(hparams=hparams, device="cpu", modules=net.modules)
    RankRecord(str(tmp_path)).on_fit_start(trainer, module)
    assert json.loads((tmp_path / "ranks" / "rank0.json").read_text())["lr"] == recorded


@pytest.mark.slow
def test_the_objective_s_best_checkpoint_is_tested_whatever_the_order_of_the_callbacks(tiny_data, tmp_path):
    """A user's own ModelCheckpoint by another metric listed before the shipped one (as a callbacks group written
    for lightning-hydra-template puts it): the checkpoint tested and the objective's value are still the best by
    the objective (they were the other callback's best, and the objective's last value)."""
    import csv

    from conftest import TINY, run_cli

    (tmp_path / "conf" / "callbacks").mkdir(parents=True)
    (tmp_path / "conf" / "callbacks" / "by_loss.yaml").write_text(
        "by_loss:\n  _target_: pytorch_lightning.callbacks.ModelCheckpoint\n  monitor: val/loss\n  mode: min\n"
        "  dirpath: ${hydra:runtime.output_dir}/by_loss\n  save_top_k: 1\n"
    )
    run = tmp_path / "run"
    args = [*TINY, "callbacks=[by_loss,default]", "trainer.max_epochs=4", "optim.lr=0.05", "seed=3"]
    done = run_cli(args, run, tiny_data, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((run / "results.json").read_text())
    with (run / "csv" / "metrics.csv").open() as f:
        accs = [float(r["val/acc"]) for r in csv.DictReader(f) if r.get("val/acc")]
    assert results["objective"]["value"] == pytest.approx(max(accs))
    assert Path(results["best_checkpoint"]).parent == run / "checkpoints"


@pytest.mark.slow
def test_a_run_continued_from_a_user_s_own_last_checkpoint_logs_each_step_once(tiny_data, tmp_path):
    """A callbacks group of the user's own in place of the shipped one (as lightning-hydra-template's), whose
    ModelCheckpoint saved last.ckpt before training ended: the continued run redoes the steps after it, and the
    history keeps them once (the rows of the attempt that did not survive go, as with the shipped callbacks)."""
    import csv
    from collections import Counter

    from conftest import TINY, run_cli

    (tmp_path / "conf" / "callbacks").mkdir(parents=True)
    (tmp_path / "conf" / "callbacks" / "mine.yaml").write_text(
        "every_two:\n  _target_: pytorch_lightning.callbacks.ModelCheckpoint\n  every_n_epochs: 2\n"
        "  save_last: true\n  dirpath: ${hydra:runtime.output_dir}/checkpoints\n"
    )
    run = tmp_path / "run"
    for epochs in (3, 4):  # 4 steps an epoch: last.ckpt at step 8 only, the first attempt ends at step 12
        done = run_cli([*TINY, "callbacks=mine", f"trainer.max_epochs={epochs}"], run, tiny_data, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((run / "results.json").read_text())["global_step"] == 16
    with (run / "csv" / "metrics.csv").open() as f:
        logged = Counter(
            (r["step"], key) for r in csv.DictReader(f) for key, value in r.items() if value and key != "step"
        )
    assert [entry for entry, times in logged.items() if times > 1 and entry[1] != "epoch"] == []
