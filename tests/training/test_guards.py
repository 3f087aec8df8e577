"""The run's guards in-process: a non-finite loss stops the step before its update."""

from types import SimpleNamespace

import pytest
import torch

from hydralight.errors import UserError
from hydralight.training.guards import FiniteLoss


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
