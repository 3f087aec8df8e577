"""dstack task configurations generated from the hardware profiles, so cloud runs cannot drift from them.

A single-node profile runs `python train.py ...` (one process per GPU, started by Lightning); a
multi-node profile runs torchrun on every node with the node rank, master address and GPUs per node
that dstack provides. Secrets are named, never written: dstack passes them from the environment or its
secret store.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from hydralight.config.resolve import resources_elsewhere
from hydralight.errors import UserError, require

# Where checkpoints and run dirs live on the cloud machine: a network volume, so a spot interruption
# and the retry that follows find last.ckpt again (resume=auto).
RUNS_PATH = "/runs"
DEFAULT_PYTHON = "3.11"
# The project root seen from dstack/: dstack resolves a relative repos[].local_path against the file's folder.
REPO_FROM_CONFIG_DIR = ".."


def task_config(
    cfg: DictConfig,
    overrides: list[str],
    name: str,
    volume: str = "hydralight-runs",
    spot_policy: str = "auto",
    max_duration: str = "6h",
    shm_size_gb: int = 16,
    repo_path: str = REPO_FROM_CONFIG_DIR,
) -> dict[str, Any]:
    """The dstack `type: task` configuration that runs `train.py` with `overrides` on the planned hardware.

    `repo_path` is the project root relative to the folder the configuration file is written to.
    """
    hw = resources_elsewhere(cfg)[0]
    if hw.accelerator != "gpu":
        raise UserError("dstack configurations are for GPU profiles; pick hardware=1gpu, 4gpu, 8gpu or 2x8gpu")
    run_dir = f"{RUNS_PATH}/${{DSTACK_RUN_NAME}}"
    args = " ".join([*overrides, f"hydra.run.dir={run_dir}"])
    if hw.num_nodes > 1:
        launch = (
            "torchrun --nnodes=$DSTACK_NODES_NUM --nproc-per-node=$DSTACK_GPUS_PER_NODE "
            "--node-rank=$DSTACK_NODE_RANK --master-addr=$DSTACK_MASTER_NODE_IP --master-port=29500 "
            f"train.py {args}"
        )
    else:
        launch = f"python train.py {args}"
    config: dict[str, Any] = {
        "type": "task",
        "name": name,
        "python": DEFAULT_PYTHON,
        # Without a repo the task starts in an empty directory; path "." checks it out where the commands run.
        "repos": [{"local_path": repo_path, "path": "."}],
        "env": ["WANDB_API_KEY", "DATA_DIR=/data"],
        "commands": ["pip install -e .", launch],
        "resources": hw.dstack_resources(shm_size_gb),
        # Multi-node: one volume per node (rank 0's holds the checkpoints); dstack mounts one of the list.
        "volumes": [
            {"name": volume if hw.num_nodes == 1 else [f"{volume}-{i}" for i in range(hw.num_nodes)], "path": RUNS_PATH}
        ],
        "spot_policy": spot_policy,
        "retry": {"on_events": ["no-capacity", "interruption"], "duration": "1d"},
        "max_duration": max_duration,
    }
    if hw.num_nodes > 1:
        config = {**config, "nodes": hw.num_nodes}
    return config


def validate(config: dict[str, Any]) -> Any:
    """Parse with dstack's own configuration parser; raises on anything dstack would refuse."""
    require("dstack", "dstack", "checking a dstack configuration")
    from dstack._internal.core.models.configurations import parse_run_configuration

    return parse_run_configuration(config)
