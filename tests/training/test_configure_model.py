"""A module that builds its layers in `configure_model` (as Lightning's docs write large models), logging
`val_loss`/`test_loss`: trained on 1 and 2 processes under ddp, ddp_spawn and fsdp, ranks end with equal weights,
its checkpoints are tested, predicted from and started from."""

import json

import pytest
import torch
from conftest import HELPERS, run_cli

PROJECT = HELPERS / "user_project"
ARGS = ["model=late", "data=lit_points", "objective.metric=val_loss", "objective.direction=min", "hardware=cpu",
        "batch.global_size=32"]  # fmt: skip


def train(args, run, tmp_path):
    done = run_cli([*ARGS, *args], run, cwd=PROJECT, PYTHONPATH=str(PROJECT), WEIGHTS_DIR=str(tmp_path / "weights"))
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert "Traceback" not in done.stderr
    return json.loads((run / "results.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn", "fsdp"])
def test_ranks_hold_equal_weights_and_its_checkpoint_is_tested_and_predicted(strategy, tmp_path):
    run = tmp_path / "run"
    results = train(["hardware.devices=2", f"strategy={strategy}", "trainer.max_steps=12"], run, tmp_path)
    ranks = [torch.load(tmp_path / "weights" / f"rank{r}.pt") for r in (0, 1)]
    assert ranks[0].keys() == ranks[1].keys() and len(ranks[0]) == 4
    assert all(torch.equal(ranks[0][k], ranks[1][k]) for k in ranks[0])
    assert results["global_step"] == 12 and set(results["test"]) == {"test_loss"}
    assert results["objective"]["metric"] == "val_loss" and results["objective"]["value"] is not None
    # The final weights are what every rank held: they are the checkpoint's.
    saved = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    assert all(torch.equal(saved[k].float(), ranks[0][k]) for k in ranks[0])
    evaluated = run_cli(["mode=eval", f"ckpt_path={results['best_checkpoint']}", "data=lit_points", "hardware=cpu"],
                        tmp_path / "eval", cwd=PROJECT, PYTHONPATH=str(PROJECT))  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    tested = json.loads((tmp_path / "eval" / "results.json").read_text())["test"]["test_loss"]
    assert tested == pytest.approx(results["test"]["test_loss"], rel=1e-4)
    predicted = run_cli(["mode=predict", f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}", "data=lit_points",
                         "hardware=cpu"], tmp_path / "predict", cwd=PROJECT, PYTHONPATH=str(PROJECT))  # fmt: skip
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    assert "64 rows" in predicted.stdout


@pytest.mark.slow
def test_a_new_run_starts_from_its_weights(tmp_path):
    first = tmp_path / "first"
    train(["trainer.max_steps=6"], first, tmp_path)
    second = train(
        ["trainer.max_steps=2", f"init_from={first / 'checkpoints' / 'last.ckpt'}"], tmp_path / "b", tmp_path
    )
    assert second["global_step"] == 2


def test_the_plan_line_says_its_layers_come_later_instead_of_no_parameters():
    import pytorch_lightning as pl
    from conftest import plan_of

    from hydralight.training.console import plan_line

    class Late(pl.LightningModule):
        def configure_model(self) -> None:
            if not hasattr(self, "net"):
                self.net = torch.nn.Linear(4, 2)

    class Built(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 2)

    plan = plan_of("hardware=cpu")
    assert plan_line(plan, Late()).endswith("model Late layers built in configure_model")
    assert plan_line(plan, Built()).endswith("model Built(Linear) 0.00M params")


def test_the_plan_line_names_a_strategy_asked_for_one_process():
    """`strategy=ddp_spawn` on one process runs in a spawned process: the line said nothing of it."""
    import pytorch_lightning as pl
    from conftest import plan_of

    from hydralight.training.console import plan_line

    line = plan_line(plan_of("hardware=cpu", "strategy=ddp_spawn"), pl.LightningModule())
    assert line.startswith("plan: 1 cpu process (") and "), ddp_spawn, 32-true;" in line, line
    assert "), 32-true;" in plan_line(plan_of("hardware=cpu"), pl.LightningModule())
    two = plan_line(plan_of("hardware=cpu", "hardware.devices=2", "strategy=ddp"), pl.LightningModule())
    assert "), ddp (gloo), 32-true;" in two, two
