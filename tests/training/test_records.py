"""results.json of a finished run, from the trainer's counters and the metrics the module logged."""

from types import SimpleNamespace

import pytest

from hydralight.config.plan import ObjectivePlan
from hydralight.training.records import result_line, run_results


def finished(metrics, metric="val/acc", direction="max"):
    # The counters run_results reads; no checkpoint callback, so the objective is the last logged value.
    trainer = SimpleNamespace(global_step=8, current_epoch=2, max_steps=-1, max_epochs=2, checkpoint_callback=None)
    return run_results(trainer, metrics, None, ObjectivePlan(metric, direction), 32, 0, 2.0)


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
