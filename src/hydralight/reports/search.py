"""The search part of a sweep report: the trials of a hyperparameter search (the sweep dir's search.json,
written by the search sweeper), ranked by the study's objective, and Optuna's own plots of the study
(optimization history, slices, contour, parameter importances)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

from hydralight.reports import plots
from hydralight.rundir.layout import SweepDir
from hydralight.rundir.outcome import read_search

if TYPE_CHECKING:
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
    seeds: int = 1  # runs per trial, at seeds seed, seed + 1, ...: a trial's value is their mean

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
    if (data := read_search(sweep_dir)) is None:
        return None
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
        seeds=int(data.get("seeds") or 1),
    )


def _finite(value: Any) -> TypeGuard[int | float]:
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


def search_lines(search: Search, test: dict[str, float | None], test_name: str) -> list[str]:
    """The markdown of the search section: objective, best trial, and the table of trials. `test`: each job
    folder's test metric `test_name`, shown and never used to choose."""
    params = search.params
    states = [t["state"] for t in search.trials]
    counts = ", ".join(f"{states.count(s)} {STATE_WORDS.get(s, s.lower())}" for s in dict.fromkeys(states))
    best_first = "highest" if search.direction == "max" else "lowest"
    lines = [
        "## Search",
        "",
        f"Objective: {search.metric}, {search.direction} (a validation metric; {test_name} is reported, not used "
        f"to choose). Study `{search.study_name}`, storage {search.storage or 'in memory'}; "
        f"{len(search.trials)} trials: {counts or 'none yet'}."
        + (f" Each trial's value is the mean over {search.seeds} seeds." if search.seeds > 1 else ""),
    ]
    if search.fixed:
        lines += ["", "Every trial: `" + " ".join(search.fixed) + "`"]
    if search.best:
        best = search.best
        shown = " ".join(f"{k}={_value(v)}" for k, v in (best.get("params") or {}).items())
        jobs = f"jobs {', '.join(best['jobs'])}" if best.get("jobs") else f"job {best.get('job')}"
        lines += [
            "",
            f"Best: trial {best['number']}, {search.metric}={_value(best.get('value'))}: {shown} ({jobs})",
            "",
            f"Command: `{best.get('command')}`",
        ]
    else:
        lines += ["", "Best: none yet (no trial completed)."]
    seeded = any(t.get("seeds") for t in search.trials)
    # A trial scored over several seeds: each seed's value beside the mean, its jobs, their mean test metric.
    columns = ["trial", "state", search.metric, *(["per seed"] if seeded else []), *params, "job", test_name]
    lines += ["", f"Trials, {best_first} {search.metric} first:", ""]
    lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for trial in ranked(search):
        state = trial["state"] + (f": {trial['reason']}" if trial["state"] == "FAIL" and trial.get("reason") else "")
        values = [_value((trial.get("params") or {}).get(k)) for k in params]
        trial_jobs = [str(j) for j in trial.get("jobs") or ([trial["job"]] if trial.get("job") is not None else [])]
        tests = [v for j in trial_jobs if isinstance(v := test.get(j), int | float) and math.isfinite(v)]
        mean_test = statistics.fmean(tests) if tests and len(tests) == len(trial_jobs) else None
        per_seed = [", ".join(f"{r.get('seed')}: {_value(r.get('value'))}" for r in trial.get("seeds") or [])]
        cells = [str(trial["number"]), state, _value(trial.get("value")), *(per_seed if seeded else []), *values,
                 ", ".join(trial_jobs) or "-", _value(mean_test)]  # fmt: skip
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def load_study(search: Search, sweep_dir: Path) -> Any:
    """The Optuna study of a search, from its storage: the sweep dir's own SQLite file when it is there (the
    recorded URL may be relative to where the search ran), else the recorded URL; None without a storage."""
    import optuna

    study_file = SweepDir(sweep_dir).study
    storage = f"sqlite:///{study_file.resolve()}" if study_file.is_file() else search.storage
    if not storage or not search.study_name:
        return None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.load_study(study_name=search.study_name, storage=storage)
    except Exception:  # a storage that is gone or unreachable: the table still stands
        return None


def _plot(draw: Any, study: Any, **kwargs: Any) -> Figure | None:
    """One of optuna.visualization.matplotlib's plots of `study`, as a figure; None when the study has too few
    trials for it (Optuna warns or refuses)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # experimental-API and too-few-trials warnings
        try:
            drawn = draw(study, **kwargs)
        except (ValueError, RuntimeError, ZeroDivisionError):
            return None
    ax = drawn.ravel()[0] if hasattr(drawn, "ravel") else drawn
    if not ax.has_data() and not ax.images and not ax.collections:
        return None
    return ax.figure


# Complete trials a contour or an importance estimate needs before it says more than its noise (Optuna's fANOVA
# importances fit a random forest to the trials; a contour interpolates between them).
MIN_TRIALS_FOR_SURFACE = 10


def surface_note(search: Search) -> str | None:
    """Why contour.png and importances.png are not drawn (too few complete trials), or None."""
    scored = len(search.scored())
    if len(search.params) < 2 or scored >= MIN_TRIALS_FOR_SURFACE:
        return None
    return (
        f"contour and parameter importances are drawn from {MIN_TRIALS_FOR_SURFACE} complete trials or more; this "
        f"search has {scored}, so they are left out (raise hydra.sweeper.n_trials)"
    )


def write_search_plots(search: Search, sweep_dir: Path, out_dir: Path) -> list[Path]:
    """Optuna's plots of the study: history.png (objective per trial, best so far), slice.png (objective
    against each parameter) and, with two parameters or more and enough trials (`surface_note`), contour.png
    and importances.png."""
    import matplotlib

    matplotlib.use("Agg")  # Optuna draws with pyplot; reports run on machines without a display
    from matplotlib import pyplot as plt
    from optuna.visualization import matplotlib as optuna_plots

    study = load_study(search, sweep_dir)
    if study is None or not search.scored():
        return []
    named: dict[str, Any] = {"target_name": search.metric}  # the axis says val/acc, not "Objective Value"
    wanted = [("history", optuna_plots.plot_optimization_history, named), ("slice", optuna_plots.plot_slice, named)]
    if len(search.params) >= 2 and surface_note(search) is None:
        wanted += [("contour", optuna_plots.plot_contour, {"params": search.params[:2], **named}),
                   ("importances", optuna_plots.plot_param_importances, named)]  # fmt: skip
    written = []
    for name, draw, kwargs in wanted:
        fig = _plot(draw, study, **kwargs)
        if fig is None:
            continue
        fig.set_size_inches(max(6.0, fig.get_size_inches()[0]), max(4.0, fig.get_size_inches()[1]))
        written.append(plots.save(fig, out_dir / f"{name}.png"))
        plt.close(fig)
    return written
