"""The scaling part of a sweep report: the same job at several world sizes (`experiment=scaling`), its
samples/s against world size, the ideal (linear from the smallest world size) and the scaling efficiency."""

from __future__ import annotations

import textwrap
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from hydralight.reports import plots

if TYPE_CHECKING:
    from matplotlib.figure import Figure


class Job(Protocol):
    """What the scaling section reads of a job of the sweep (hydralight.reports.sweep.Job)."""

    @property
    def name(self) -> str: ...

    @property
    def samples_per_s(self) -> float | None: ...

    @property
    def finished(self) -> bool: ...

    @property
    def world_size(self) -> int | None: ...

    @property
    def overrides(self) -> dict[str, str]: ...

    @property
    def plan(self) -> dict[str, Any]: ...

    @property
    def machine(self) -> dict[str, Any]: ...


# Overrides that set the world size (hardware=..., hardware.devices=..., hardware.num_nodes=...); any
# other override that differs between jobs makes a series of its own.
WORLD_SIZE_KEYS = "hardware"


@dataclass(frozen=True)
class ScalingPoint:
    """One world size of one series: its samples/s (the mean over its jobs) and how it compares with the
    series' smallest world size."""

    series: str  # the other swept overrides; "" when only the world size differs
    world_size: int
    samples_per_s: float
    jobs: tuple[str, ...]
    base_world_size: int
    base_samples_per_s: float

    @property
    def ideal(self) -> float:
        """Samples/s if throughput grew linearly from the smallest world size."""
        return self.base_samples_per_s * self.world_size / self.base_world_size

    @property
    def speedup(self) -> float:
        return self.samples_per_s / self.base_samples_per_s

    @property
    def efficiency(self) -> float:
        """samples/s at N over (N / N0) x samples/s at N0."""
        return self.samples_per_s / self.ideal


def scaling_points(jobs: Sequence[Job], swept: list[str]) -> list[ScalingPoint]:
    """The points of the finished jobs, by series and world size; none unless they differ in world size."""
    measured = [j for j in jobs if j.finished and j.world_size is not None and j.samples_per_s]
    if len({j.world_size for j in measured}) < 2:
        return []
    others = [k for k in swept if not k.startswith(WORLD_SIZE_KEYS)]
    series: dict[str, dict[int, list[Job]]] = {}
    for job in measured:
        label = " ".join(f"{k}={job.overrides[k]}" for k in others if k in job.overrides)
        series.setdefault(label, {}).setdefault(job.world_size, []).append(job)  # type: ignore[arg-type]
    points = []
    for label, by_size in series.items():
        mean = {size: sum(j.samples_per_s for j in group) / len(group) for size, group in by_size.items()}  # type: ignore[misc]
        base = min(mean)
        for size in sorted(mean):
            names = tuple(j.name for j in by_size[size])
            points.append(ScalingPoint(label, size, mean[size], names, base, mean[base]))
    return points


def describe_machine(machine: dict[str, Any]) -> str:
    """One line naming a machine as a run's manifest records it."""
    gpus = Counter(g.get("name", "GPU") for g in machine.get("gpus") or [])
    parts = [f"{n} x {name}" for name, n in gpus.items()] or ["no GPU"]
    cores = f"{machine['cpu_cores']} CPU cores" if machine.get("cpu_cores") else "CPU"
    parts.append(cores + (f" ({machine['cpu_model']})" if machine.get("cpu_model") else ""))
    if machine.get("memory_gb"):
        parts.append(f"{machine['memory_gb']:g} GB memory")
    return f"{machine.get('hostname', 'unknown host')}: {', '.join(parts)}"


def machine_note(jobs: Sequence[Job], points: list[ScalingPoint]) -> str:
    """Where the points were measured, and what that means for them on a CPU."""
    used = {name for p in points for name in p.jobs}
    measured = [j for j in jobs if j.name in used]
    machines = list(dict.fromkeys(describe_machine(j.machine) for j in measured if j.machine))
    shown = "; ".join(machines[:3]) + (f" and {len(machines) - 3} more" if len(machines) > 3 else "")
    note = f"Measured on {shown or 'a machine its manifests do not record'}."
    if any((j.plan.get("hardware") or {}).get("accelerator") == "cpu" for j in measured):
        note += (
            " CPU processes share these cores and their memory bandwidth: on a small CPU the figures are what "
            "this machine gives, not how the code scales on more hardware."
        )
    return note


def scaling_lines(points: list[ScalingPoint], note: str) -> list[str]:
    """The markdown of the scaling section: what was measured and the efficiency table."""
    with_series = any(p.series for p in points)
    columns = (["series"] if with_series else []) + [
        "world size", "jobs", "samples/s", "ideal samples/s", "speed-up", "efficiency",
    ]  # fmt: skip
    lines = [
        "## Scaling",
        "",
        "The same job at each world size. Samples/s: training from the 5th optimizer step to the last (start-up "
        "and validation left out; runs that did not measure it: over the whole fit); "
        "ideal: linear from the smallest world size; efficiency: samples/s at N / (N / N0 x samples/s at N0).",
        "",
        note,
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for p in points:
        cells = ([p.series] if with_series else []) + [
            str(p.world_size), ", ".join(p.jobs), f"{p.samples_per_s:.1f}", f"{p.ideal:.1f}",
            f"{p.speedup:.2f}x", f"{100 * p.efficiency:.0f}%",
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def scaling_figure(points: list[ScalingPoint], note: str) -> Figure:
    """Samples/s against world size with the ideal line, and the scaling efficiency; the note as subtitle."""
    fig, (speed, efficiency) = plots.figure(11, 4.8, ncols=2)
    sizes = sorted({p.world_size for p in points})
    for label in dict.fromkeys(p.series for p in points):
        line = [p for p in points if p.series == label]
        xs = [p.world_size for p in line]
        drawn = speed.plot(xs, [p.samples_per_s for p in line], "o-", label=label or "measured")
        color = drawn[0].get_color()
        speed.plot(xs, [p.ideal for p in line], "--", color=color, alpha=0.6, label=f"ideal {label}".strip())
        efficiency.plot(xs, [100 * p.efficiency for p in line], "o-", color=color, label=label or "measured")
    efficiency.axhline(100, color="grey", linestyle="--", linewidth=1, label="ideal")
    for ax, ylabel in ((speed, "samples/s"), (efficiency, "scaling efficiency (%)")):
        if sizes[-1] / sizes[0] >= 8:
            ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.set_xlabel("world size (processes)")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    speed.set_title("throughput")
    efficiency.set_title("efficiency")
    fig.suptitle("Scaling\n" + textwrap.fill(note, 140), fontsize=9)
    return fig


def write_scaling_plot(points: list[ScalingPoint], note: str, out_dir: Path) -> Path:
    return plots.save(scaling_figure(points, note), out_dir / "scaling.png")
