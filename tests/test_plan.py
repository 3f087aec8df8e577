import math

import pytest
from hydra import compose, initialize_config_dir

from hydralight.errors import UserError
from hydralight.plan import Machine, check_plan, make_plan
from hydralight.train import CONFIG_DIR

CPU_BOX = Machine(gpus=0, cpu_cores=2, memory_gb=24)
H100_BOX = Machine(gpus=8, gpu_name="NVIDIA H100", bf16=True, tf32=True, cpu_cores=96, memory_gb=2000)
T4_BOX = Machine(gpus=1, gpu_name="Tesla T4", bf16=False, tf32=False, cpu_cores=8, memory_gb=64)
PROFILES = {"cpu": 1, "1gpu": 1, "4gpu": 4, "8gpu": 8, "2x8gpu": 16}


def config(*overrides: str):
    with initialize_config_dir(CONFIG_DIR, version_base="1.3"):
        return compose("train", overrides=list(overrides))


@pytest.mark.parametrize("profile,world", PROFILES.items())
@pytest.mark.parametrize("cap", [None, 8, 32])
def test_global_batch_is_invariant(profile, world, cap):
    overrides = [f"hardware={profile}", "batch.global_size=256"]
    if cap:
        overrides.append(f"batch.max_per_device={cap}")
    plan = make_plan(config(*overrides), H100_BOX)
    task = plan.task
    assert plan.hardware.world_size == world
    assert task.per_device_size * world * task.accumulation == 256
    if cap:
        assert task.per_device_size <= cap
    else:
        assert task.accumulation == 1


def test_profiles_resolve_on_a_pretend_machine():
    plan = make_plan(config("hardware=8gpu", "precision=bf16-mixed"), H100_BOX)
    assert (plan.hardware.accelerator, plan.hardware.devices, plan.hardware.gpus_per_node) == ("gpu", 8, 8)
    assert (plan.framework.strategy, plan.framework.backend) == ("ddp", "nccl")
    assert plan.framework.matmul_precision == "high"
    assert plan.framework.env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert plan.task.pin_memory is False  # the tensor loader has no host batches to pin
    check_plan(plan, H100_BOX)
    two_nodes = make_plan(config("hardware=2x8gpu"), H100_BOX)
    assert (two_nodes.hardware.num_nodes, two_nodes.hardware.world_size) == (2, 16)


def test_auto_hardware_follows_the_machine():
    assert make_plan(config(), CPU_BOX).hardware.accelerator == "cpu"
    gpu = make_plan(config(), H100_BOX)
    assert (gpu.hardware.accelerator, gpu.hardware.devices, gpu.framework.strategy) == ("gpu", 8, "ddp")
    cpu2 = make_plan(config("hardware=cpu", "hardware.devices=2"), CPU_BOX)
    assert (cpu2.framework.strategy, cpu2.framework.backend, cpu2.hardware.cpus_per_task) == ("ddp", "gloo", 1)
    single = make_plan(config("hardware=cpu"), CPU_BOX)
    assert (single.framework.strategy, single.framework.backend) == ("auto", None)


@pytest.mark.parametrize("rule,factor", [("none", 1.0), ("linear", 4.0), ("sqrt", 2.0)])
def test_learning_rate_scaling(rule, factor):
    plan = make_plan(
        config("optim.lr=0.001", f"optim.lr_scaling={rule}", "batch.global_size=512", "batch.reference_size=128"),
        CPU_BOX,
    )
    assert math.isclose(plan.task.lr, 0.001 * factor)


def test_loader_workers_never_exceed_a_process_cores():
    plan = make_plan(config("hardware=4gpu", "data.loader=torchvision", "hardware.cpus_per_task=6"), H100_BOX)
    assert plan.task.num_workers == 5 and plan.task.persistent_workers and plan.task.pin_memory
    cpu = make_plan(config("hardware=cpu", "data.loader=torchvision"), CPU_BOX)
    assert cpu.task.num_workers == 1 and not cpu.task.pin_memory
    assert make_plan(config("hardware=cpu"), CPU_BOX).task.num_workers == 0


@pytest.mark.parametrize(
    "overrides,machine,message",
    [
        (["hardware=4gpu"], CPU_BOX, "asks for 4 GPU.* has no CUDA GPU; use hardware=auto or hardware=cpu"),
        (["hardware=4gpu"], T4_BOX, "has 1 GPU.*hardware.devices=1"),
        (["hardware=1gpu", "precision=bf16-mixed"], T4_BOX, "Tesla T4 has no bfloat16"),
        (["hardware=cpu", "precision=16-mixed"], CPU_BOX, "precision=16-mixed needs a CUDA GPU"),
        (["hardware=2x8gpu"], H100_BOX, "num_nodes=2 needs a launcher"),
    ],
)
def test_machine_checks(overrides, machine, message):
    with pytest.raises(UserError, match=message):
        check_plan(make_plan(config(*overrides), machine), machine)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["hardware=8gpu", "batch.global_size=100"], "not divisible by world size 8"),
        (["hardware=8gpu", "batch.global_size=4"], "smaller than the 8 processes"),
        (["batch.global_size=0"], "batch.global_size=0 must be a positive integer"),
        (["batch.global_size=-32"], "batch.global_size=-32 must be a positive integer"),
        (["optim.lr=0"], "optim.lr=0.0 must be positive"),
        (["hardware=8gpu", "batch.global_size=20", "batch.max_per_device=2"], "cannot be split"),
    ],
)
def test_bad_task_settings(overrides, message):
    with pytest.raises(UserError, match=message):
        make_plan(config(*overrides), H100_BOX)


def test_plan_table_lists_all_three_layers():
    text = make_plan(config("hardware=8gpu", "batch.global_size=512", "batch.max_per_device=32"), H100_BOX).table()
    for expected in ("hardware", "framework", "task", "per_device_size", "32", "accumulation", "nccl"):
        assert expected in text


@pytest.mark.parametrize(
    ("override", "said"),
    [("optim.lr=abc", "optim.lr=abc is not a number"), ("seed=notanumber", "seed=notanumber is not an integer")],
)
def test_values_of_the_wrong_type_are_one_line(tiny_data, tmp_path, override, said):
    from conftest import TINY, one_line, run_cli

    line = one_line(run_cli([*TINY, override], tmp_path / "run", tiny_data))
    assert said in line and not (tmp_path / "run").exists()


def test_printing_the_config_refuses_a_wrong_value_too(tmp_path):
    from conftest import one_line, run_cli

    assert "optim.lr=abc is not a number" in one_line(run_cli(["--cfg", "job", "optim.lr=abc"], tmp_path / "run"))
    assert run_cli(["--cfg", "job", "optim.lr=0.1"], tmp_path / "run").returncode == 0


def test_every_plan_field_reaches_a_consumer():
    """The consumer mappings live on the Plan; a field none of them reads is a field some consumer misses."""
    from dataclasses import fields, replace

    from hydralight.plan import DERIVED, Plan, apply_plan

    read: set[str] = set()

    class Spy:
        def __init__(self, layer, name):
            self._layer, self._name = layer, name

        def __getattr__(self, key):
            read.add(f"{self._name}.{key}")
            return getattr(self._layer, key)

    plan = make_plan(config("hardware=4gpu", "strategy=ddp", "batch.num_workers=2"), H100_BOX)
    spy = replace(plan)
    for layer in fields(Plan):
        object.__setattr__(spy, layer.name, Spy(getattr(plan, layer.name), layer.name))
    spy.trainer_kwargs(), spy.data_kwargs(), spy.model_kwargs(), spy.strategy_kwargs()
    spy.slurm_resources(), spy.dstack_resources(16)
    apply_plan(spy, seed=0)
    every = {f"{layer.name}.{f.name}" for layer in fields(Plan) for f in fields(getattr(plan, layer.name))}
    assert every - read - set(DERIVED) == set(), "plan fields that no consumer reads"
    assert read & set(DERIVED) == set(), "a DERIVED field is read by a consumer: remove it from DERIVED"


@pytest.mark.parametrize(
    "profile,resources",
    [
        ("1gpu", {"nodes": 1, "tasks_per_node": 1, "gpus_per_node": 1, "cpus_per_task": 8, "mem_gb": 64}),
        ("4gpu", {"nodes": 1, "tasks_per_node": 4, "gpus_per_node": 4, "cpus_per_task": 8, "mem_gb": 256}),
        ("2x8gpu", {"nodes": 2, "tasks_per_node": 8, "gpus_per_node": 8, "cpus_per_task": 12, "mem_gb": 512}),
    ],
)
def test_a_job_elsewhere_is_sized_by_its_profile_alone(profile, resources):
    from hydralight.plan import plan_elsewhere

    assert plan_elsewhere(config(f"hardware={profile}")).slurm_resources() == resources


@pytest.mark.parametrize(
    "overrides,fields",
    [
        (["hardware=auto"], "hardware.accelerator, hardware.devices, hardware.cpus_per_task, hardware.mem_gb"),
        (["hardware=cpu", "hardware.devices=2"], "hardware.cpus_per_task, hardware.mem_gb"),
        (["hardware=1gpu", "hardware.mem_gb=auto"], "hardware.mem_gb cannot be auto"),
    ],
)
def test_a_job_elsewhere_refuses_auto_naming_the_field(overrides, fields):
    from hydralight.plan import plan_elsewhere

    with pytest.raises(UserError, match=fields):
        plan_elsewhere(config(*overrides))
