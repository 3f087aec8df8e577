"""A user's module in a run shorter than trainer.log_every_n_steps: what it logs per step reaches
csv/metrics.csv at each validation and at the end (Lightning writes step values only every n steps), so the
sweep report's loss panel has points, as it has for the built-in classifier."""

import pytest
from conftest import HELPERS, csv_rows, run_cli

from hydralight.reports.sweep import load_job
from hydralight.rundir.outcome import find_jobs

PROJECT = HELPERS / "user_project"


@pytest.mark.slow
def test_a_user_module_s_short_run_has_its_training_loss_at_each_validation_and_the_end(tiny_data, tmp_path):
    run = tmp_path / "run"
    # my_tasks.template logs train/loss per step; 15 steps an epoch, 8 steps run, validated every 3.
    args = ["model=template", "hardware=cpu", "data.val_size=100", "batch.global_size=32", "trainer.max_steps=8",
            "trainer.val_check_interval=3", "trainer.log_every_n_steps=5"]  # fmt: skip
    result = run_cli(args, run, tiny_data, cwd=PROJECT, PYTHONPATH=str(PROJECT))
    assert result.returncode == 0, result.stderr[-3000:]
    rows = csv_rows(run)
    losses = [int(r["step"]) for r in rows if r.get("train/loss")]
    validations = [int(r["step"]) for r in rows if r.get("val/acc")]
    # Lightning's own row (step 4, the 5th step) and the ones added before each validation and at the end, each
    # step once, in its epoch.
    assert validations == [2, 5, 7] and losses == [2, 4, 5, 7], rows
    assert all(r["epoch"] == "0" for r in rows if r.get("train/loss")), rows
    (job,) = [load_job(outcome) for outcome in find_jobs(tmp_path)]  # what the sweep report plots
    assert [s for s, _ in job.train_loss] == losses and [s for s, _ in job.validation] == validations
