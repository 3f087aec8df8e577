"""strategy=fsdp: the plan, and real 2-process runs on CPU (gloo) with torch's FSDP2 under Lightning."""

import json
import re
import signal
from pathlib import Path

import pytest
import torch
from conftest import HELPERS, TINY, one_line, plan_of, run_cli

from hydralight.config.plan import Machine
from hydralight.errors import UserError

FSDP2 = [*TINY, "hardware.devices=2", "strategy=fsdp", "strategy.shard=[net]"]
GPU_BOX = Machine(gpus=4, gpu_name="H100", bf16=True, tf32=True, cpu_cores=32, memory_gb=256)


def results(run: Path) -> dict:
    return json.loads((run / "results.json").read_text())


def last(run: Path) -> dict:
    return torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)


def ok(result):
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
    return result


def test_the_plan_gives_fsdp_its_units_checkpoint_form_and_the_state_each_device_holds():
    plan = plan_of("hardware=cpu", "hardware.devices=2", "strategy=fsdp", "strategy.shard=[net]")
    options = plan.strategy_kwargs()
    assert options["shard"] == ["net"] and options["sharded_checkpoint"] is False
    assert options["process_group_backend"] == "gloo" and "find_unused_parameters" not in options
    rows = {key: value for _, key, value in plan.rows()}
    assert "1/2 of each unit (net.*, the root) per device; DDP: a full copy on each" in rows["state per device"]
    sharded = plan_of("hardware=cpu", "hardware.devices=2", "strategy=fsdp", "strategy.checkpoint=sharded")
    assert sharded.strategy_kwargs()["sharded_checkpoint"] is True
    on_gpus = plan_of("hardware=4gpu", "strategy=fsdp", "precision=bf16-mixed", machine=GPU_BOX)
    assert on_gpus.framework.backend == "nccl" and "1/4 of each" in on_gpus.table()
    assert "state per device" not in plan_of("hardware=cpu", "hardware.devices=2", "strategy=ddp").table()


@pytest.mark.parametrize(
    "overrides,says",
    [
        (["strategy=ddp", "strategy.shard=[net]"], "strategy.shard=['net'] is read by strategy=fsdp only"),
        (["strategy=ddp", "strategy.checkpoint=sharded"], "strategy.checkpoint=sharded is read by strategy=fsdp"),
        (["strategy=fsdp", "trainer.precision=64-true"], "strategy=fsdp does not train in precision=64-true"),
        (["strategy=fsdp", "strategy.shard=[net/0]"], "'net/0' is none"),
    ],
)
def test_settings_fsdp_cannot_run_are_refused(overrides, says):
    with pytest.raises(UserError, match=re.escape(says)):
        plan_of("hardware=cpu", "hardware.devices=2", *overrides)


def test_a_gpu_profile_prints_its_fsdp_plan(tmp_path):
    result = ok(run_cli(["hardware=4gpu", "strategy=fsdp", "strategy.shard=[net]", "plan=true"], tmp_path / "p"))
    assert re.search(r"strategy\s+│ fsdp", result.stdout), result.stdout
    assert "1/4 of each unit (net.*, the root) per device" in " ".join(result.stdout.replace("│", " ").split())
    assert not (tmp_path / "p").exists()


@pytest.mark.slow
def test_two_process_fsdp_trains_tests_and_writes_one_full_checkpoint(tiny_data, tmp_path):
    run = tmp_path / "run"
    result = ok(run_cli(FSDP2, run, tiny_data))
    log = (run / "train.log").read_text()
    assert "fsdp over 2 processes: strategy.shard: net.*, then the root Classifier" in log
    assert results(run)["metrics"]["test/samples"] == 200 and result.stdout.count("test/acc=") == 1
    # One file as DDP writes it: plain tensors under the module's own names, read by everything else.
    saved = last(run)
    assert all(type(t) is torch.Tensor for t in saved["state_dict"].values())
    evaluated = ok(run_cli([*TINY, "mode=eval", f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}"], tmp_path / "ev",
                           tiny_data))  # fmt: skip
    assert results(tmp_path / "ev")["metrics"]["test/acc"] == results(run)["metrics"]["test/acc"], evaluated.stdout


@pytest.mark.slow
def test_a_bad_shard_name_is_one_line(tiny_data, tmp_path):
    line = one_line(run_cli([*FSDP2, "strategy.shard=[network]"], tmp_path / "run", tiny_data))
    assert "strategy.shard=network is no submodule of Classifier" in line and "(its children: net" in line
    assert not (tmp_path / "run").exists()


def max_relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(
        ((a[k].double() - b[k].double()).abs().max() / a[k].double().abs().max().clamp_min(1e-12)).item() for k in a
    )


# 1 process without sharding vs 2 FSDP processes, 20 Adam steps in float32: the same samples and dropout masks,
# summed in another order (reduce-scatter of two halves). Measured on a 2-core CPU: cnn 6.2e-5 to 2.6e-3 over
# seeds 5-8, mlp 3.1e-5 at seed 5. The bound sits 7x above the largest and far below what different training
# gives (~1 with torch's dropout). fastcnn_small keeps its weights channels_last (FSDP takes them in the default
# layout); its BatchNorm over both ranks' samples, as over one process's: 7.9e-4 at seed 5.
@pytest.mark.slow
@pytest.mark.parametrize(
    "model,bound", [("cnn", 2e-2), ("mlp", 2e-2), ("fastcnn_small model.sync_batchnorm=true", 2e-2)]
)  # the last: channels_last
def test_one_process_and_two_fsdp_processes_train_the_same_network(model, bound, tiny_data, tmp_path):
    base = [a for a in TINY if not a.startswith("model=")] + [f"model={model.split()[0]}", *model.split()[1:]]
    steps = [*base, "trainer.limit_train_batches=null", "trainer.max_steps=20", "trainer.max_epochs=3", "seed=5"]
    one, two = tmp_path / "one", tmp_path / "two"
    ok(run_cli(steps, one, tiny_data))
    ok(run_cli([*steps, "hardware.devices=2", "strategy=fsdp", "strategy.shard=[net]"], two, tiny_data))
    for run in (one, two):
        assert results(run)["global_step"] == 20 and results(run)["metrics"]["test/samples"] == 200
    worst = max_relative_difference(last(one)["state_dict"], last(two)["state_dict"])
    with (tmp_path.parent / "fsdp_invariance.txt").open("a") as f:
        f.write(f"{model}: {worst:.3g}\n")
    assert worst < bound, worst


@pytest.mark.slow
def test_a_stopped_fsdp_run_continues_exactly(tiny_data, tmp_path):
    args = [*FSDP2, "model=cnn", "trainer.limit_train_batches=null", "trainer.max_steps=20", "trainer.max_epochs=3"]
    plain, cut = tmp_path / "plain", tmp_path / "cut"
    ok(run_cli(args, plain, tiny_data))
    stop = ["+callbacks.zz_signal._target_=signal_at.SignalAt", "+callbacks.zz_signal.step=6"]
    first = run_cli([*args, *stop], cut, tiny_data, PYTHONPATH=str(HELPERS))
    assert first.returncode == 128 + signal.SIGTERM, first.stderr[-2000:]
    assert 6 <= last(cut)["global_step"] < 20
    again = ok(run_cli(args, cut, tiny_data))
    assert "continuing from this run's own" in again.stdout + again.stderr
    a, b = last(plain), last(cut)
    assert a["global_step"] == b["global_step"] == 20
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])


@pytest.mark.slow
def test_a_sharded_checkpoint_is_a_folder_of_shards_tested_in_the_run_and_not_continued(tiny_data, tmp_path):
    run = tmp_path / "run"
    ok(run_cli([*FSDP2, "strategy.checkpoint=sharded"], run, tiny_data))
    folder = run / "checkpoints" / "last.ckpt"
    assert folder.is_dir() and (folder / "meta.pt").is_file() and len(list(folder.glob("*.distcp"))) == 2
    assert results(run)["metrics"]["test/samples"] == 200  # the best checkpoint, a folder too, was tested
    line = one_line(run_cli([*FSDP2, "strategy.checkpoint=sharded", "trainer.max_epochs=2"], run, tiny_data))
    assert "is a sharded checkpoint (strategy.checkpoint=sharded), which a run cannot continue from" in line
    # Nor can an evaluation or a prediction read it: said as such, not as a folder given for a file.
    for args in (
        ["mode=eval", f"ckpt_path={folder}"],
        ["mode=eval", f"resume={run}"],
        ["mode=predict", f"resume={run}"],
    ):
        said = one_line(run_cli([*TINY, *args], tmp_path / "other", tiny_data))
        assert "is a sharded checkpoint (a folder of per-rank shards, strategy.checkpoint=sharded)" in said, args
        assert "strategy.checkpoint=full" in said and not (tmp_path / "other").exists()


def state_megabytes(run: Path) -> tuple[list[float], float]:
    """The per-rank and full sizes of parameters + optimizer state an fsdp run logged after its first step."""
    line = next(x for x in (run / "train.log").read_text().splitlines() if "parameters + optimizer state" in x)
    ranks = [float(mb) for mb in re.findall(r"([\d.]+) MB on rank \d", line)]
    return ranks, float(re.search(r"each device: ([\d.]+) MB", line).group(1))


@pytest.mark.slow
def test_charlm_blocks_are_sharded_and_each_rank_holds_half_of_what_ddp_holds(tmp_path):
    text = tmp_path / "text.txt"
    words = [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "a",
        "lazy",
        "dog",
        "while",
        "the",
        "model",
        "learns",
        "to",
        "spell",
    ]
    text.write_text("\n".join(" ".join(words[(i * 7 + j) % len(words)] for j in range(10)) for i in range(300)))
    common = ["experiment=charlm", f"data.path={text}", "hardware=cpu", "hardware.devices=2", "trainer.max_steps=4",
              "trainer.max_epochs=1", "data.block_size=32", "batch.global_size=16"]  # fmt: skip
    fsdp, ddp = tmp_path / "fsdp", tmp_path / "ddp"
    ok(run_cli([*common, "strategy=fsdp", "strategy.shard=[blocks.layers]"], fsdp))
    ok(run_cli([*common, "strategy=ddp"], ddp))
    assert "strategy.shard: blocks.layers.*, then the root CharLM" in (fsdp / "train.log").read_text()
    ranks, full = state_megabytes(fsdp)
    # DDP keeps all of it on each rank: its checkpoint's parameters and optimizer state.
    saved = last(ddp)
    tensors = [*saved["state_dict"].values()]
    tensors += [v for s in saved["optimizer_states"][0]["state"].values() for v in s.values() if v.dim() > 0]
    ddp_mb = sum(t.numel() * t.element_size() for t in tensors) / 2**20
    assert full == pytest.approx(ddp_mb, abs=0.01)
    assert len(ranks) == 2 and all(mb == pytest.approx(ddp_mb / 2, abs=0.02) for mb in ranks), (ranks, ddp_mb)
    with (tmp_path.parent / "fsdp_memory.txt").open("a") as f:
        f.write(f"charlm: fsdp {ranks} MB per rank, ddp {ddp_mb:.2f} MB per rank\n")


@pytest.mark.slow
def test_a_module_with_its_own_configure_model_shards_itself(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("abcdefgh " * 400)
    args = ["experiment=charlm", "model._target_=own_sharding.SelfShardingCharLM", f"data.path={text}",
            "hardware=cpu", "hardware.devices=2", "strategy=fsdp", "trainer.max_steps=2", "trainer.max_epochs=1",
            "data.block_size=16", "model.width=16", "batch.global_size=8"]  # fmt: skip
    run = tmp_path / "run"
    ok(run_cli(args, run, PYTHONPATH=str(HELPERS)))
    log = (run / "train.log").read_text()
    assert "SelfShardingCharLM.configure_model shards the module (strategy.shard is not read)" in log
    assert "own configure_model sharded 2 blocks" in log


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fsdp", "ddp_spawn"])
def test_a_fixed_schedule_stretched_on_n_processes_is_one_line_before_training(strategy, tmp_path):
    """The refusal one process gives (a OneCycleLR of 4 steps continued to 8) holds where Lightning reads the
    checkpoint after setting up (fsdp) and where the ranks are spawned (ddp_spawn); the run is left as it was."""
    text = tmp_path / "text.txt"
    text.write_text("\n".join(" ".join(["the", "quick", "brown", "fox", "jumps"][(i + j) % 5] for j in range(10))
                              for i in range(300)))  # fmt: skip
    common = ["experiment=charlm", f"data.path={text}", "hardware=cpu", "hardware.devices=2", "data.block_size=32",
              "batch.global_size=16", f"strategy={strategy}"]  # fmt: skip
    run = tmp_path / "run"
    ok(run_cli([*common, "trainer.max_steps=4"], run))
    before = (run / "results.json").read_bytes(), (run / "checkpoints" / "last.ckpt").read_bytes()
    refused = run_cli([*common, "trainer.max_steps=8"], run)
    line = one_line(refused)
    assert "follows a OneCycleLR schedule of 4 steps and this run would take 8" in line
    assert refused.stderr.count("error: ") == 1 and "Traceback" not in refused.stderr
    assert ((run / "results.json").read_bytes(), (run / "checkpoints" / "last.ckpt").read_bytes()) == before


BUFFERS = """
import pytorch_lightning as pl
import torch


class Buffers(pl.Callback):
    def __init__(self, run_dir):
        self.run_dir = run_dir

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            saved = {name: b.detach().cpu().clone() for name, b in pl_module.named_buffers()}
            torch.save(saved, f"{self.run_dir}/buffers-{trainer.global_step}-{trainer.global_rank}.pt")
"""


@pytest.mark.slow
def test_fsdp_ranks_evaluate_with_the_batchnorm_statistics_the_checkpoint_holds(tiny_data, tmp_path):
    # Each rank's BatchNorm statistics follow its own batches under FSDP; the checkpoint holds rank 0's.
    (tmp_path / "buffers.py").write_text(BUFFERS)
    run = tmp_path / "run"
    args = [*FSDP2, "model=fastcnn", "trainer.limit_train_batches=null", "trainer.max_steps=8",
            "trainer.val_check_interval=4", "+callbacks.buffers._target_=buffers.Buffers"]  # fmt: skip
    ok(run_cli(args, run, tiny_data, PYTHONPATH=str(tmp_path)))
    for step in (4, 8):
        zero, one = (torch.load(run / f"buffers-{step}-{rank}.pt") for rank in (0, 1))
        stats = [name for name in zero if name.endswith("running_var")]
        assert stats and all(not torch.equal(zero[name], torch.ones_like(zero[name])) for name in stats)
        assert all(torch.equal(zero[name], one[name]) for name in zero), step
    saved = last(run)["state_dict"]
    assert all(torch.equal(saved[name], value) for name, value in torch.load(run / "buffers-8-0.pt").items())
