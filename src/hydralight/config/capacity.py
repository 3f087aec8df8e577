"""Whether a node can hold the processes a plan starts on it: one CPU core per CPU process, and a floor of
host memory per process of any kind.

Without this check an impossible run is not refused: `hardware=cpu hardware.devices=64` on a 2-core machine
started 63 extra processes that spent minutes importing torch, filled the memory, and never took a step.
"""

from __future__ import annotations

import math

from hydralight.config.plan import HardwarePlan, Machine
from hydralight.errors import UserError

# Host memory that one rank holds for itself before it builds anything: the private (unshared) memory of a
# process that has imported torch, torchvision, Lightning and this package, measured as Private_Dirty in
# /proc/self/smaps_rollup on Linux x86_64 with CPU-only torch 2.x (0.45 GB of a 0.79 GB RSS; the shared
# libraries' pages are counted once per machine, so they are left out). A floor: data, model and loader
# workers come on top.
PROCESS_FLOOR_GB = 0.45


def check_capacity(hw: HardwarePlan, machine: Machine | None, oversubscribe: bool = False) -> None:
    """Refuse, in one line with the fix, more CPU processes per node than the node has cores, or CPU processes
    asking more cores than it has by `hardware.cpus_per_task` (unless `oversubscribe`), and more processes than
    its memory holds at PROCESS_FLOOR_GB each.

    `machine` is the node the processes run on; None for a job whose resources a scheduler allocated
    (a SLURM task sees only its own cores and the node's whole memory): then the request is checked,
    `hardware.mem_gb`."""
    processes = hw.devices
    if machine is not None and hw.accelerator == "cpu" and not oversubscribe and processes > machine.cpu_cores:
        raise UserError(
            f"hardware.devices={processes} starts {processes} processes on a machine with {machine.cpu_cores} "
            f"CPU core(s); use hardware.devices={machine.cpu_cores} or fewer, or hardware.oversubscribe=true "
            "to share the cores anyway"
        )
    cores = hw.cpus_per_task * processes
    # cpus_per_task=auto divides the cores, and falls to 1 only for more processes than cores (checked above).
    # A GPU profile's cpus_per_task is a scheduler's request; torch's threads are held to the cores there.
    cpu = hw.accelerator == "cpu" and not oversubscribe
    if machine is not None and cpu and hw.cpus_per_task > 1 and cores > machine.cpu_cores:
        raise UserError(
            f"hardware.cpus_per_task={hw.cpus_per_task} x {processes} process(es) asks for {cores} CPU cores on a "
            f"machine with {machine.cpu_cores}; use hardware.cpus_per_task={max(1, machine.cpu_cores // processes)} "
            "or auto, or hardware.oversubscribe=true to share the cores anyway"
        )
    # The tighter of the machine's memory and hardware.mem_gb (which is the machine's when auto); 0: unknown.
    if machine is not None and machine.memory_gb > 0 and (machine.memory_gb <= hw.mem_gb or hw.mem_gb <= 0):
        memory, holder, raisable = machine.memory_gb, "this machine has", False
    else:
        memory, holder, raisable = hw.mem_gb, f"hardware.mem_gb={_gb(hw.mem_gb)} gives", True
    needed = processes * PROCESS_FLOOR_GB
    if 0 < memory < needed:
        most = math.floor(memory / PROCESS_FLOOR_GB)
        fix = f"use hardware.devices={most} or fewer" if most >= 1 else "run on a machine with more memory"
        if raisable:
            fix += f", or raise hardware.mem_gb to {math.ceil(needed)}"
        raise UserError(
            f"hardware.devices={processes} needs at least {_gb(needed)} GB of memory ({PROCESS_FLOOR_GB} GB per "
            f"process) but {holder} {_gb(memory)} GB; {fix}"
        )


def _gb(value: float) -> str:
    return f"{value:g}" if value == int(value) else f"{value:.1f}"
