"""What this machine offers (GPUs, bfloat16, cores, memory), read once per run, and its record for the manifest."""

from __future__ import annotations

import contextlib
import os
import platform
import socket
from pathlib import Path
from typing import Any

import torch

from hydralight.config.plan import Machine


def detect() -> Machine:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 if hasattr(os, "sysconf") else 0.0
    if not torch.cuda.is_available():
        return Machine(cpu_cores=cores, memory_gb=round(memory, 1))
    major, _ = torch.cuda.get_device_capability(0)
    return Machine(
        gpus=torch.cuda.device_count(),
        gpu_name=torch.cuda.get_device_name(0),
        bf16=torch.cuda.is_bf16_supported(),
        tf32=major >= 8,
        cpu_cores=cores,
        memory_gb=round(memory, 1),
    )


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def describe(machine: Machine) -> dict[str, Any]:
    """The machine as the manifest records it: host, CPU, memory, GPUs and the CUDA, cuDNN and NCCL versions."""
    cuda = torch.cuda.is_available()
    gpus = []
    if cuda:
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            gpus.append({"name": props.name, "memory_gb": round(props.total_memory / 2**30, 1)})
    nccl = None
    if cuda and hasattr(torch.cuda, "nccl"):
        with contextlib.suppress(Exception):
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
    return {
        "hostname": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "cpu_cores": machine.cpu_cores,
        "memory_gb": machine.memory_gb,
        "gpus": gpus,
        "cuda": torch.version.cuda if cuda else None,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "nccl": nccl,
    }


def seed(value: int) -> None:
    """Seed every random stream (before anything random is built: the same seed, the same numbers)."""
    import pytorch_lightning as pl

    pl.seed_everything(value, workers=True, verbose=False)


def apply(env: dict[str, str], matmul_precision: str | None, cpus: int) -> None:
    """Put the plan's process-wide settings in force: environment knobs, matmul precision, and torch's threads
    held to the plan's `cpus` per process (an OMP_NUM_THREADS the user set wins; it also reaches the ranks and
    loader workers started later, and Lightning's own thread setting reads it)."""
    os.environ.update(env)
    told = os.environ.get("OMP_NUM_THREADS", "")
    threads = int(told) if told.isdigit() and int(told) > 0 else min(cpus, torch.get_num_threads())
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if matmul_precision:
        torch.set_float32_matmul_precision(matmul_precision)
