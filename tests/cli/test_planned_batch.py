"""The batch each rank really trains on is the plan's, whatever the data module does with `batch_size`: measured
on every rank (ranks/rank<N>.json), with lightning-hydra-template's data module unchanged, on 1 and 2 processes."""

import json

import pytest
from conftest import HELPERS, TINY, one_line, run_cli

TEMPLATE = HELPERS / "template_project"
ARGS = ["model=tpl_mnist", "data=tpl_mnist", "data.train_val_test_split=[600,100,100]", "hardware=cpu",
        "batch.global_size=32"]  # fmt: skip


def measured(run):
    return {p.name: json.loads(p.read_text())["train_batch_size"] for p in sorted((run / "ranks").glob("rank*.json"))}


@pytest.mark.slow
@pytest.mark.parametrize("processes", [["strategy=auto"], ["hardware.devices=2", "strategy=ddp"],
                                       ["hardware.devices=2", "strategy=ddp_spawn"],
                                       ["hardware.devices=2", "strategy=fsdp"]], ids=["1", "ddp", "ddp_spawn", "fsdp"])  # fmt: skip
def test_the_template_data_module_trains_on_the_planned_global_batch(processes, tiny_data, tmp_path):
    run = tmp_path / "run"
    done = run_cli([*ARGS, *processes, "trainer.max_steps=6"], run, tiny_data, cwd=TEMPLATE, PYTHONPATH=str(TEMPLATE))
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    world = 2 if len(processes) == 2 else 1
    assert measured(run) == {f"rank{r}.json": 32 // world for r in range(world)}
    divides = "divides batch_size by the world size itself (its loader gave 8 per device for batch_size=16)"
    assert (divides in done.stderr) == (world == 2)
    # The data config's batch_size: replaced by the per-device batch on 1 process; on 2, given the global batch as
    # the note above says, not said to be replaced by the per-device one.
    replaced = "note: data.batch_size=128 in the data config is replaced by the plan's per-device batch of"
    assert (replaced in done.stdout + done.stderr) == (world == 1)
    results = json.loads((run / "results.json").read_text())
    # The records count what the ranks trained (ddp_spawn too), as one process does: 6 steps of epoch 0, which
    # Lightning counts as ended when the budget stops it.
    assert results["global_step"] == 6 and results["epochs"] == 1 and results["train_samples_per_second"] > 0


@pytest.mark.slow
def test_the_template_trains_a_per_device_batch_its_own_setup_would_refuse(tiny_data, tmp_path):
    """3 a device on 2 processes: the template's setup refuses batch_size=3 (not divisible by 2); it is given 6."""
    run = tmp_path / "run"
    args = [*ARGS, "batch.global_size=6", "hardware.devices=2", "strategy=ddp", "trainer.max_steps=4"]
    done = run_cli(args, run, tiny_data, cwd=TEMPLATE, PYTHONPATH=str(TEMPLATE))
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert measured(run) == {"rank0.json": 3, "rank1.json": 3}


@pytest.mark.slow
def test_a_data_module_that_ignores_batch_size_is_refused_before_it_trains(tmp_path):
    (tmp_path / "conf" / "data").mkdir(parents=True)
    (tmp_path / "conf" / "data" / "fixed.yaml").write_text(
        f"_target_: plain_datamodule.FixedBatchDataModule\nrecord_dir: {tmp_path / 'seen'}\nfixed: 10\n"
    )
    args = ["data=fixed", *(a for a in TINY if not a.startswith("data.")), "batch.global_size=16"]
    line = one_line(run_cli(args, tmp_path / "run", cwd=tmp_path, PYTHONPATH=str(HELPERS)))
    assert "rank 0 trains on batches of 10 where the plan gives each device 16" in line
    assert not (tmp_path / "run").exists()
