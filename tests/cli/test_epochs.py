"""A run stopped inside an epoch by a step budget: its checkpoint names, metrics.csv epochs and last progress
lines give the epoch its last step was taken in, and a resumed run's epochs go on from there."""

import json
import re

import pytest
from conftest import HELPERS, TINY, csv_rows, run_cli

PROJECT = HELPERS / "user_project"
# 512 training points in global batches of 32: 16 steps an epoch; 20 steps stop at batch 4 of epoch 1.
REGRESSION = ["model=regressor", "data=points", "hardware=cpu", "objective.metric=val/mse", "objective.direction=min",
              "batch.global_size=32", "trainer.max_epochs=3"]  # fmt: skip


def user_run(args, run):
    result = run_cli(args, run, cwd=PROJECT, PYTHONPATH=str(PROJECT))
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
    return result


@pytest.mark.slow
def test_a_run_stopped_inside_an_epoch_names_that_epoch_and_its_resume_goes_on_from_it(tmp_path):
    run = tmp_path / "run"
    lines = user_run([*REGRESSION, "trainer.max_steps=20"], run).stdout.splitlines()
    rows = csv_rows(run)
    validated = [r for r in rows if "val/mse" in r]
    # The final validation (after step 20, between the epoch-end validations) is logged in epoch 1, its step's.
    assert [(int(r["step"]), int(r["epoch"])) for r in validated] == [(15, 0), (19, 1)], validated
    # The epoch's line says where it stopped; the final validation's values have a line of their own, the last.
    assert lines[-3].startswith("epoch 1 stopped at batch 4/16 in ") and " step 20 " in lines[-3]
    assert lines[-2].startswith("epoch 1 validated at step 20 ")
    assert f"val/mse={float(validated[-1]['val/mse']):.4g}" in lines[-2]
    # The best checkpoint's name gives the epoch and step of its validation's row.
    best = json.loads((run / "results.json").read_text())["best_checkpoint"]
    epoch, step = map(int, re.search(r"epoch(\d+)-step(\d+)\.ckpt$", best).groups())
    assert (step - 1, epoch) in [(int(r["step"]), int(r["epoch"])) for r in validated], best
    # Continued to 40 steps: epoch 1 goes on, and the epoch column never goes back.
    user_run([*REGRESSION, "trainer.max_steps=40"], run)
    epochs = [int(r["epoch"]) for r in csv_rows(run) if "epoch" in r and "test/mse" not in r]
    assert epochs == sorted(epochs) and epochs[-1] == 2, epochs


def test_the_progress_lines_of_an_epoch_a_step_budget_ends_count_to_its_last_batch(tiny_data, tmp_path):
    def counted(steps: int) -> list[str]:
        every = ["callbacks.progress.every_n_steps=1", "optim=adam"]  # a schedule-free optimizer: 5 steps go on to 8
        args = [*TINY, "trainer.limit_train_batches=null", f"trainer.max_steps={steps}", *every]
        result = run_cli(args, tmp_path / "run", tiny_data)
        assert result.returncode == 0, result.stderr[-2000:]
        return [line.split(" step ")[0] for line in result.stdout.splitlines() if line.startswith("epoch 0 ")]

    # Batches 1-4 of 5 (the 5th is the epoch's end line), then where it stopped among the epoch's 15.
    first = counted(5)
    assert first[:4] == [f"epoch 0 batch {i}/5" for i in range(1, 5)], first
    assert first[4].startswith("epoch 0 stopped at batch 5/15"), first
    # Continued to 8 steps inside the same epoch: the count goes on from batch 6.
    again = counted(8)
    assert again[:2] == ["epoch 0 batch 6/8", "epoch 0 batch 7/8"], again
    assert again[2].startswith("epoch 0 stopped at batch 8/15"), again


@pytest.mark.slow
@pytest.mark.parametrize("layout", [[], ["batch.max_per_device=8"], ["hardware.devices=2", "strategy=ddp"]],
                         ids=["1", "accumulating", "ddp"])  # fmt: skip
def test_overfit_batches_trains_the_same_global_batches_every_epoch(layout, tiny_data, tmp_path):
    """debug=overfit learns a few batches by heart: Lightning turns a shuffling loader sequential, but took the
    project's sampler for sequential and left it drawing new batches each epoch; and under accumulation it
    counted micro-batches, a quarter of the global batches."""
    seen = tmp_path / "seen"
    args = ["hardware=cpu", "debug=overfit", "trainer.max_epochs=3", "data.val_size=100", "batch.global_size=32",
            "batch.eval_size=50", *layout, "+callbacks.seen._target_=batches_seen.BatchesSeen", f"+callbacks.seen.out={seen}"]  # fmt: skip
    result = run_cli(args, tmp_path / "run", tiny_data, PYTHONPATH=str(HELPERS))
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
    ranks = [json.loads(p.read_text()) for p in sorted(seen.glob("rank*.json"))]
    assert len(ranks) == (2 if layout and layout[0] == "hardware.devices=2" else 1)
    # Each epoch's global batches: the ranks' micro-batches of a step together, in order.
    epochs = {epoch: sorted(i for rank in ranks for batch in rank[epoch] for i in batch) for epoch in ranks[0]}
    assert list(epochs) == ["0", "1", "2"]
    assert epochs["0"] == epochs["1"] == epochs["2"] and len(epochs["0"]) == 4 * 32
    assert json.loads((tmp_path / "run" / "results.json").read_text())["global_step"] == 3 * 4
