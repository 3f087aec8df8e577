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
    assert out.count("note: data.batch_size=128 in the data config is replaced by the plan's 32") == 1
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
