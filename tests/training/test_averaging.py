"""Callback presets through the CLI: EMA and SWA weights (validated, saved and tested as the average) and early
stopping on the objective, each continued exactly after a stop."""

import json
import os
import signal

import pytest
import torch
from conftest import HELPERS, TINY, csv_rows, run_cli

pytestmark = pytest.mark.slow

# 15 steps an epoch on the tiny data (480 training images, batch 32).
BASE = [*(a for a in TINY if not a.startswith("trainer.")), "trainer.max_epochs=3", "model=mlp"]
STOP = ["+callbacks.zz_signal._target_=signal_at.SignalAt", "+callbacks.zz_signal.step=20"]


def results(run):
    return json.loads((run / "results.json").read_text())


def checkpoint(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def ok(result):
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def stopped_and_continued(args, run, data):
    path = os.pathsep.join(p for p in (str(HELPERS), os.environ.get("PYTHONPATH")) if p)
    first = run_cli([*args, *STOP], run, data, PYTHONPATH=path)
    assert first.returncode == 128 + signal.SIGTERM, first.stderr[-2000:]
    return ok(run_cli(args, run, data))


@pytest.mark.parametrize("preset", ["ema", "swa"])
def test_averaged_weights_are_tested_and_continue_exactly_after_a_stop(preset, tiny_data, tmp_path):
    args = [*BASE, f"callbacks=[default,{preset}]"]
    plain, stopped = tmp_path / "plain", tmp_path / "stopped"
    ok(run_cli(args, plain, tiny_data))
    stopped_and_continued(args, stopped, tiny_data)
    a, b = checkpoint(plain / "checkpoints" / "last.ckpt"), checkpoint(stopped / "checkpoints" / "last.ckpt")
    # last.ckpt holds the average (state_dict) and the weights being trained: both continued exactly.
    for key in ("state_dict", "current_model_state"):
        assert all(torch.equal(a[key][k], b[key][k]) for k in a[key]), key
    assert not all(torch.equal(a["state_dict"][k], a["current_model_state"][k]) for k in a["state_dict"])
    assert results(plain)["test"] == results(stopped)["test"]
    # What was tested is the saved average: testing the best checkpoint alone gives the same numbers.
    best = results(plain)["best_checkpoint"]
    again = ok(run_cli([*args, "mode=eval", f"ckpt_path={best}"], tmp_path / "eval", tiny_data))
    assert again.stdout.splitlines()[-1].split()[:2] == [
        f"test/acc={results(plain)['test']['test/acc']:.4f}",
        f"test/loss={results(plain)['test']['test/loss']:.4f}",
    ]


def test_swa_validates_the_weights_trained_until_it_averages_then_the_average_of_each_epoch_end(tiny_data, tmp_path):
    """SWA from epoch 1: epochs 0 and 1 validate what plain training validates (no average yet, then an
    average of one); epoch 2 validates and saves the mean of the weights epochs 1 and 2 ended with."""
    swa, two, three = tmp_path / "swa", tmp_path / "two", tmp_path / "three"
    ok(run_cli([*BASE, "callbacks=[default,swa]"], swa, tiny_data))
    ok(run_cli([*BASE, "trainer.max_epochs=2"], two, tiny_data))
    ok(run_cli(BASE, three, tiny_data))
    validated = lambda run: [float(r["val/loss"]) for r in csv_rows(run) if "val/loss" in r]  # noqa: E731
    assert validated(swa)[:2] == validated(three)[:2]
    assert validated(swa)[2] != validated(three)[2]
    averaged = checkpoint(swa / "checkpoints" / "last.ckpt")
    ends = [checkpoint(run / "checkpoints" / "last.ckpt")["state_dict"] for run in (two, three)]
    for name, value in averaged["state_dict"].items():
        assert torch.allclose(value, (ends[0][name] + ends[1][name]) / 2, atol=1e-6), name
        assert torch.equal(averaged["current_model_state"][name], ends[1][name])


def test_early_stopping_stops_on_the_objective_and_keeps_counting_after_a_stop(tiny_data, tmp_path):
    # No validation can improve val/acc by 10: the second validation without improvement stops the run.
    args = [*BASE, "trainer.max_epochs=6", "callbacks=[default,early_stopping]",
            "callbacks.early_stopping.patience=2", "callbacks.early_stopping.min_delta=10"]  # fmt: skip
    plain, stopped = tmp_path / "plain", tmp_path / "stopped"
    said = run_cli(args, plain, tiny_data)
    ok(said)
    assert (results(plain)["epochs"], results(plain)["global_step"]) == (3, 45)
    # What ended it is recorded and said, as a budget that ends a run is.
    assert results(plain)["stopped_by"] == {"budget": "early stopping on val/acc", "before": ["trainer.max_epochs=6"]}
    assert "stopped by early stopping on val/acc at step 45, before trainer.max_epochs=6" in said.stdout
    stopped_and_continued(args, stopped, tiny_data)
    assert (results(stopped)["epochs"], results(stopped)["global_step"]) == (3, 45)
    state = checkpoint(stopped / "checkpoints" / "last.ckpt")["callbacks"]
    assert any(k.startswith("EarlyStopping") and v["wait_count"] == 2 for k, v in state.items())
