"""The Trainer built from the plan: settings Lightning refuses only once it has the data are one line."""

from conftest import TINY, one_line, run_cli


def test_a_validation_interval_longer_than_the_epoch_is_one_line_and_leaves_no_run_dir(tiny_data, tmp_path):
    line = one_line(run_cli([*TINY, "trainer.val_check_interval=100"], tmp_path / "run", tiny_data))
    assert "trainer.val_check_interval=100 is more than the 4 training batches of an epoch" in line
    assert "trainer.check_val_every_n_epoch=null" in line and not (tmp_path / "run").exists()
    # The way out it names: validation counted across epochs.
    across = ["trainer.val_check_interval=6", "trainer.check_val_every_n_epoch=null", "trainer.max_epochs=2"]
    result = run_cli([*TINY, *across], tmp_path / "across", tiny_data)
    assert result.returncode == 0, result.stderr[-2000:]
