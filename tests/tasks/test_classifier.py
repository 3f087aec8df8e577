"""The built-in classifier's optimizer and schedule, as a config asks for them."""

import pytest
from conftest import TINY, one_line, run_cli


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["+optim.optimizer.betas=[2,0.9]"], "optim.optimizer (Adam) refuses its config: Invalid beta parameter"),
        (["+optim.optimizer.betas=[0.9]"], "optim.optimizer.betas=[0.9] is not a list of 2 values, which Adam takes"),
        # Named before anything is built: the arguments the optimizer takes, the class that is not there.
        (["+optim.optimizer.momentun=0.9"], "optim.optimizer.momentun is not an argument of Adam (it takes amsgrad"),
        (["optim.optimizer._target_=torch.optim.Adamx"], "optim.optimizer._target_=torch.optim.Adamx cannot be imp"),
        (["optim=adam_onecycle", "+optim.scheduler.anneal_strategy=cosine"], "anneal_strategy must be one of"),
        # 4 steps with a quarter of them warming up: torch's OneCycleLR divides by the warm-up's length - 1.
        (["optim=adam_onecycle"], "(OneCycleLR) cannot schedule a run of 4 optimizer steps: one of its phases"),
    ],
    ids=["out-of-range", "too-few", "misspelt", "no-such-class", "bad-choice", "phase-of-no-step"],
)
def test_an_optimizer_or_schedule_torch_refuses_is_one_line_and_leaves_no_run_dir(overrides, said, tiny_data, tmp_path):
    line = one_line(run_cli([*TINY, *overrides], tmp_path / "run", tiny_data))
    assert said in line
    assert not (tmp_path / "run").exists()


def test_the_same_schedule_trains_a_run_long_enough_for_its_phases(tiny_data, tmp_path):
    result = run_cli([*TINY, "optim=adam_onecycle", "trainer.limit_train_batches=6"], tmp_path / "run", tiny_data)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "run" / "results.json").is_file()
