"""The search part of a sweep report: the trials of a hyperparameter search (the sweep dir's search.json,
written by the search sweeper), ranked by the study's objective, and their plots."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydralight import plots

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# Trial states in the order the table shows them; other states (pruned, waiting) come last.
STATE_ORDER = ("COMPLETE", "FAIL", "RUNNING")
STATE_WORDS = {"COMPLETE": "complete", "FAIL": "failed", "RUNNING": "running"}


@dataclass
class Search:
    """What search.json holds: the objective, the space, every trial so far and the best one."""

    metric: str
    direction: str  # max | min
    study_name: str | None
    storage: str | None
    fixed: list[str]
    space: dict[str, dict[str, Any]]
    trials: list[dict[str, Any]]
    best: dict[str, Any] | None

    @property
    def params(self) -> list[str]:
        """The searched parameters: the space's, then any a trial holds beyond it (an enqueued trial)."""
        keys = list(self.space)
        for trial in self.trials:
            keys += [k for k in trial.get("params") or {} if k not in keys]
        return keys

    def scored(self) -> list[dict[str, Any]]:
        """The complete trials with a finite objective, in trial order."""
        done = [t for t in self.trials if t["state"] == "COMPLETE" and _finite(t.get("value"))]
        return sorted(done, key=lambda t: t["number"])


def load_search(sweep_dir: Path) -> Search | None:
    """The search of a sweep dir, or None when the sweep was no search."""
    from hydralight.search import SEARCH_FILE  # imported here: the sweeper module may import the report

    path = sweep_dir / SEARCH_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    objective = data.get("objective") or {}
    return Search(
        metric=str(objective.get("metric", "objective")),
        direction=str(objective.get("direction", "max")),
        study_name=data.get("study_name"),
        storage=data.get("storage"),
        fixed=list(data.get("fixed") or []),
        space=dict(data.get("space") or {}),
        trials=list(data.get("trials") or []),
        best=data.get("best"),
    )


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def ranked(search: Search) -> list[dict[str, Any]]:
    """Trials as the table shows them: complete ones best first (in the study's direction), then failed
    ones, then running ones, then any other state; by trial number within each group."""
    sign = -1.0 if search.direction == "max" else 1.0

    def key(trial: dict[str, Any]) -> tuple:
        state = trial["state"]
        group = STATE_ORDER.index(state) if state in STATE_ORDER else len(STATE_ORDER)
        value = trial.get("value")
        score = sign * value if state == "COMPLETE" and _finite(value) else math.inf
        return (group, score, trial["number"])

    return sorted(search.trials, key=key)


def _value(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.6g}" if _finite(value) else str(value)


def _cell(text: str) -> str:
    # A reason may hold a pipe or a line break; either would break the markdown table.
    return text.replace("|", "\\|").replace("\n", " ")


def search_lines(search: Search, test_acc: dict[str, float | None]) -> list[str]:
    """The markdown of the search section: objective, best trial, and the table of trials. `test_acc`: the
    test accuracy of each job folder, shown and never used to choose."""
    params = search.params
    states = [t["state"] for t in search.trials]
    counts = ", ".join(f"{states.count(s)} {STATE_WORDS.get(s, s.lower())}" for s in dict.fromkeys(states))
    best_first = "highest" if search.direction == "max" else "lowest"
    lines = [
        "## Search",
        "",
        f"Objective: {search.metric}, {search.direction} (a validation metric; test/acc is reported, not used "
        f"to choose). Study `{search.study_name}`, storage {search.storage or 'in memory'}; "
        f"{len(search.trials)} trials: {counts or 'none yet'}.",
    ]
    if search.fixed:
        lines += ["", "Every trial: `" + " ".join(search.fixed) + "`"]
    if search.best:
        best = search.best
        shown = " ".join(f"{k}={_value(v)}" for k, v in (best.get("params") or {}).items())
        lines += [
            "",
            f"Best: trial {best['number']}, {search.metric}={_value(best.get('value'))}: {shown} (job {best.get('job')})",
            "",
            f"Command: `{best.get('command')}`",
        ]
    else:
        lines += ["", "Best: none yet (no trial completed)."]
    columns = ["trial", "state", search.metric, *params, "job", "test/acc"]
    lines += ["", f"Trials, {best_first} {search.metric} first:", ""]
    lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for trial in ranked(search):
        state = trial["state"] + (f": {trial['reason']}" if trial["state"] == "FAIL" and trial.get("reason") else "")
        values = [_value((trial.get("params") or {}).get(k)) for k in params]
        job = trial.get("job")
        acc = test_acc.get(str(job)) if job is not None else None
        cells = [str(trial["number"]), state, _value(trial.get("value")), *values, str(job or "-"), _value(acc)]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def is_log(search: Search, key: str) -> bool:
    """Whether the space samples `key` on a log scale (its axis is then logarithmic)."""
    return bool(search.space.get(key, {}).get("log"))


def _axis(search: Search, ax: Axes, key: str, values: list[Any], which: str) -> list[float]:
    """Positions of `values` on the `which` ("x" or "y") axis of `ax`, set up for `key`: categories at
    0, 1, ... in the space's order, numbers as they are, on a log scale where the space says log."""
    dim = search.space.get(key, {})
    numeric = all(_finite(v) for v in values)
    if dim.get("kind") == "categorical" or not numeric:
        choices = list(dim.get("choices") or [])
        choices += [v for v in dict.fromkeys(values) if v not in choices]
        ticks = getattr(ax, f"set_{which}ticks")
        ticks(range(len(choices)), [_value(c) for c in choices])
        return [float(choices.index(v)) for v in values]
    if is_log(search, key):
        getattr(ax, f"set_{which}scale")("log")
    return [float(v) for v in values]


def history_figure(search: Search) -> Figure:
    """The objective of each trial by trial number, the best so far as a step line, failed trials marked
    along the bottom."""
    fig, (ax,) = plots.figure(7, 4.2)
    done = search.scored()
    pick = max if search.direction == "max" else min
    best: list[float] = []
    for trial in done:
        best.append(pick(best[-1], trial["value"]) if best else trial["value"])
    numbers = [t["number"] for t in done]
    ax.plot(numbers, [t["value"] for t in done], "o", color="tab:blue", label="trial")
    if done:
        # Held to the last trial: later trials that failed or did not beat it leave it as it was.
        last = max(t["number"] for t in search.trials)
        ax.step([*numbers, last], [*best, best[-1]], where="post", color="tab:orange", label="best so far")
    failed = [t["number"] for t in search.trials if t["state"] == "FAIL"]
    if failed:
        # Failed trials have no objective: x at their number, y at the bottom edge of the axes.
        ax.plot(failed, [0.02] * len(failed), "x", color="tab:red", transform=ax.get_xaxis_transform(), label="failed")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("trial")
    ax.set_ylabel(search.metric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{search.metric} per trial ({search.direction})")
    return fig


def params_figure(search: Search) -> Figure:
    """The objective against each searched parameter, one panel each."""
    params = search.params
    fig, axes = plots.figure(3.6 * max(1, len(params)), 3.6, ncols=max(1, len(params)))
    done = search.scored()
    for ax, key in zip(axes, params, strict=False):
        trials = [t for t in done if key in (t.get("params") or {})]
        xs = _axis(search, ax, key, [t["params"][key] for t in trials], "x")
        ax.plot(xs, [t["value"] for t in trials], "o", color="tab:blue")
        ax.set_xlabel(key)
        ax.set_ylabel(search.metric)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{search.metric} against each searched parameter")
    return fig


def pair_figure(search: Search) -> Figure:
    """The two searched parameters of every complete trial, coloured by the objective; the best circled."""
    x_key, y_key = search.params[:2]
    fig, (ax,) = plots.figure(6.4, 4.8)
    trials = [t for t in search.scored() if {x_key, y_key} <= set(t.get("params") or {})]
    xs = _axis(search, ax, x_key, [t["params"][x_key] for t in trials], "x")
    ys = _axis(search, ax, y_key, [t["params"][y_key] for t in trials], "y")
    # Better is brighter, whichever the direction.
    cmap = "viridis" if search.direction == "max" else "viridis_r"
    points = ax.scatter(xs, ys, c=[t["value"] for t in trials], cmap=cmap, s=60, edgecolors="black")
    if search.best and trials:
        index = next((i for i, t in enumerate(trials) if t["number"] == search.best["number"]), None)
        if index is not None:
            ax.scatter([xs[index]], [ys[index]], s=220, facecolors="none", edgecolors="tab:red", label="best")
            ax.legend(fontsize=8)
    if trials:
        fig.colorbar(points, ax=ax, label=search.metric)
    ax.set_xlabel(x_key)
    ax.set_ylabel(y_key)
    ax.grid(alpha=0.3)
    ax.set_title(f"{search.metric} of each trial")
    return fig


def write_search_plots(search: Search, out_dir: Path) -> list[Path]:
    """history.png, params.png and, with exactly two searched parameters, heatmap.png (their scatter)."""
    written = [
        plots.save(history_figure(search), out_dir / "history.png"),
        plots.save(params_figure(search), out_dir / "params.png"),
    ]
    if len(search.params) == 2:
        written.append(plots.save(pair_figure(search), out_dir / "heatmap.png"))
    return written


def search_outcome(sweep_dir: Path) -> tuple[str, bool] | None:
    """One line on how a search ended (trials done, failed with their reasons, the best), and whether any
    trial succeeded; None when the sweep was no search."""
    from hydralight.search import BEST_FILE, override_text

    if (search := load_search(sweep_dir)) is None:
        return None
    failed = [t for t in search.trials if t["state"] == "FAIL"]
    line = f"search {sweep_dir}: {len(search.scored())} of {len(search.trials)} trials done"
    if failed:
        line += (
            f", {len(failed)} failed ("
            + "; ".join(f"#{t['number']}: {(t['reason'] or '-')[:160]}" for t in failed)
            + ")"
        )
    if (best := search.best) is not None:
        shown = " ".join(override_text(k, v) for k, v in best["params"].items())
        line += f"; best {search.metric}={best['value']:.6g} (trial {best['number']}): {shown}"
    best_file = f"{sweep_dir / BEST_FILE}, " if (sweep_dir / BEST_FILE).is_file() else ""
    line += f"; details: {best_file}python scripts/sweep_report.py {sweep_dir}"
    return line, bool(search.scored())
