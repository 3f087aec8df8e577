"""Shared fixtures: small IDX files and image folders written on the fly, the real MNIST when present, a CLI
runner; and an environment that the shell the tests run in cannot change."""

from __future__ import annotations

import atexit
import csv
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers.warm import WarmInterpreter, forkable

ROOT = Path(__file__).resolve().parents[1]
HELPERS = Path(__file__).resolve().parent / "helpers"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
# The real MNIST, when the shell points at it (read before DATA_DIR is cleared below).
# Kept for test worker processes too, which start from this process's environment once DATA_DIR is cleared.
REAL_DATA_DIR = os.environ.get("DATA_DIR") or os.environ.get("HYDRALIGHT_TESTS_REAL_DATA_DIR")
if REAL_DATA_DIR:
    os.environ["HYDRALIGHT_TESTS_REAL_DATA_DIR"] = REAL_DATA_DIR

# The user's shell never changes a test's outcome: launch, tracking, threading and device variables are
# cleared for this process and every process a test starts (each test sets what it needs). Set before
# torch is imported.
ISOLATED_PREFIXES = ("WANDB_", "HYDRA_", "SLURM_", "SBATCH_", "SRUN_", "TORCHELASTIC_", "NCCL_", "DSTACK_", "PET_")
ISOLATED = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "RANK", "LOCAL_RANK", "WORLD_SIZE",
            "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "DATA_DIR", "NETRC",
            "XDG_CACHE_HOME", "PL_GLOBAL_SEED", "PYTHONHASHSEED")  # fmt: skip
# Matplotlib's font cache stays where it was (a new one is built, and logged, by every first import).
os.environ.setdefault(
    "MPLCONFIGDIR", str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "matplotlib")
)
for _name in list(os.environ):
    if _name.startswith(ISOLATED_PREFIXES) or _name in ISOLATED:
        del os.environ[_name]
_SANDBOX = Path(tempfile.mkdtemp(prefix="hydralight-tests-"))
atexit.register(shutil.rmtree, _SANDBOX, ignore_errors=True)
os.environ.update(
    # CPU only, whatever the machine has: the tolerances and timings below are the CPU's.
    CUDA_VISIBLE_DEVICES="",
    # No wandb login or settings of the user's: a test that logs to wandb says how.
    NETRC=str(_SANDBOX / "no-netrc"),
    WANDB_CONFIG_DIR=str(_SANDBOX / "wandb-config"),
    WANDB_CACHE_DIR=str(_SANDBOX / "wandb-cache"),
    # Decode caches of image folders go to the tests' own cache, not the user's.
    XDG_CACHE_HOME=str(_SANDBOX / "cache"),
    # Several test workers (`make test` runs two): the cores split between them, or each run's torch threads
    # spin against the other worker's and every run slows down several times.
    OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))),
)


def write_idx(path: Path, array: np.ndarray) -> None:
    """Write a uint8 array in the IDX format (magic 0x0000080N, big-endian dims, raw bytes)."""
    header = (0x0800 + array.ndim).to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def make_mnist(root: Path, n_train: int = 600, n_test: int = 200, seed: int = 0, name: str = "MNIST") -> Path:
    """A learnable stand-in for MNIST (or, with `name`, another IDX data set such as FashionMNIST): each class
    lights its own horizontal band, plus noise."""
    rng = np.random.default_rng(seed)
    raw = root / name / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = rng.integers(0, 10, size=n)
        images = rng.integers(0, 60, size=(n, 28, 28))
        for i, label in enumerate(labels):
            images[i, 2 + 2 * label : 4 + 2 * label, 4:24] = 255
        write_idx(raw / f"{prefix}-images-idx3-ubyte", images)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels)
    return root


# Colours of the generated image classes: each class is its colour on a noisy background.
FOLDER_COLOURS = {"blue": (40, 60, 220), "green": (40, 200, 60), "red": (220, 40, 40), "yellow": (220, 210, 40)}


def make_image_folder(root: Path, n_train: int = 60, n_test: int = 20, size: int = 32, seed: int = 0) -> Path:
    """`root/train/<class>/*.png` and `root/test/<class>/*.png`: RGB images, a coloured square per class."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for split, n in (("train", n_train), ("test", n_test)):
        for name, colour in FOLDER_COLOURS.items():
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                image = rng.integers(0, 90, size=(size, size, 3))
                top, left = rng.integers(0, size // 2, size=2)
                image[top : top + size // 2, left : left + size // 2] = colour
                Image.fromarray(image.astype(np.uint8)).save(folder / f"{i:04d}.png")
    return root


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated image folder, 4 classes of 60 training and 20 test images; never modified."""
    return make_image_folder(tmp_path_factory.mktemp("images"))


@pytest.fixture()
def fresh_image_folder(tmp_path: Path) -> Path:
    """A generated image folder the test may damage."""
    return make_image_folder(tmp_path / "images", n_train=20, n_test=5)


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 8 MiB tmpfs for a run dir: a real full disk. Needs root; fails in CI where it cannot be made."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if made.returncode:
        reason = f"cannot mount a tmpfs here (root needed): {made.stderr.strip()}"
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_mnist(tmp_path_factory.mktemp("tiny"))


@pytest.fixture()
def fresh_data(tmp_path: Path) -> Path:
    """Tiny MNIST the test may damage."""
    return make_mnist(tmp_path / "data")


@pytest.fixture(scope="session")
def real_data() -> Path:
    """The real MNIST in DATA_DIR; a missing copy fails in CI and skips elsewhere."""
    raw = Path(REAL_DATA_DIR or "data") / "MNIST" / "raw"
    if (raw / "train-images-idx3-ubyte").is_file():
        return raw.parents[1]
    message = f"real MNIST not found in {raw} (set DATA_DIR to a folder holding MNIST/raw/)"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


# Overrides that keep a CLI run to a few seconds on tiny data.
TINY = [
    "data.val_size=100",
    "batch.global_size=32",
    "batch.eval_size=50",
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=4",
    "model=mlp",
    "hardware=cpu",
    "trainer.log_every_n_steps=1",
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest work first, so that the two workers end together: the slow tests, then the rest; collection
    order within each."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


# `python train.py` runs fork a warm interpreter (helpers/warm.py): the imports once per test process.
WARM = WarmInterpreter(_SANDBOX)
atexit.register(WARM.stop)


def run_cli(
    args: list[str], run_dir: Path, data_dir: Path | None = None, timeout: float = 300, cwd: Path = ROOT, **env: str
) -> subprocess.CompletedProcess:
    """`python train.py ARGS hydra.run.dir=RUN_DIR` from the repository root (or `cwd`), output captured."""
    environ = {**os.environ, **env}
    if data_dir is not None:
        environ["DATA_DIR"] = str(data_dir)
    has_dir = any(a.startswith(("hydra.run.dir=", "hydra.sweep.dir=")) for a in args)
    if not has_dir and "-m" not in args and "--multirun" not in args:
        args = with_override(args, f"hydra.run.dir={run_dir}")
    return run_python([sys.executable, str(ROOT / "train.py"), *args], environ, timeout, cwd)


def with_override(args: list[str], override: str) -> list[str]:
    """`args` with one more override, beside the others (Hydra reads them as one group, before or after a flag
    such as `--cfg job`)."""
    from hydra._internal.utils import get_args_parser

    for candidate in ([*args, override], [override, *args]):
        if not get_args_parser().parse_known_args(candidate)[1]:
            return candidate
    return [*args, override]  # refused as written: the test sees the refusal


def run_python(
    command: list[str], env: dict[str, str] | None = None, timeout: float = 300, cwd: Path = ROOT
) -> subprocess.CompletedProcess:
    """`subprocess.run(command, capture_output=True, text=True)`; a Python command the warm interpreter can
    fork (`python SCRIPT.py ...`, see helpers/warm.forkable) runs as its fork, and so do the Python scripts and
    DDP ranks it starts."""
    environ = dict(os.environ if env is None else env)
    if forkable(command) and WARM.usable(environ):
        return WARM.run(command, cwd, environ, timeout)
    return subprocess.run(command, cwd=cwd, env=environ, capture_output=True, text=True, timeout=timeout)


def popen(command: list[str], env: dict[str, str], cwd: Path = ROOT, merged: bool = True):
    """`subprocess.Popen(command, stdout=PIPE, stderr=STDOUT if merged else PIPE, text=True,
    start_new_session=True)`; a Python command the warm interpreter can fork runs as its fork (what the suite
    uses of Popen: pid, poll, wait, communicate, send_signal, kill)."""
    if forkable(command) and WARM.usable(env):
        return WARM.start(command, cwd, env, merged=merged)
    stderr = subprocess.STDOUT if merged else subprocess.PIPE
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True,
                            start_new_session=True, preexec_fn=as_from_a_terminal)  # fmt: skip


def as_from_a_terminal() -> None:
    """A command typed at a terminal takes Ctrl-C; one a suite started in the background (a CI job, `cmd &`)
    inherits SIGINT ignored, as the shell sets it, and Python then keeps ignoring it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def one_line(result: subprocess.CompletedProcess) -> str:
    """The single `error:` line of a refused run (exit 2, no traceback)."""
    assert result.returncode == 2, (result.stdout[-2000:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr + result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr[-2000:]
    return errors[0]


def csv_rows(run: Path) -> list[dict[str, str]]:
    """The rows of a run's csv/metrics.csv, empty cells dropped."""
    with (run / "csv" / "metrics.csv").open(newline="") as f:
        return [{k: v for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


# Machines to plan for, real or not.
CPU_BOX_SPEC = {"gpus": 0, "cpu_cores": 2, "memory_gb": 24}


def compose_config(*overrides: str, run_dir: Path | str = "/nonexistent/run", return_hydra: bool = False):
    """The config `python train.py OVERRIDES` composes, with the run dir Hydra would give it."""
    from hydra import compose, initialize_config_dir

    from hydralight.train import CONFIG_DIR

    paths = [f"paths.output_dir={run_dir}", f"paths.root_dir={ROOT}"]
    with initialize_config_dir(CONFIG_DIR, version_base="1.3"):
        return compose("train", overrides=[*overrides, *paths], return_hydra_config=return_hydra)


def plan_of(*overrides: str, machine=None, run_dir: Path | str = "/nonexistent/run"):
    """The run plan of `python train.py OVERRIDES` on `machine` (a 2-core CPU box by default), resolved in-process."""
    from omegaconf import OmegaConf, open_dict

    from hydralight.config.plan import Machine
    from hydralight.config.resolve import JobInfo, resolve

    cfg = compose_config(*overrides, run_dir=run_dir, return_hydra=True)
    choices = {k: v for k, v in OmegaConf.to_container(cfg.hydra.runtime.choices).items() if isinstance(v, str)}
    with open_dict(cfg):
        del cfg["hydra"]
    job = JobInfo(run_dir=str(run_dir), overrides=list(overrides), choices=choices)
    return resolve(cfg, machine or Machine(**CPU_BOX_SPEC), job)
