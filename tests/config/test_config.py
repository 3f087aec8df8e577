"""Every option of every config group composes and plans."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

from hydralight.config.plan import Machine
from hydralight.config.resolve import JobInfo, resolve
from hydralight.train import CONFIG_DIR

GPU_BOX = Machine(gpus=8, gpu_name="NVIDIA H100", bf16=True, tf32=True, cpu_cores=64, memory_gb=1000)
GROUPS = [
    "hardware",
    "strategy",
    "precision",
    "batch",
    "model",
    "optim",
    "data",
    "logger",
    "trainer",
    "callbacks",
    "experiment",
    "debug",
]
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((Path(CONFIG_DIR) / g).glob("*.yaml"))]


def test_every_group_has_options():
    found = {g for g, _ in OPTIONS}
    assert found == set(GROUPS)


# The value an option needs from the user (its data), refused by the plan without it.
NEEDS = {"text": ["data.path=book.txt"], "charlm": ["data.path=book.txt"], "imagefolder": ["data.root=images"]}


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_option_composes_and_plans(group, option):
    needs = NEEDS.get(option, []) if group in ("data", "experiment") else []
    with initialize_config_dir(CONFIG_DIR, version_base="1.3"):
        cfg = compose("train", overrides=[f"{group}={option}", *needs], return_hydra_config=True)
    # Resolve what does not need a running Hydra job.
    cfg.hydra.runtime.output_dir = "/tmp/run"
    cfg.hydra.runtime.cwd = "/tmp"
    from hydra.core.hydra_config import HydraConfig

    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert resolved["paths"]["output_dir"] == "/tmp/run"
    plan = resolve(cfg, GPU_BOX, JobInfo(run_dir="/tmp/run"))
    assert plan.paths.run_dir == "/tmp/run" and plan.model.spec["_target_"] and plan.data.spec["_target_"]
    assert plan.task.per_device_size * plan.hardware.world_size * plan.task.accumulation == plan.task.global_size
    if group == "precision":
        assert plan.framework.precision == option
    if group == "hardware" and option != "auto":
        assert cfg.hardware.devices == plan.hardware.devices


def test_experiment_fast_is_the_one_epoch_recipe():
    with initialize_config_dir(CONFIG_DIR, version_base="1.3"):
        cfg = compose("train", overrides=["experiment=fast"])
    assert cfg.trainer.max_epochs == 1
    assert cfg.model.net._target_.endswith("FastCNN")
    assert cfg.optim.scheduler._target_.endswith("OneCycleLR")
