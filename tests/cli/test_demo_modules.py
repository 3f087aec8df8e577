"""Lightning's own demo classes (pytorch_lightning.demos) through train.py, unchanged: BoringModel validates
without logging anything, so it trains with no objective (said in one line), on 1 and 2 processes."""

import json

import pytest
from conftest import HELPERS, run_cli

BORING = ["model=boring", "data=boring", "hardware=cpu", "batch.global_size=4", "trainer.max_steps=6",
          "trainer.val_check_interval=3"]  # fmt: skip


def demo_project(folder):
    """A folder whose ./conf names Lightning's demo module and a data module around its data, as a user writes."""
    for group, target in (("model", "pytorch_lightning.demos.boring_classes.BoringModel"),
                          ("data", "boring_data.BoringData")):  # fmt: skip
        (folder / "conf" / group).mkdir(parents=True)
        (folder / "conf" / group / "boring.yaml").write_text(f"_target_: {target}\n")
    return folder


@pytest.mark.slow
@pytest.mark.parametrize(
    "processes",
    [[], ["hardware.devices=2", "strategy=ddp"], ["hardware.devices=2", "strategy=ddp_spawn"]],
    ids=["1", "ddp", "ddp_spawn"],  # ddp_spawn: its test stage loads last.ckpt (there is no best by an objective)
)
def test_a_validation_that_logs_nothing_trains_without_an_objective(processes, tmp_path):
    run = tmp_path / "run"
    done = run_cli([*BORING, *processes], run, cwd=demo_project(tmp_path), PYTHONPATH=str(HELPERS))
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    said = [line for line in (run / "train.log").read_text().splitlines() if "no objective:" in line]
    assert len(said) == 1 and "trainer.limit_val_batches=0" in said[0], said
    # Its own loaders are not used: the data module's are, and the run says so.
    own = [line for line in (run / "train.log").read_text().splitlines() if "train_dataloader of its own" in line]
    assert len(own) == 1 and "boring_data.BoringData" in own[0], own
    results = json.loads((run / "results.json").read_text())
    assert results["global_step"] == 6 and results["objective"]["value"] is None
    assert results["best_checkpoint"].endswith("last.ckpt")
    # Its test step runs and logs nothing: the last line says so (not "no test step").
    assert results["test"] == {} and results["test_batches_per_process"] > 0
    assert done.stdout.splitlines()[-1].startswith("no test metrics (the module's test step logs nothing")
    measured = {json.loads(p.read_text())["train_batch_size"] for p in (run / "ranks").glob("rank*.json")}
    assert measured == {4 // (2 if processes else 1)}


def demo_model_run(tmp_path):
    """A finished run of Lightning's DemoModel (a `./conf/model/demo.yaml` naming it), and how to continue it."""
    project = demo_project(tmp_path)
    (project / "conf" / "model" / "demo.yaml").write_text(
        "_target_: pytorch_lightning.demos.boring_classes.DemoModel\n"
    )
    run, demo = tmp_path / "run", [*BORING, "model=demo"]
    first = run_cli(demo, run, cwd=project, PYTHONPATH=str(HELPERS))
    assert first.returncode == 0, first.stderr[-3000:]
    return run, lambda *more: run_cli([*demo, *more], run, cwd=project, PYTHONPATH=str(HELPERS))


@pytest.mark.slow
def test_a_new_learning_rate_for_a_module_that_saves_no_hyperparameters_is_applied_on_continuing(tmp_path):
    """Lightning's DemoModel keeps its rate in an attribute of its own name, in no hparams: a continued run with
    another `model.learning_rate` trained on at the old rate and said nothing."""
    import torch

    run, continued = demo_model_run(tmp_path)
    again = continued("trainer.max_steps=9", "model.learning_rate=0.5")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "learning rate 0.02 -> 0.5: applied to the restored optimizer" in again.stdout + again.stderr
    assert json.loads((run / "results.json").read_text())["learning_rate_changes"] == [
        {"step": 6, "from": 0.02, "to": 0.5}
    ]
    saved = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert [g["lr"] for g in saved["optimizer_states"][0]["param_groups"]] == [0.5] and saved["global_step"] == 9


@pytest.mark.slow
def test_a_continuation_whose_module_does_not_fit_its_checkpoint_is_one_line_and_changes_no_record(tmp_path):
    """DemoModel with another `out_dim` (its hparams hold nothing to compare): torch's size mismatch was a
    traceback, after the run's config.yaml and manifest.json were rewritten with the settings that failed."""
    run, continued = demo_model_run(tmp_path)
    records = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    refused = continued("trainer.max_steps=9", "model.out_dim=5")
    assert refused.returncode == 2, refused.stderr[-3000:]
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the checkpoint does not fit") and "l1.weight" in last, refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == records
