"""Figures of the offline reports: matplotlib on the Agg backend, written as PNG files.

Figures are built on their own Agg canvas, outside pyplot's global state: a report runs on machines
without a display, and a figure a test inspects needs no closing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydralight.errors import require

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def figure(width: float, height: float, ncols: int = 1, nrows: int = 1) -> tuple[Figure, list[Axes]]:
    """A figure of `nrows` x `ncols` panels and its axes, row by row."""
    require("matplotlib", "report", "a report's figures")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig, list(fig.subplots(nrows, ncols, squeeze=False).ravel())


def save(fig: Figure, path: Path) -> Path:
    """Write `fig` as a PNG. A figure with a colorbar keeps the layout its maker chose: a colorbar made beside
    several panels takes its room from them, which tight_layout would give back and draw the colorbar over."""
    import warnings

    if not any(ax.get_label() == "<colorbar>" for ax in fig.axes):  # matplotlib's label for colorbar axes
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # axes that tight_layout cannot place: bbox below
            fig.tight_layout()
    # "tight": a legend placed beside the panels is part of the picture.
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def short(value: Any) -> str:
    """A swept value as a label: numbers in 3 significant digits (0.000139, not 0.00013927723945289018)."""
    text = "-" if value is None else str(value)
    try:
        number = float(text)
    except ValueError:
        return text
    return text if number.is_integer() and "e" not in text.lower() else f"{number:.3g}"


def log_scale_fits(values: list[Any]) -> bool:
    """Whether a log axis can show these values (all positive numbers)."""
    return bool(values) and all(isinstance(v, int | float) and v > 0 for v in values)
