"""A GAN with manual optimization (tests/helpers/user_project/my_tasks/gan.py: two optimizers, each step leaving
the other network's parameters without gradients) on 2 DDP processes: trained with
`strategy.find_unused_parameters=true` (or Lightning's name for it), continued after a stop to the same weights
as an uninterrupted run, and refused in one line without the switch."""

import json
import signal

import pytest
import torch
from conftest import HELPERS, one_line, plan_of, run_cli

PROJECT = HELPERS / "user_project"
# Tiny MNIST in global batches of 32, 6 batches an epoch; each batch steps both optimizers, so Lightning
# counts 2 steps a batch (12 an epoch).
GAN = ["model=gan", "hardware=cpu", "hardware.devices=2", "strategy=ddp", "data.val_size=100", "batch.global_size=32",
       "batch.eval_size=50", "trainer.max_epochs=2", "trainer.limit_train_batches=6", "objective.metric=val/d_loss",
       "objective.direction=min"]  # fmt: skip
UNUSED = "strategy.find_unused_parameters=true"


def gan_run(args, run, data, **env):
    return run_cli(args, run, data, cwd=PROJECT, **{"PYTHONPATH": str(PROJECT), **env})


def ok(result):
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
    assert "Traceback" not in result.stderr
    return result


def last(run):
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)


@pytest.mark.parametrize(
    ("strategy", "unused"),
    [
        (["strategy=ddp", UNUSED], True),
        (["strategy=ddp_find_unused_parameters_true"], True),
        (["strategy=ddp_find_unused_parameters_false"], False),
        (["strategy=ddp"], False),
    ],
)
def test_lightning_s_strategy_names_are_ddp_with_the_switch_set(strategy, unused):
    plan = plan_of("hardware=cpu", "hardware.devices=2", *strategy)
    assert plan.framework.strategy == "ddp"
    assert plan.strategy_kwargs()["find_unused_parameters"] is unused


@pytest.mark.slow
def test_a_manual_optimization_gan_on_two_processes_continues_after_a_stop_to_the_same_weights(tiny_data, tmp_path):
    plain, cut = tmp_path / "plain", tmp_path / "cut"
    ok(gan_run([*GAN, UNUSED], plain, tiny_data))
    assert [json.loads((plain / "ranks" / f"rank{r}.json").read_text())["world_size"] for r in (0, 1)] == [2, 2]
    # Stopped after its first batch (step 2: a step per optimizer); the ranks agree on the stop at a step boundary
    # within about half a second (hydralight.resume.agreement).
    stop = ["+callbacks.zz_signal._target_=signal_at.SignalAt", "+callbacks.zz_signal.step=2"]
    first = gan_run([*GAN, UNUSED, *stop], cut, tiny_data, PYTHONPATH=f"{PROJECT}:{HELPERS}")
    assert first.returncode == 128 + signal.SIGTERM, first.stderr[-2000:]
    assert 2 <= last(cut)["global_step"] < 24
    ok(gan_run([*GAN, UNUSED], cut, tiny_data))  # the same command: continues from its own checkpoint
    a, b = last(plain), last(cut)
    assert a["global_step"] == b["global_step"] == 2 * 2 * 6
    assert a["state_dict"].keys() == b["state_dict"].keys()
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
    # Both optimizers' state (Adam's moments of the generator and the discriminator) continued exactly too.
    for ours, theirs in zip(a["optimizer_states"], b["optimizer_states"], strict=True):
        assert ours["state"].keys() == theirs["state"].keys()
        assert all(torch.equal(v, theirs["state"][p][n]) for p, s in ours["state"].items() for n, v in s.items())
    found = json.loads((cut / "results.json").read_text())
    assert found["objective"]["metric"] == "val/d_loss" and found["global_step"] == 24


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["strategy=ddp", "strategy=ddp_spawn"])  # ranks started by us, or forked by torch
def test_the_gan_without_the_switch_is_one_line_naming_it_and_leaves_no_run_dir(strategy, tiny_data, tmp_path):
    run = tmp_path / "run"
    line = one_line(gan_run([*GAN, strategy], run, tiny_data))
    assert "received no gradient" in line and line.endswith("set strategy.find_unused_parameters=true")
    assert not run.exists()
