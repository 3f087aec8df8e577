"""Randomness keyed by sample: the same masks and shifts for a sample whatever batch or rank carries it, a
BatchNorm over all ranks that equals one process's, and a report that names what breaks 1-vs-N equivalence."""

import os
import socket

import pytest
import torch
from torch import nn

from hydralight.keyed import (
    GlobalBatchNorm,
    SampleDropout,
    keyed,
    keyed_shift,
    sample_keys,
    uniform,
    with_sample_dropout,
)
from hydralight.tasks.classifier import Classifier
from hydralight.training.invariance import batchnorm_advice, invariance_report, make_invariant


def dropped(layer: nn.Module, x: torch.Tensor, ids: torch.Tensor, seed: int = 7, epoch: int = 0) -> torch.Tensor:
    with keyed(sample_keys(seed, epoch, ids)):
        return layer(x)


def test_a_sample_gets_the_same_mask_in_any_batch_on_any_rank():
    layer = SampleDropout(0.5, stream=1).train()
    ids = torch.randperm(1000)[:64]
    x = torch.ones(64, 8, 5, 5)
    whole = dropped(layer, x, ids)
    # Two ranks with 32 each, or 4 micro-batches of 16 in another order: row for row the same masks.
    halves = torch.cat([dropped(layer, x[:32], ids[:32]), dropped(layer, x[32:], ids[32:])])
    assert torch.equal(whole, halves)
    order = torch.randperm(64)
    shuffled = torch.cat([dropped(layer, x[order][i : i + 16], ids[order][i : i + 16]) for i in range(0, 64, 16)])
    assert torch.equal(whole[order], shuffled)


def test_masks_change_with_epoch_seed_layer_and_sample():
    x, ids = torch.ones(4, 256), torch.arange(4)
    base = dropped(SampleDropout(0.5, stream=1).train(), x, ids)
    assert not torch.equal(base[0], base[1])  # another sample
    assert not torch.equal(base, dropped(SampleDropout(0.5, stream=2).train(), x, ids))  # another layer
    assert not torch.equal(base, dropped(SampleDropout(0.5, stream=1).train(), x, ids, epoch=1))
    assert not torch.equal(base, dropped(SampleDropout(0.5, stream=1).train(), x, ids, seed=8))


def test_dropout_rate_and_scale():
    layer = SampleDropout(0.3, stream=1).train()
    out = dropped(layer, torch.ones(256, 1024), torch.arange(256))
    kept = (out != 0).float().mean().item()
    assert kept == pytest.approx(0.7, abs=0.01)
    assert out.mean().item() == pytest.approx(1.0, abs=0.02)  # expectation preserved
    assert torch.allclose(out[out != 0], torch.tensor(1 / 0.7))
    assert torch.equal(layer.eval()(torch.ones(3, 4)), torch.ones(3, 4))
    assert torch.equal(dropped(SampleDropout(1.0).train(), torch.ones(2, 3), torch.arange(2)), torch.zeros(2, 3))


def test_uniform_numbers_are_uniform_and_fixed():
    u = uniform(sample_keys(0, 0, torch.arange(64)), stream=3, n=4096)
    assert u.min() >= 0.0 and u.max() < 1.0
    assert u.mean().item() == pytest.approx(0.5, abs=0.005)
    hist = torch.histc(u, bins=10, min=0, max=1) / u.numel()
    assert (hist - 0.1).abs().max() < 0.005
    # The generator is a pure function: these values are what every machine and version computes.
    assert torch.equal(u, uniform(sample_keys(0, 0, torch.arange(64)), stream=3, n=4096))


def test_channel_dropout_drops_whole_channels():
    layer = with_sample_dropout(nn.Sequential(nn.Dropout2d(0.5))).train()
    assert isinstance(layer[0], SampleDropout) and layer[0].channels
    out = dropped(layer, torch.ones(8, 16, 4, 4), torch.arange(8))
    per_channel = out.flatten(2)
    assert torch.equal(per_channel.amin(2), per_channel.amax(2))  # each channel all kept or all dropped


def test_shift_is_keyed_by_sample_and_bounded():
    x = torch.zeros(6, 1, 28, 28)
    x[:, :, 13:15, 13:15] = 1.0  # a dot in the middle shows where each image moved
    keys = sample_keys(1, 0, torch.arange(6))
    shifted = keyed_shift(x, keys, max_shift=2, fill=0.0)
    assert torch.equal(shifted, torch.cat([keyed_shift(x[:3], keys[:3], 2, 0.0), keyed_shift(x[3:], keys[3:], 2, 0.0)]))
    moves = set()
    for image in shifted[:, 0]:
        rows, cols = image.nonzero(as_tuple=True)
        dy, dx = 13 - rows.min().item(), 13 - cols.min().item()
        assert abs(dy) <= 2 and abs(dx) <= 2 and image.sum() == 4
        moves.add((dy, dx))
    assert len(moves) > 1


def test_the_report_names_what_is_not_keyed():
    class Data:
        sample_ids = True
        shards_by_rank = True

    keyed_net = make_invariant(Classifier(net={"_target_": "hydralight.tasks.nets.SeedCNN"}), True, False)
    assert invariance_report(keyed_net, Data(), sync_batchnorm=False) == {"holds": True, "reasons": []}
    stock = Classifier(net={"_target_": "hydralight.tasks.nets.SeedCNN"})
    report = invariance_report(stock, Data(), sync_batchnorm=False)
    assert not report["holds"] and len(report["reasons"]) == 2 and "net.5 is torch's Dropout" in report["reasons"][0]
    bn = make_invariant(Classifier(net={"_target_": "hydralight.tasks.nets.FastCNN"}), True, False)
    assert "model.sync_batchnorm=true" in invariance_report(bn, Data(), sync_batchnorm=False)["reasons"][0]
    assert invariance_report(bn, Data(), sync_batchnorm=True)["holds"]
    # Accumulated micro-batches are normalized one by one, over every rank or not: the record said it held.
    for synced in (False, True):
        (accumulated,) = invariance_report(bn, Data(), sync_batchnorm=synced, accumulation=2)["reasons"]
        assert "each of the 2 micro-batches of a step apart" in accumulated and "batch.max_per_device" in accumulated
    assert invariance_report(keyed_net, Data(), sync_batchnorm=False, accumulation=4)["holds"]  # no BatchNorm
    unsharded = invariance_report(keyed_net, object(), sync_batchnorm=False)["reasons"]
    assert "no sample ids" in unsharded[0] and "does not shard by rank itself" in unsharded[1]

    from torchvision import transforms

    class Augmented(Data):
        def __init__(self):
            self.transform = transforms.Compose([transforms.RandomCrop(28, padding=2), transforms.ToTensor()])

    assert "torchvision's RandomCrop" in invariance_report(keyed_net, Augmented(), sync_batchnorm=False)["reasons"][0]


def _global_batchnorm_rank(rank: int, port: int, x: torch.Tensor, out: dict) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(0)
    layer = GlobalBatchNorm(3)
    part = x[rank * 4 : (rank + 1) * 4].clone().requires_grad_(True)
    y = layer(part)
    (y * torch.arange(y.numel()).view_as(y)).sum().backward()
    out[rank] = (y.detach(), part.grad, layer.weight.grad, layer.running_mean, layer.running_var)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # precision=bf16-mixed: statistics kept in float32
        low = GlobalBatchNorm(3)(torch.nn.functional.conv2d(part.detach(), torch.ones(3, 3, 1, 1)))
    out[f"bf16-{rank}"] = low.dtype
    dist.destroy_process_group()


@pytest.mark.slow
def test_global_batchnorm_over_two_ranks_equals_one_process():
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    x = torch.randn(8, 3, 5, 5, generator=torch.Generator().manual_seed(0)) * 3 + 1
    manager = mp.Manager()
    out = manager.dict()
    os.environ.pop("MASTER_ADDR", None)
    # Forked ranks: torch is already loaded here, and the layer is what is tested, not how ranks start.
    mp.start_processes(_global_batchnorm_rank, args=(port, x, out), nprocs=2, join=True, start_method="fork")
    one = nn.BatchNorm2d(3)
    whole = x.clone().requires_grad_(True)
    y = one(whole)
    (y * torch.cat([torch.arange(y[:4].numel()).view_as(y[:4])] * 2)).sum().backward()
    both = torch.cat([out[0][0], out[1][0]])
    assert torch.allclose(both, y.detach(), atol=1e-5)
    assert torch.allclose(torch.cat([out[0][1], out[1][1]]), whole.grad, atol=1e-4)
    # DDP sums (then averages) these. Gradients in the thousands, summed in another order on two ranks: float32
    # leaves differences of ~1e-7 of the terms, so the bound is relative (1e-5 of their size), not absolute.
    scale = (out[0][2].abs() + out[1][2].abs()).max()
    assert torch.allclose(out[0][2] + out[1][2], one.weight.grad, rtol=0, atol=1e-5 * float(scale))
    assert out["bf16-0"] == out["bf16-1"] == torch.bfloat16
    assert torch.allclose(out[0][3], one.running_mean, atol=1e-6) and torch.allclose(
        out[0][4], one.running_var, atol=1e-5
    )


def test_the_batchnorm_advice_is_one_reason_with_the_key_the_model_config_has():
    class Data:
        sample_ids = True
        shards_by_rank = True

    # A deep network: one reason however many BatchNorms, naming a few and counting the rest.
    deep = nn.Sequential(*[nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)) for _ in range(30)])
    reasons = invariance_report(deep, Data(), sync_batchnorm=False)["reasons"]
    assert reasons == ["30 BatchNorm layers (0.1, 1.1, 2.1 and 27 more) normalize each process's micro-batch; "
                       "set model.sync_batchnorm=true"]  # fmt: skip
    # The built-in options have the key; a LightningModule's own config does not, and is told to add it.
    assert batchnorm_advice({"net": {}, "sync_batchnorm": False}) == "set model.sync_batchnorm=true"
    own = batchnorm_advice({"_target_": "my_tasks.regression.Regressor", "hidden": 32})
    assert "+model.sync_batchnorm=true" in own and "set model.sync_batchnorm" not in own
    assert invariance_report(deep, Data(), sync_batchnorm=False, advice=own)["reasons"][0].endswith(own)
    assert invariance_report(deep, Data(), sync_batchnorm=True)["holds"]


@pytest.mark.parametrize(
    ("model", "keyed"), [("model=cnn", True), ("model=fastcnn_small", False), ("model=mlp", False)]
)
def test_only_a_module_with_keyed_dropout_gets_the_sample_keys_callback(tmp_path, model, keyed):
    # Lightning calls every callback at every hook of every step: one with nothing to do costs each step.
    from conftest import plan_of

    from hydralight.training.invariance import SampleKeys, has_sample_dropout
    from hydralight.training.trainer import build_callbacks

    plan = plan_of(model, run_dir=tmp_path / "run")
    net = {k: v for k, v in plan.config["model"]["net"].items()}
    module = make_invariant(Classifier(net=net), invariant_dropout=True, global_batchnorm=False)
    assert has_sample_dropout(module) is keyed
    callbacks = build_callbacks(plan, module, {})
    assert any(isinstance(c, SampleKeys) for c in callbacks) is keyed
