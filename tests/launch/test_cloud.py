"""dstack configurations: parsed by dstack itself, in step with the hardware profiles, and runnable."""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, TINY
from hydra import compose, initialize_config_dir

from hydralight.train import CONFIG_DIR

SHIPPED = {
    "4gpu.dstack.yml": ["hardware=4gpu", "precision=bf16-mixed"],
    "2x8gpu.dstack.yml": ["hardware=2x8gpu", "precision=bf16-mixed"],
}
sys.path.insert(0, str(ROOT / "scripts"))


def gpu_profiles() -> list[str]:
    """Composed, not read from the file: a profile may take its accelerator from another (2x8gpu from 8gpu)."""
    names = sorted(p.stem for p in (Path(CONFIG_DIR) / "hardware").glob("*.yaml"))
    with initialize_config_dir(CONFIG_DIR, version_base="1.3"):
        return [n for n in names if compose("train", overrides=[f"hardware={n}"]).hardware.accelerator == "gpu"]


def dstack_parser():
    try:
        from dstack._internal.core.models.configurations import parse_run_configuration
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("dstack is not installed (pip install -e '.[dev]')")
    return parse_run_configuration


def load(name: str) -> dict:
    return yaml.safe_load((ROOT / "dstack" / name).read_text())


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_configuration_parses_and_matches_its_profile(name):
    parsed = dstack_parser()(load(name))
    assert parsed.type == "task"
    with initialize_config_dir(CONFIG_DIR, version_base="1.3"):
        hardware = compose("train", overrides=SHIPPED[name]).hardware
    assert parsed.resources.gpu.count.min == hardware.devices
    assert (parsed.nodes or 1) == hardware.num_nodes
    assert parsed.spot_policy is not None and parsed.max_duration is not None
    assert parsed.resources.shm_size is not None
    assert type(parsed.env["WANDB_API_KEY"]).__name__ == "EnvSentinel"  # named, its value never written


def shipped_repo_root(config: dict, config_dir: Path) -> Path:
    """The folder `dstack apply -f` ships, resolved as dstack does it (relative to the file's folder)."""
    parsed = dstack_parser()(config)
    assert len(parsed.repos) == 1, "no repo: dstack would run the commands in an empty directory"
    repo = parsed.repos[0]
    assert repo.url is None and repo.local_path
    # Checked out into the working directory, so `pip install -e .` and `train.py` find the project.
    assert repo.path in (".", parsed.working_dir)
    local = Path(repo.local_path).expanduser()
    return local if local.is_absolute() else (config_dir / local).resolve()


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_configuration_ships_the_project(name):
    root = shipped_repo_root(load(name), ROOT / "dstack")
    assert root == ROOT and (root / "pyproject.toml").is_file()


@pytest.mark.parametrize("hardware", gpu_profiles())
def test_every_gpu_profile_ships_the_project(hardware):
    from hydralight.launch.dstack import task_config

    overrides = [f"hardware={hardware}"]
    with initialize_config_dir(CONFIG_DIR, version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    config = yaml.safe_load(yaml.safe_dump(task_config(cfg, overrides, f"hydralight-{hardware}")))
    assert shipped_repo_root(config, ROOT / "dstack") == ROOT


def test_a_file_written_elsewhere_still_ships_the_project(tmp_path, monkeypatch):
    from dstack_config import main

    out = tmp_path / "runs" / "mine.dstack.yml"
    monkeypatch.setattr(sys, "argv", ["dstack_config.py", "hardware=1gpu", "--out", str(out)])
    assert main() == 0
    assert shipped_repo_root(yaml.safe_load(out.read_text()), out.parent) == ROOT


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_configuration_is_what_the_profile_generates(name):
    from dstack_config import render

    assert render(SHIPPED[name]) == (ROOT / "dstack" / name).read_text(), f"regenerate dstack/{name}"


def test_multi_node_command_hands_torchrun_dstack_topology():
    command = load("2x8gpu.dstack.yml")["commands"][-1]
    for flag in ("--nnodes=$DSTACK_NODES_NUM", "--nproc-per-node=$DSTACK_GPUS_PER_NODE",
                 "--node-rank=$DSTACK_NODE_RANK", "--master-addr=$DSTACK_MASTER_NODE_IP"):  # fmt: skip
        assert flag in command
    assert "train.py hardware=2x8gpu" in command


@pytest.mark.parametrize(
    "broken",
    [
        {"resources": {"gpu": 4, "memory": "lots"}},
        {"nodes": 0},
        {"spot_policy": "sometimes"},
        {"max_duration": "forever"},
        {"comands": ["python train.py"]},
    ],
)
def test_broken_configuration_is_rejected(broken):
    parse = dstack_parser()
    from dstack._internal.core.errors import ConfigurationError

    with pytest.raises(ConfigurationError):
        parse({**load("4gpu.dstack.yml"), **broken})


@pytest.mark.slow
@pytest.mark.parametrize("name", SHIPPED)
def test_the_command_is_the_real_entrypoint(name, tiny_data, tmp_path):
    """Run the file's command here with the CPU substituted for the GPUs, a few steps."""
    command = load(name)["commands"][-1]
    command = command.replace("hardware=4gpu", "hardware=cpu").replace("hardware=2x8gpu", "hardware=cpu")
    command = command.replace("precision=bf16-mixed", "precision=32-true")
    command = command.replace("train.py", f"{shlex.quote(str(ROOT / 'train.py'))} {' '.join(TINY)}", 1)
    command = command.replace("torchrun ", f"{shlex.quote(sys.executable)} -m torch.distributed.run ")
    if command.startswith("python "):
        command = shlex.quote(sys.executable) + command[len("python") :]
    env = {**os.environ, "DATA_DIR": str(tiny_data), "DSTACK_RUN_NAME": "local-check", "DSTACK_NODES_NUM": "1",
           "DSTACK_GPUS_PER_NODE": "1", "DSTACK_NODE_RANK": "0", "DSTACK_MASTER_NODE_IP": "127.0.0.1"}  # fmt: skip
    command = command.replace("/runs/", f"{tmp_path}/")
    result = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (Path(tmp_path) / "local-check" / "results.json").is_file()
