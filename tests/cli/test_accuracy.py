"""The one-epoch recipe on the real MNIST: >= 99.0% test accuracy on CPU.

The claim's margin was measured, not assumed: seeds 0-9 with 1 and 2 threads gave 99.15% at worst and
99.23% on average (benchmarks/RESULTS.md), so this run of the default seed has over 0.1 points (10 test
images) of headroom on any CPU's numerics."""

import json

import pytest
from conftest import run_cli
from omegaconf import OmegaConf

pytestmark = pytest.mark.slow


def test_experiment_fast_reaches_99_percent_in_one_epoch(real_data, tmp_path):
    run = tmp_path / "fast"
    result = run_cli(["experiment=fast", "hardware=cpu", "logger=none"], run, real_data, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((run / "results.json").read_text())
    assert results["test/acc"] >= 0.99, results
    # One pass over the 55,000 training images in whole batches of the preset's size.
    batch = OmegaConf.load(run / "config.yaml").batch.global_size
    assert (results["epochs"], results["global_step"]) == (1, 55_000 // batch)
