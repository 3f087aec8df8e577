"""The run's guards in-process: a non-finite loss stops the step before its update."""

import json
from types import SimpleNamespace

import pytest
import torch

from hydralight.errors import UserError
from hydralight.training.guards import FiniteLoss, PlannedBatch


@pytest.mark.parametrize(
    ("loss", "says"),
    [(torch.tensor(float("nan")), "the loss is nan"), (torch.tensor([1.0, float("inf")]), "the loss is inf")],
)
def test_a_non_finite_loss_scalar_or_not_is_refused_naming_the_step_and_the_learning_rate(tmp_path, loss, says):
    guard = FiniteLoss(str(tmp_path / "last.ckpt"))
    trainer, module = SimpleNamespace(global_step=7, current_epoch=1), SimpleNamespace(hparams={"lr": 0.5})
    guard.on_before_backward(trainer, module, torch.tensor(2.5))  # finite: nothing to say
    guard.on_before_backward(trainer, module, torch.tensor([2.5, -1.0]))
    with pytest.raises(UserError, match=f"{says} at step 7 \\(epoch 1\\); lower optim.lr \\(now 0.5\\)"):
        guard.on_before_backward(trainer, module, loss)


def test_an_accumulation_of_its_own_is_refused_before_a_step_trains(tiny_data, tmp_path):
    from conftest import TINY, one_line, run_cli

    scheduler = ["+callbacks.acc._target_=pytorch_lightning.callbacks.GradientAccumulationScheduler",
                 "+callbacks.acc.scheduling={0:4}"]  # fmt: skip
    for extra in ([], ["batch.max_per_device=8"]):  # Lightning's own refusal of the pair was a traceback
        line = one_line(run_cli([*TINY, *scheduler, *extra], tmp_path / "run", tiny_data))
        assert "callbacks.acc accumulates by epoch (a GradientAccumulationScheduler) where the plan sets" in line
        assert not (tmp_path / "run").exists()


def test_an_accumulation_a_module_sets_itself_is_refused_before_a_step_trains(tiny_data, tmp_path):
    from conftest import TINY, one_line, run_cli

    (tmp_path / "selfacc.py").write_text(
        "from pytorch_lightning.callbacks import GradientAccumulationScheduler\n"
        "from hydralight.tasks.classifier import Classifier\n\n\n"
        "class SelfAccumulating(Classifier):\n"
        "    def configure_callbacks(self):\n"
        "        return [GradientAccumulationScheduler({0: 4})]\n"
    )
    args = [*TINY, "model._target_=selfacc.SelfAccumulating"]
    line = one_line(run_cli(args, tmp_path / "run", tiny_data, cwd=tmp_path, PYTHONPATH=str(tmp_path)))
    assert "4 batches an optimizer step (a GradientAccumulationScheduler) where the plan sets" in line
    assert not (tmp_path / "run").exists()


ON_STEP = """
import pytorch_lightning as pl
import torch


class OnStep(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(784, 10)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.layer(x.flatten(1)), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        acc = (self.layer(x.flatten(1)).argmax(1) == y).float().mean()
        self.log("val/acc", acc, on_step=True, on_epoch=True)  # as val/acc, val/acc_step and val/acc_epoch

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)
"""


def test_an_objective_logged_per_step_and_per_epoch_in_validation_is_taken(tiny_data, tmp_path):
    from conftest import TINY, run_cli

    (tmp_path / "on_step.py").write_text(ON_STEP)
    run = tmp_path / "run"
    result = run_cli([*TINY, "model._target_=on_step.OnStep"], run, tiny_data, cwd=tmp_path, PYTHONPATH=str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((run / "results.json").read_text())["objective"]["value"] is not None


def test_the_planned_batch_is_measured_at_the_start_of_every_epoch():
    """A data module that builds its loaders again each epoch (`reload_dataloaders_every_n_epochs`) and halves
    its batch from the second epoch on is stopped before that epoch trains; a short last batch is not."""
    guard = PlannedBatch(8)
    trainer = SimpleNamespace(accumulate_grad_batches=1, global_rank=0, num_training_batches=3, current_epoch=0,
                              world_size=1)  # fmt: skip
    for batch_idx, size in enumerate((8, 8, 5)):  # epoch 0 ends on a short batch
        guard.on_train_batch_start(trainer, None, torch.zeros(size, 2), batch_idx)
    trainer.current_epoch = 1
    guard.on_train_batch_start(trainer, None, torch.zeros(8, 2), 0)
    trainer.current_epoch = 2
    with pytest.raises(UserError, match="trains on batches of 4 from epoch 2 on .* the plan gives each device 8"):
        guard.on_train_batch_start(trainer, None, torch.zeros(4, 2), 0)
    assert guard.measured == 8


def test_training_data_smaller_than_one_batch_is_refused():
    guard = PlannedBatch(100_000)
    trainer = SimpleNamespace(accumulate_grad_batches=1, global_rank=0, num_training_batches=1, current_epoch=0,
                              world_size=1)  # fmt: skip
    with pytest.raises(UserError, match="one batch of 55000 an epoch where the plan gives each device 100000"):
        guard.on_train_batch_start(trainer, None, torch.zeros(55_000, 1), 0)
