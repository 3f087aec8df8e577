"""Figures written by the reports."""

from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")

from matplotlib import pyplot as plt  # noqa: E402

from hydralight.reports import plots  # noqa: E402


def _overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_a_colorbar_beside_several_panels_stays_beside_them(tmp_path: Path):
    fig, axes = plt.subplots(1, 2)
    points = axes[0].scatter(np.arange(5), np.arange(5), c=np.arange(5))
    axes[1].scatter(np.arange(5), np.arange(5)[::-1], c=np.arange(5))
    bar = fig.colorbar(points, ax=list(axes))
    plots.save(fig, tmp_path / "bar.png")
    assert (tmp_path / "bar.png").stat().st_size > 0
    assert not any(_overlaps(bar.ax.get_position(), ax.get_position()) for ax in axes)
    plt.close(fig)


def test_panels_without_a_colorbar_are_laid_out_again(tmp_path: Path):
    fig, axes = plt.subplots(1, 2)
    before = [ax.get_position().bounds for ax in axes]
    plots.save(fig, tmp_path / "panels.png")
    assert [ax.get_position().bounds for ax in axes] != before  # tight_layout moved them
    plt.close(fig)
