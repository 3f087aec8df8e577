"""The one line a sweep ends with: how many jobs finished, which failed and why (a search: its trials and
the best), read from the job dirs; exit code 1 when a job did not finish (a search: when no trial did)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from hydralight.errors import UserError
from hydralight.rundir.layout import SweepDir
from hydralight.rundir.outcome import read_search, sweep_line


def search_line(sweep_dir: Path) -> tuple[str, bool] | None:
    """One line on how a search ended (trials done, failed with their reasons, the best), and whether any
    trial succeeded; None when the sweep was no search."""
    from hydralight.launch.search import override_text

    if (search := read_search(sweep_dir)) is None:
        return None
    trials = search.get("trials") or []
    done = [t for t in trials if t.get("state") == "COMPLETE" and t.get("value") is not None]
    failed = [t for t in trials if t.get("state") == "FAIL"]
    line = f"search {sweep_dir}: {len(done)} of {len(trials)} trials done"
    if failed:
        line += (
            f", {len(failed)} failed ("
            + "; ".join(f"#{t['number']} failed: {(t.get('reason') or '-')[:160]}" for t in failed)
            + ")"
        )
    if (best := search.get("best")) is not None:
        metric = (search.get("objective") or {}).get("metric", "objective")
        shown = " ".join(override_text(k, v) for k, v in best["params"].items())
        line += f"; best {metric}={best['value']:.6g} (trial {best['number']}): {shown}"
    best_file = SweepDir(sweep_dir).best
    line += f"; details: {f'{best_file}, ' if best_file.is_file() else ''}python -m hydralight.report {sweep_dir}"
    return line, bool(done)


class SweepSummary(Callback):
    """Hydra callback: the one line a sweep ends with; exit code 1 when any job did not finish (a search:
    when no trial did)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if config.get("plan") is True:  # each job's plan printed, nothing run: one that was refused said why
            from hydralight.rundir.outcome import REFUSED_HERE

            if REFUSED_HERE:
                print(f"{len(REFUSED_HERE)} job(s) refused: their plans would not run", flush=True)
                raise SystemExit(1)
            return
        sweep_dir = Path(str(config.hydra.sweep.dir))
        try:
            # A search expects some trials to fail; it failed only when none succeeded.
            line, all_done = search_line(sweep_dir) or sweep_line(sweep_dir)
        except UserError:
            return  # no job ran (a dry run, a plan-only sweep)
        print(line, flush=True)
        if not all_done:
            raise SystemExit(1)
