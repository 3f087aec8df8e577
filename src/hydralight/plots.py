"""Figures of the offline reports: matplotlib on the Agg backend, written as PNG files.

Figures are built on their own Agg canvas, outside pyplot's global state: a report runs on machines
without a display, and a figure a test inspects needs no closing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def figure(width: float, height: float, ncols: int = 1, nrows: int = 1) -> tuple[Figure, list[Axes]]:
    """A figure of `nrows` x `ncols` panels and its axes, row by row."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig, list(fig.subplots(nrows, ncols, squeeze=False).ravel())


def save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def log_scale_fits(values: list[Any]) -> bool:
    """Whether a log axis can show these values (all positive numbers)."""
    return bool(values) and all(isinstance(v, int | float) and v > 0 for v in values)
