"""The resource layers of the run plan: hardware -> framework -> task, resolved in-process on pretend machines."""

import math
import re
from dataclasses import fields

import pytest
from conftest import compose_config, plan_of

from hydralight.config.plan import FrameworkPlan, HardwarePlan, Machine, RunPlan, TaskPlan
from hydralight.config.resolve import check_plan, resources, resources_elsewhere
from hydralight.errors import UserError

CPU_BOX = Machine(gpus=0, cpu_cores=2, memory_gb=24)
H100_BOX = Machine(gpus=8, gpu_name="NVIDIA H100", bf16=True, tf32=True, cpu_cores=96, memory_gb=2000)
T4_BOX = Machine(gpus=1, gpu_name="Tesla T4", bf16=False, tf32=False, cpu_cores=8, memory_gb=64)
PROFILES = {"cpu": 1, "1gpu": 1, "4gpu": 4, "8gpu": 8, "2x8gpu": 16}


def layers(*overrides: str, machine: Machine = H100_BOX) -> tuple[HardwarePlan, FrameworkPlan, TaskPlan]:
    return resources(compose_config(*overrides), machine)


@pytest.mark.parametrize("profile,world", PROFILES.items())
@pytest.mark.parametrize("cap", [None, 8, 32])
def test_global_batch_is_invariant(profile, world, cap):
    overrides = [f"hardware={profile}", "batch.global_size=256"]
    if cap:
        overrides.append(f"batch.max_per_device={cap}")
    hardware, _, task = layers(*overrides)
    assert hardware.world_size == world
    assert task.per_device_size * world * task.accumulation == 256
    if cap:
        assert task.per_device_size <= cap
    else:
        assert task.accumulation == 1


def test_profiles_resolve_on_a_pretend_machine():
    plan = plan_of("hardware=8gpu", "precision=bf16-mixed", machine=H100_BOX)
    assert (plan.hardware.accelerator, plan.hardware.devices, plan.hardware.gpus_per_node) == ("gpu", 8, 8)
    assert (plan.framework.strategy, plan.framework.backend) == ("ddp", "nccl")
    assert plan.framework.matmul_precision == "high"
    assert plan.framework.env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert plan.task.pin_memory is False  # the tensor loader has no host batches to pin
    check_plan(plan, H100_BOX)
    two_nodes, *_ = layers("hardware=2x8gpu")
    assert (two_nodes.num_nodes, two_nodes.world_size) == (2, 16)


def test_auto_hardware_follows_the_machine():
    assert layers(machine=CPU_BOX)[0].accelerator == "cpu"
    hardware, framework, _ = layers()
    assert (hardware.accelerator, hardware.devices, framework.strategy) == ("gpu", 8, "ddp")
    hardware, framework, _ = layers("hardware=cpu", "hardware.devices=2", machine=CPU_BOX)
    assert (framework.strategy, framework.backend, hardware.cpus_per_task) == ("ddp", "gloo", 1)
    _, framework, _ = layers("hardware=cpu", machine=CPU_BOX)
    assert (framework.strategy, framework.backend) == ("auto", None)


@pytest.mark.parametrize("rule,factor", [("none", 1.0), ("linear", 4.0), ("sqrt", 2.0)])
def test_learning_rate_scaling(rule, factor):
    overrides = ("optim.lr=0.001", f"optim.lr_scaling={rule}", "batch.global_size=512", "batch.reference_size=128")
    plan = plan_of(*overrides, machine=CPU_BOX)
    assert math.isclose(plan.task.lr, 0.001 * factor)
    assert math.isclose(plan.model.offered["lr"], 0.001 * factor)  # what the module's constructor gets


def test_loader_workers_never_exceed_a_process_cores():
    _, _, task = layers("hardware=4gpu", "data.loader=torchvision", "hardware.cpus_per_task=6")
    assert task.num_workers == 5 and task.persistent_workers and task.pin_memory
    _, _, task = layers("hardware=cpu", "data.loader=torchvision", machine=CPU_BOX)
    assert task.num_workers == 1 and not task.pin_memory
    assert layers("hardware=cpu", machine=CPU_BOX)[2].num_workers == 0


@pytest.mark.parametrize(
    "overrides,machine,message",
    [
        (["hardware=4gpu"], CPU_BOX, "asks for 4 GPU.* has no CUDA GPU; use hardware=auto or hardware=cpu"),
        (["hardware=4gpu"], T4_BOX, "has 1 GPU.*hardware.devices=1"),
        (["hardware=1gpu", "precision=bf16-mixed"], T4_BOX, "Tesla T4 has no bfloat16"),
        (["hardware=cpu", "precision=16-mixed"], CPU_BOX, "precision=16-mixed needs a CUDA GPU"),
        (["hardware=2x8gpu"], H100_BOX, "num_nodes=2 needs a launcher"),
        (
            ["hardware=cpu", "hardware.devices=64"],
            CPU_BOX,
            r"^hardware.devices=64 starts 64 processes on a machine with 2 CPU core\(s\); use hardware.devices=2 or "
            r"fewer, or hardware.oversubscribe=true",
        ),
        (
            ["hardware=cpu", "hardware.devices=64", "hardware.oversubscribe=true"],
            CPU_BOX,
            r"^hardware.devices=64 needs at least 28.8 GB of memory \(0.45 GB per process\) but this machine has "
            r"24 GB; use hardware.devices=53 or fewer$",
        ),
        (
            ["hardware=cpu", "hardware.devices=2", "hardware.mem_gb=0.5"],
            CPU_BOX,
            r"^hardware.devices=2 needs at least 0.9 GB .* but hardware.mem_gb=0.5 gives 0.5 GB; use "
            r"hardware.devices=1 or fewer, or raise hardware.mem_gb to 1$",
        ),
        (["hardware=8gpu"], Machine(gpus=8, bf16=True, tf32=True, cpu_cores=16, memory_gb=3), "needs at least 3.6 GB"),
        (
            ["hardware=cpu", "hardware.cpus_per_task=64"],
            CPU_BOX,
            r"^hardware.cpus_per_task=64 x 1 process\(es\) asks for 64 CPU cores on a machine with 2; use "
            r"hardware.cpus_per_task=2 or auto, or hardware.oversubscribe=true",
        ),
        (["hardware=cpu", "hardware.devices=2", "hardware.cpus_per_task=2"], CPU_BOX, "asks for 4 CPU cores"),
    ],
)
def test_machine_checks(overrides, machine, message):
    with pytest.raises(UserError, match=message):
        check_plan(plan_of(*overrides, machine=machine), machine)


@pytest.mark.parametrize(
    "overrides",
    [
        ["hardware=cpu", "hardware.devices=2", "strategy=ddp"],  # as many processes as cores
        ["hardware=cpu", "hardware.devices=8", "hardware.oversubscribe=true"],  # more, knowingly
        ["hardware=cpu", "hardware.devices=2", "hardware.mem_gb=1"],
        ["hardware=cpu", "hardware.cpus_per_task=1"],  # fewer cores than the machine has: torch is held to them
        ["hardware=cpu", "hardware.cpus_per_task=8", "hardware.oversubscribe=true"],
    ],
)
def test_what_the_machine_holds_is_accepted(overrides):
    check_plan(plan_of(*overrides, machine=CPU_BOX), CPU_BOX)


def test_cores_are_counted_per_cpu_process_only():
    box = Machine(gpus=4, bf16=True, tf32=True, cpu_cores=2, memory_gb=64)  # GPU ranks mostly wait on their GPU
    check_plan(plan_of("hardware=4gpu", machine=box), box)
    # A GPU profile's cpus_per_task (4gpu: 8 each) is a scheduler's request; torch is held to the cores found.
    check_plan(plan_of("hardware=4gpu", "hardware.cpus_per_task=64", machine=box), box)


def test_a_slurm_task_is_checked_against_its_request(monkeypatch):
    """A SLURM task sees only the cores it was given and the whole node's memory: its request (8 tasks, 1 core
    each, hardware.mem_gb) is what counts, not what the task sees."""
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "8")
    task_sees = Machine(cpu_cores=1, memory_gb=512)
    request = ("hardware=cpu", "hardware.devices=8", "hardware.cpus_per_task=1")
    check_plan(plan_of(*request, "hardware.mem_gb=8", machine=task_sees), task_sees)
    with pytest.raises(UserError, match=r"needs at least 3.6 GB .* hardware.mem_gb=2 gives 2 GB; use hardware.dev"):
        check_plan(plan_of(*request, "hardware.mem_gb=2", machine=task_sees), task_sees)


@pytest.mark.slow
def test_a_run_the_machine_cannot_hold_is_one_line_and_plan_true_still_prints(tiny_data, tmp_path):
    """4096 CPU processes: more than any machine's cores, and 1843 GB at the floor per process. `plan=true` plans
    without the machine, so it prints the plan."""
    from conftest import TINY, one_line, run_cli

    many = [*TINY, "hardware.devices=4096", "batch.global_size=4096"]
    line = one_line(run_cli(many, tmp_path / "run", tiny_data))
    assert re.match(r"error: hardware.devices=4096 starts 4096 processes on a machine with \d+ CPU core", line), line
    assert "hardware.oversubscribe=true" in line and not (tmp_path / "run").exists()
    line = one_line(run_cli([*many, "hardware.oversubscribe=true"], tmp_path / "run", tiny_data))
    assert "hardware.devices=4096 needs at least 1843.2 GB of memory (0.45 GB per process)" in line, line
    assert not (tmp_path / "run").exists()
    printed = run_cli([*many, "plan=true"], tmp_path / "run", tiny_data)
    assert printed.returncode == 0 and "Run plan" in printed.stdout, printed.stderr[-2000:]


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["hardware=8gpu", "batch.global_size=100"], "not divisible by world size 8"),
        (["hardware=8gpu", "batch.global_size=4"], "smaller than the 8 processes"),
        (["batch.global_size=0"], "batch.global_size=0 must be a positive integer"),
        (["batch.global_size=-32"], "batch.global_size=-32 must be a positive integer"),
        (["optim.lr=0"], "optim.lr=0.0 must be a positive number"),
        (["hardware=8gpu", "batch.global_size=20", "batch.max_per_device=2"], "cannot be split"),
    ],
)
def test_bad_task_settings(overrides, message):
    with pytest.raises(UserError, match=message):
        layers(*overrides)


def test_plan_table_lists_the_layers_and_what_the_run_builds():
    text = plan_of("hardware=8gpu", "batch.global_size=512", "batch.max_per_device=32", machine=H100_BOX).table()
    for expected in ("hardware", "framework", "task", "per_device_size", "32", "accumulation", "nccl", "run",
                     "Classifier", "MNISTDataModule", "max val/acc"):  # fmt: skip
        assert expected in text


@pytest.mark.parametrize(
    ("override", "said"),
    [("optim.lr=abc", "optim.lr=abc is not a number"), ("seed=notanumber", "seed=notanumber is not an integer")],
)
def test_values_of_the_wrong_type_are_one_line(tiny_data, tmp_path, override, said):
    from conftest import TINY, one_line, run_cli

    line = one_line(run_cli([*TINY, override], tmp_path / "run", tiny_data))
    assert said in line and not (tmp_path / "run").exists()


# Values of the right type that cannot run: each refused in the plan, before anything is written.
OUT_OF_RANGE = [
    ("trainer.max_epochs=-5", "trainer.max_epochs=-5 is out of range: use -1 (no limit) or an integer >= 1"),
    ("trainer.max_epochs=0", "trainer.max_epochs=0 is out of range"),
    ("trainer.max_steps=0", "trainer.max_steps=0 is out of range: use -1 (no limit) or an integer >= 1"),
    ("trainer.min_steps=-2", "trainer.min_steps=-2 is out of range"),
    ("trainer.limit_train_batches=1.5", "trainer.limit_train_batches=1.5 is out of range"),
    ("trainer.limit_train_batches=0", "trainer.limit_train_batches=0 trains nothing; give a number of batches >= 1"),
    ("trainer.limit_train_batches=0.0", "trainer.limit_train_batches=0.0 trains nothing"),
    ("data.data_dir=", "data.data_dir is empty; give it a folder, or leave it out to use DATA_DIR (else ./data)"),
    # The best checkpoint in the objective's direction: a loss maximised would keep (and test) the worst.
    (
        "objective.metric=val/loss",
        "objective.metric=val/loss is maximised (objective.direction=max): the run would "
        "keep its highest val/loss as its best; add objective.direction=min",
    ),
    # Errors by their short names (the docs' own val/mse): the worst checkpoint was kept without a word.
    ("objective.metric=val/mse", "objective.metric=val/mse is maximised (objective.direction=max)"),
    ("objective.metric=val_nll", "objective.metric=val_nll is maximised"),
    ("objective.metric=val/bits_per_char", "objective.metric=val/bits_per_char is maximised"),
    (
        "callbacks.model_checkpoint.monitor=val/loss",
        "callbacks.model_checkpoint.monitor=val/loss differs from "
        "objective.metric=val/acc, which chooses the best checkpoint (and what a sweep tunes on); set "
        "objective.metric=val/loss objective.direction=min instead",
    ),
    ("callbacks.model_checkpoint.mode=min", "callbacks.model_checkpoint.mode=min differs from objective.direction=max"),
    ("trainer.limit_val_batches=-1", "trainer.limit_val_batches=-1 is out of range"),
    ("trainer.val_check_interval=0", "trainer.val_check_interval=0 is out of range"),
    ("trainer.check_val_every_n_epoch=0", "trainer.check_val_every_n_epoch=0 is out of range"),
    ("trainer.num_sanity_val_steps=-3", "trainer.num_sanity_val_steps=-3 is out of range"),
    ("trainer.log_every_n_steps=0", "trainer.log_every_n_steps=0 is out of range"),
    ("trainer.gradient_clip_val=-1", "trainer.gradient_clip_val=-1.0 is out of range"),
    ("+trainer.gradient_clip_algorithm=l2", "trainer.gradient_clip_algorithm=l2 is not allowed; use norm or value"),
    (
        "logger=wandb logger.wandb.mode=ofline",
        "logger.wandb.mode=ofline is not allowed; use one of auto, online, offline",
    ),
    ("trainer.max_time=abc", "trainer.max_time=abc is not a duration: use DD:HH:MM:SS"),
    ("trainer.max_time=1:00:00", "trainer.max_time=1:00:00 is not a duration"),
    ("trainer.max_time={secs:5}", "trainer.max_time={'secs': 5} is not a duration"),
    ("trainer.max_time={hours:-1}", "trainer.max_time={'hours': -1} is not a duration"),
    ("data.max_shift=-1", "data.max_shift=-1 is out of range"),
    ("data.val_size=-10", "data.val_size=-10 is out of range"),
    ("model.label_smoothing=1.0", "model.label_smoothing=1.0 is out of range"),
    ("model.label_smoothing=-0.1", "model.label_smoothing=-0.1 is out of range"),
    ("optim.optimizer.weight_decay=-0.01", "optim.optimizer.weight_decay=-0.01 is out of range"),
    ("seed=-1", "seed=-1 must be an integer from 0 to 2**32-1"),
    ("batch.eval_size=0", "batch.eval_size=0 must be a positive integer"),
    ("hardware.devices=0", "hardware.devices=0 must be a positive integer or auto"),
    (
        "batch.accumulation=2 batch.max_per_device=16",
        "batch.accumulation=2 gives each device 64 a micro-batch, "
        "above batch.max_per_device=16; give one of them (batch.max_per_device alone picks the accumulation)",
    ),
]


@pytest.mark.parametrize("overrides", [["hardware.accelerator=gpu"], ["hardware=1gpu", "hardware.devices=auto"],
                                       ["hardware=4gpu", "hardware.devices=-1"]])  # fmt: skip
def test_every_gpu_of_a_machine_without_any_is_said_as_such_not_as_zero_devices(overrides):
    with pytest.raises(UserError, match=r"^hardware.accelerator=gpu with hardware.devices=(auto|-1) takes every GPU "
                                        r"of this machine, which has none; use hardware=cpu or hardware=auto"):  # fmt: skip
        plan_of(*overrides, machine=CPU_BOX)


def test_half_precision_on_cpu_is_refused_by_the_plan_whatever_the_machine():
    """`plan=true` printed the plan that every run refuses: the choice of CPU is the config's, not the machine's."""
    with pytest.raises(UserError, match=r"^precision=16-mixed needs a CUDA GPU"):
        layers("hardware=cpu", "precision=16-mixed", machine=H100_BOX)
    assert plan_of("hardware=cpu", "batch.accumulation=2", "batch.max_per_device=64").task.accumulation == 2


@pytest.mark.parametrize(("override", "said"), OUT_OF_RANGE)
def test_values_out_of_range_are_refused_in_the_plan(override, said):
    with pytest.raises(UserError, match=re.escape(said)):
        plan_of(*override.split())


@pytest.mark.parametrize("budget", ["00:12:00:00", "2:00:30:00", "{hours:12,minutes:30}", "{seconds:90.5}", "null"])
def test_durations_lightning_reads_are_taken(budget):
    plan_of(f"trainer.max_time={budget}")


def test_out_of_range_and_a_file_for_a_folder_leave_no_run_dir(tiny_data, tmp_path):
    from conftest import TINY, one_line, run_cli

    line = one_line(run_cli([*TINY, "trainer.max_epochs=-5"], tmp_path / "run", tiny_data))
    assert "trainer.max_epochs=-5 is out of range" in line and not (tmp_path / "run").exists()
    a_file = tmp_path / "mnist.tar"
    a_file.write_text("not a folder")
    line = one_line(run_cli(TINY, tmp_path / "run", a_file))
    assert f"data.data_dir={a_file} is a file, not a folder" in line and not (tmp_path / "run").exists()


def test_printing_the_config_refuses_a_wrong_value_too(tmp_path):
    from conftest import one_line, run_cli

    assert "optim.lr=abc is not a number" in one_line(run_cli(["--cfg", "job", "optim.lr=abc"], tmp_path / "run"))
    assert run_cli(["--cfg", "job", "optim.lr=0.1"], tmp_path / "run").returncode == 0


# Resource fields that decide other fields of the plan, shown in its table, not read by a builder themselves.
DERIVED = {"hardware.world_size", "task.base_lr", "task.lr_scaling"}


def test_every_resource_field_reaches_a_consumer():
    """Every field of the resource layers is read where the run is built: the slices the resolver makes
    from them (trainer, data, model), the DDP strategy, the process settings, the SLURM and dstack
    requests. A field none of them reads is one some consumer misses."""
    from hydralight.config import resolve as resolver

    read: set[str] = set()

    class Spy:
        def __init__(self, layer, name):
            self._layer, self._name = layer, name

        def __getattr__(self, key):
            read.add(f"{self._name}.{key}")
            return getattr(self._layer, key)

    cfg = compose_config("hardware=4gpu", "strategy=ddp", "batch.num_workers=2")
    hw, fw, task = (
        Spy(layer, name)
        for layer, name in zip(resources(cfg, H100_BOX), ("hardware", "framework", "task"), strict=True)
    )
    from omegaconf import OmegaConf

    c = OmegaConf.create(resolver.as_container(cfg))
    job = resolver.JobInfo(run_dir="/nonexistent/run")
    resolver._trainer(c, hw, fw, task, job.run_dir), resolver._data(c, task, job), resolver._model(c, task, job)
    plan = plan_of("hardware=4gpu", "strategy=ddp", machine=H100_BOX)
    spied = plan.replace(hardware=hw, framework=fw, task=task)
    spied.strategy_kwargs(), spied.global_batchnorm
    HardwarePlan.slurm_resources(hw), HardwarePlan.dstack_resources(hw, 16)
    _consumed = (fw.env, fw.matmul_precision, task.global_size)  # machine.apply and the throughput record
    every = {f"{layer}.{f.name}" for layer, kind in (("hardware", HardwarePlan), ("framework", FrameworkPlan),
                                                      ("task", TaskPlan)) for f in fields(kind)}  # fmt: skip
    assert every - read - DERIVED == set(), "plan fields that no consumer reads"
    assert {f.name for f in fields(RunPlan)} >= {"model", "data", "trainer", "callbacks", "loggers", "paths", "resume"}


@pytest.mark.parametrize(
    "profile,request_",
    [
        ("1gpu", {"nodes": 1, "tasks_per_node": 1, "gpus_per_node": 1, "cpus_per_task": 8, "mem_gb": 64}),
        ("4gpu", {"nodes": 1, "tasks_per_node": 4, "gpus_per_node": 4, "cpus_per_task": 8, "mem_gb": 256}),
        ("2x8gpu", {"nodes": 2, "tasks_per_node": 8, "gpus_per_node": 8, "cpus_per_task": 12, "mem_gb": 512}),
    ],
)
def test_a_job_elsewhere_is_sized_by_its_profile_alone(profile, request_):
    assert resources_elsewhere(compose_config(f"hardware={profile}"))[0].slurm_resources() == request_


@pytest.mark.parametrize(
    "overrides,named",
    [
        (["hardware=auto"], "hardware.accelerator, hardware.devices, hardware.cpus_per_task, hardware.mem_gb"),
        (["hardware=cpu", "hardware.devices=2"], "hardware.cpus_per_task, hardware.mem_gb"),
        (["hardware=1gpu", "hardware.mem_gb=auto"], "hardware.mem_gb cannot be auto"),
    ],
)
def test_a_job_elsewhere_refuses_auto_naming_the_field(overrides, named):
    with pytest.raises(UserError, match=named):
        resources_elsewhere(compose_config(*overrides))


@pytest.mark.parametrize(
    "overrides,epochs",
    [
        ((), 2),  # no budget given: the project's default length
        (("trainer.max_steps=20",), -1),  # a step budget alone is the budget, as in plain Lightning
        (("trainer.max_time=00:00:01:00",), -1),
        (("trainer.max_steps=20", "trainer.max_epochs=1"), 1),  # both given: whichever comes first
        (("experiment=fast", "trainer.max_steps=20"), 1),  # a preset's epochs are a budget given too
    ],
)
def test_the_epoch_default_never_binds_a_step_budget_given_alone(overrides, epochs):
    assert plan_of(*overrides).trainer["max_epochs"] == epochs


def test_training_batch_counts_are_optimizer_steps_whatever_the_accumulation():
    accumulated = plan_of("batch.max_per_device=32", "trainer.val_check_interval=5", "trainer.limit_train_batches=7")
    assert accumulated.task.accumulation == 4
    assert accumulated.trainer["val_check_interval"] == 20 and accumulated.trainer["limit_train_batches"] == 28
    overfit = plan_of("batch.max_per_device=32", "debug=overfit")  # the same 4 global batches, not 1
    assert overfit.trainer["overfit_batches"] == 16
    # A fraction of the epoch is one of micro-batches to Lightning: the last step would take part of a batch; a
    # validation (and the best checkpoint, which a continuation starts from) would fall inside a step.
    for key in ("limit_train_batches", "val_check_interval", "overfit_batches"):
        with pytest.raises(UserError, match=rf"^trainer.{key}=0.25 is a fraction of micro-batches, and this plan "
                                            rf"accumulates 4 of them a step; give a whole number of optimizer steps "
                                            rf"\(trainer.{key}=N\)"):  # fmt: skip
            plan_of("batch.max_per_device=32", f"trainer.{key}=0.25")
        assert plan_of(f"trainer.{key}=0.25").trainer[key] == 0.25
    assert plan_of("batch.max_per_device=32", "trainer.val_check_interval=1.0").trainer["val_check_interval"] == 1.0


def test_evaluation_limits_count_the_batches_of_one_process(capsys):
    two = ("hardware=cpu", "hardware.devices=2", "strategy=ddp")
    trainer = plan_of(*two, "trainer.limit_val_batches=4", "trainer.limit_test_batches=0.5").trainer
    assert trainer["limit_val_batches"] == 2 and trainer["limit_test_batches"] == 0.5
    assert plan_of("hardware=cpu", "trainer.limit_val_batches=3").trainer["limit_val_batches"] == 3
    capsys.readouterr()
    assert plan_of(*two, "trainer.limit_test_batches=3").trainer["limit_test_batches"] == 2
    assert "trainer.limit_test_batches=3 does not divide over 2 processes; each scores 2" in capsys.readouterr().err


def test_a_submodule_named_twice_for_sharding_is_one_line():
    with pytest.raises(UserError, match="strategy.shard names net twice"):
        plan_of("strategy=fsdp", "strategy.shard=[net,net]")


@pytest.mark.parametrize(
    ("override", "said"),
    [("+trainer.acclerator=gpu", "trainer.acclerator is not a config key"), ("~seed", "~seed deletes seed")],
)
def test_what_hydra_lets_through_is_refused_by_the_plan_itself(override, said):
    # A job's config composed on another process (a SLURM node, a torchrun rank) meets the same check as the
    # command line's: resolving the plan refuses it.
    with pytest.raises(UserError, match=re.escape(said)):
        plan_of(override)


@pytest.mark.parametrize(
    ("override", "owner"),
    [
        ("+data.batch_size=64", "batch.global_size"),
        ("+data.num_workers=3", "batch.num_workers"),
        ("+data.seed=3", "set seed instead"),
    ],  # fmt: skip
)
def test_a_planned_data_setting_given_on_the_command_line_is_refused_naming_its_key(override, owner):
    # The data config's own value gives way to the plan's with a note; one typed on the command line was meant.
    with pytest.raises(UserError) as err:
        plan_of("data._target_=plain_datamodule.PlainDataModule", "+data.record_dir=x", override)
    assert str(err.value).startswith(f"{override} is set on the command line, but the plan gives the data module")
    assert owner in str(err.value)


@pytest.mark.parametrize("averaging", ["ema", "swa"])
def test_weight_averaging_under_fsdp_is_refused_before_anything_starts(averaging):
    # Lightning's WeightAveraging deep-copies the module; FSDP's sharded module cannot be copied (a traceback
    # on every rank, at fit's start).
    with pytest.raises(UserError, match=f"callbacks.{averaging} .* strategy=fsdp cannot make"):
        plan_of(f"callbacks=[default,{averaging}]", "hardware=cpu", "hardware.devices=2", "strategy=fsdp")
    assert plan_of(f"callbacks=[default,{averaging}]", "hardware=cpu", "hardware.devices=2", "strategy=ddp")


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["experiment=charlm"], "data=text needs the text to train on: data.path=FILE"),
        (["experiment=charlm", "data.path=x.txt", "data.val_fraction=0.9"], "data.val_fraction=0.9 and"),
        (["experiment=imagefolder"], "data=imagefolder needs data.root=PATH"),
    ],
)
def test_a_data_module_s_own_check_of_its_config_refuses_the_plan(overrides, said):
    """A data option that needs a value its config leaves out was refused only as the run built it: `plan=true`
    (and a sweep's check of every job) said the run was fine."""
    with pytest.raises(UserError, match=re.escape(said)):
        plan_of(*overrides)


@pytest.mark.parametrize("metric", ["val/acc", "val/f1", "val/precision", "val/dice", "val/auroc", "val_recall"])
def test_a_metric_where_higher_is_better_is_maximised_without_a_word(metric):
    assert plan_of(f"objective.metric={metric}").objective.direction == "max"
