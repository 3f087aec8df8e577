"""Networks follow the task's sizes; the ResNet preset, torch.compile and channels-last run and train alike."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import TINY, csv_rows, one_line, run_cli

from hydralight.errors import UserError
from hydralight.tasks.classifier import Classifier
from hydralight.tasks.nets import FastCNN, build_net

NETS = [
    "hydralight.tasks.nets.SeedCNN",
    "hydralight.tasks.nets.FastCNN",
    "hydralight.tasks.nets.MLP",
    "hydralight.tasks.nets.small_resnet",
]


@pytest.mark.parametrize("target", NETS)
@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32), (3, 20, 36)])
def test_networks_follow_channels_image_size_and_classes(target, shape):
    net = build_net({"_target_": target}, num_classes=7, input_shape=shape)
    assert net(torch.randn(2, *shape)).shape == (2, 7)


def test_mnist_networks_are_unchanged_and_explicit_settings_win():
    # The sizes networks had before they were passed: older checkpoints keep loading.
    assert build_net({"_target_": "hydralight.tasks.nets.SeedCNN"}, 10, (1, 28, 28))[7].in_features == 64 * 12 * 12
    assert build_net({"_target_": "hydralight.tasks.nets.FastCNN"}, 10, (1, 28, 28))[9].in_features == 32 * 7 * 7
    net = build_net({"_target_": "hydralight.tasks.nets.MLP", "num_classes": 3}, 10, (1, 28, 28))
    assert net[-1].out_features == 3
    # A torchvision builder takes num_classes through **kwargs.
    assert build_net({"_target_": "torchvision.models.resnet18"}, 4, (3, 32, 32)).fc.out_features == 4


def test_fastcnn_kernels_default_to_5x5_and_keep_the_map_size():
    def kernels(net: torch.nn.Module) -> list[tuple[int, ...]]:
        return [m.kernel_size for m in net if isinstance(m, torch.nn.Conv2d)]

    assert kernels(build_net({"_target_": "hydralight.tasks.nets.FastCNN"}, 10, (1, 28, 28))) == [(5, 5), (5, 5)]
    net = build_net({"_target_": "hydralight.tasks.nets.FastCNN", "kernels": [5, 3]}, 10, (1, 28, 28))
    assert kernels(net) == [(5, 5), (3, 3)] and net(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    with pytest.raises(ValueError, match="odd sizes"):
        FastCNN(kernels=[4, 3])
    with pytest.raises(ValueError, match="pool_first='maybe': use true or false"):
        FastCNN(pool_first="maybe")


def test_fastcnn_pool_first_pools_before_the_norm_and_keeps_the_old_order_by_default():
    old, first = FastCNN(), FastCNN(pool_first=True)
    assert [type(m).__name__ for m in old][:4] == ["Conv2d", "BatchNorm2d", "ReLU", "MaxPool2d"]
    assert [type(m).__name__ for m in first][:8] == ["Conv2d", "MaxPool2d", "BatchNorm2d", "ReLU"] * 2
    # Saved networks load as they were: the default's state_dict keys are the ones before the option.
    assert list(old.state_dict())[:2] == ["0.weight", "0.bias"] and "1.running_mean" in old.state_dict()
    # In eval mode BatchNorm (positive scale) and ReLU are increasing per channel, so max-pooling commutes with
    # them: the same weights compute the same function in either order.
    torch.manual_seed(0)
    for m in old.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1), m.running_var.uniform_(0.5, 2), m.weight.data.uniform_(0.5, 2)
    moved = {"1.": "2.", "5.": "6."}  # each block's norm, one place later
    first.load_state_dict({moved.get(k[:2], k[:2]) + k[2:]: v for k, v in old.state_dict().items()})
    x = torch.randn(3, 1, 28, 28)
    torch.testing.assert_close(first.eval()(x), old.eval()(x), rtol=1e-5, atol=1e-5)


def test_a_timm_network_gets_the_task_s_channels_and_classes():
    pytest.importorskip("timm", reason="timm is an optional extra: pip install 'hydralight[timm]'")
    net = build_net({"_target_": "hydralight.tasks.nets.timm_net", "name": "resnet18"}, 7, (1, 28, 28))
    assert net(torch.randn(2, 1, 28, 28)).shape == (2, 7)
    with pytest.raises(UserError, match="model.net.name=resnet1800 is not a timm model"):
        build_net({"_target_": "hydralight.tasks.nets.timm_net", "name": "resnet1800"}, 7, (1, 28, 28))


def test_a_network_argument_its_constructor_lacks_is_one_line_naming_where_it_came_from():
    with pytest.raises(UserError, match=r"model.net.dropout is not an argument of MLP .*came from model=cnn"):
        build_net({"_target_": "hydralight.tasks.nets.MLP", "dropout": 0.25}, 10, (1, 28, 28), origin="model=cnn")


def test_channels_last_computes_the_same_as_contiguous():
    torch.manual_seed(0)
    plain = Classifier(net={"_target_": "hydralight.tasks.nets.FastCNN"}).eval()
    nhwc = Classifier(net={"_target_": "hydralight.tasks.nets.FastCNN"}, channels_last=True).eval()
    nhwc.load_state_dict(plain.state_dict())
    assert nhwc.net[0].weight.is_contiguous(memory_format=torch.channels_last)
    x = torch.randn(4, 1, 28, 28)
    torch.testing.assert_close(nhwc(x), plain(x), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_resnet_preset_trains_a_few_steps(tiny_data, tmp_path):
    run = tmp_path / "run"
    result = run_cli([*TINY, "model=resnet", "trainer.limit_train_batches=2", "logger=none"], run, tiny_data)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((run / "results.json").read_text())["test/acc"] is not None


@pytest.mark.slow
def test_compiled_model_trains_alike_resumes_and_its_checkpoints_load_uncompiled(tiny_data, tmp_path):
    # The classic CNN: keyed dropout inside the compiled graph must draw the masks eager mode draws.
    base = [*TINY, "model=cnn", "logger=csv"]
    eager = run_cli(base, tmp_path / "eager", tiny_data)
    assert eager.returncode == 0, eager.stderr[-3000:]
    compiled = tmp_path / "compiled"
    first = run_cli([*base, "model.compile=true", "trainer.max_steps=2"], compiled, tiny_data)
    assert first.returncode == 0, first.stderr[-3000:]
    # The same run continued to 4 steps from its own last.ckpt, compiled again.
    second = run_cli([*base, "model.compile=true"], compiled, tiny_data)
    assert second.returncode == 0 and "continuing from this run's own" in second.stderr + second.stdout
    losses = {
        name: [float(r["train/loss_step"]) for r in csv_rows(tmp_path / name) if "train/loss_step" in r]
        for name in ("eager", "compiled")
    }
    assert len(losses["compiled"]) == len(losses["eager"]) == 4
    torch.testing.assert_close(losses["compiled"], losses["eager"], rtol=1e-4, atol=1e-4)
    # The compiled run's checkpoint evaluates in an uncompiled model to the accuracy it reported.
    reported = json.loads((compiled / "results.json").read_text())
    evaluated = run_cli(
        [*base, "mode=eval", f"ckpt_path={reported['best_checkpoint']}", "logger=none"], tmp_path / "eval", tiny_data
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert json.loads((tmp_path / "eval" / "results.json").read_text())["test/acc"] == reported["test/acc"]


def test_unknown_compile_mode_is_one_line(tmp_path):
    line = one_line(run_cli(["model.compile=true", "model.compile_mode=fastest", "--cfg", "job"], tmp_path))
    assert "model.compile_mode" in line
