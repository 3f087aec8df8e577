"""Hyperparameter search: a Hydra sweeper that asks Optuna for trials and runs them through the configured
launcher (one after another, as local processes, or as SLURM jobs), `hydra.sweeper.n_jobs` at a time.

Written here rather than taken from hydra-optuna-sweeper: its last release pins optuna<3, whose SQLite
storage fails under SQLAlchemy 2, and one failing trial aborts its whole search.

- The space is Hydra's sweep syntax (`choice(...)`, `range(...)`, `tag(log, interval(a, b))`), from
  `hydra.sweeper.params` and from sweep overrides on the command line; plain overrides go to every trial.
- Values of a choice that the resource plan refuses (a batch size that does not split over the devices)
  are left out before the search starts; a sampled trial the plan refuses is told to Optuna as failed, with
  its reason, and never launched. A trial whose job fails (NaN loss, crash, killed) counts as failed.
- With a storage (by default an SQLite file in the sweep dir), the same command continues the study: it
  runs trials until the study holds `n_trials`, and a trial left running by a stopped search runs again in
  its own job dir, continuing from its checkpoint.
- `search.json` (every trial) and `best.yaml` (the best trial and the command that reproduces it) are
  written into the sweep dir after every batch.
- `seeds: N` scores a trial by the mean of N runs at seeds seed, seed + 1, ... (one job each): one seed's
  luck no longer picks the setting. A trial with a failed run fails; each run's value is in search.json.
"""

from __future__ import annotations

import json
import logging
import shlex
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep, Transformer
from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig, OmegaConf

from hydralight.config.schema import override_key
from hydralight.errors import UserError, exit_on_user_error, require
from hydralight.launch.launchers import check_launcher
from hydralight.rundir.layout import SweepDir
from hydralight.rundir.outcome import read_job
from hydralight.rundir.record import discard_unused_run_dir, read_json, sweep_dir_kept_as_it_was
from hydralight.rundir.redaction import redact, redact_sweep_record

if TYPE_CHECKING:
    from hydra.plugins.launcher import Launcher
    from hydra.types import HydraContext

log = logging.getLogger(__name__)


@dataclass
class OptunaSearchConf:
    _target_: str = "hydra_plugins.hydralight_search.OptunaSearch"
    # Trials the study holds when the search ends (a rerun with a storage runs only the missing ones).
    n_trials: int = 20
    # Trials launched together: processes with hydra/launcher=local, jobs with hydra/launcher=slurm.
    n_jobs: int = 1
    # The sampler's seed: the same command proposes the same trials.
    seed: int | None = None
    # TPE samples at random until this many trials have finished.
    n_startup_trials: int = 10
    study_name: str | None = "search"  # null (a template preset's): "search"
    # An Optuna storage URL (e.g. sqlite:///search.db); null keeps the study in memory (no resume).
    storage: str | None = None
    params: dict[str, str | None] = field(default_factory=dict)  # null: a preset dimension left out
    # Trials to run first, before sampling (a baseline, settings known to work): [{optim.lr: 1e-3}, ...].
    enqueue: list[dict[str, Any]] = field(default_factory=list)
    # Runs per trial, at seeds seed, seed + 1, ...: the trial's value is their mean.
    seeds: int = 1


@dataclass
class Dimension:
    """One searched parameter: its Optuna distribution and how the report should draw it."""

    key: str
    distribution: Any

    def describe(self) -> dict[str, Any]:
        import optuna

        d = self.distribution
        if isinstance(d, optuna.distributions.CategoricalDistribution):
            return {"kind": "categorical", "choices": list(d.choices)}
        kind = "int" if isinstance(d, optuna.distributions.IntDistribution) else "float"
        return {"kind": kind, "low": d.low, "high": d.high, "step": d.step, "log": d.log}


def to_dimension(override: Override) -> Dimension:
    """Hydra sweep syntax -> an Optuna distribution; a glob, a non-sweep value or an empty range is refused."""
    value = override.value()
    tags: set[str] = getattr(value, "tags", set()) or set()
    if unknown := tags - {"log", "int"}:
        raise UserError(f"{override.input_line}: unknown tag {', '.join(sorted(unknown))}; the tags are log and int")
    try:
        return _dimension(override, value, tags)
    except (ValueError, IndexError, TypeError) as err:
        raise UserError(f"{override.input_line} is not a range Optuna can sample: {err}") from None


def _dimension(override: Override, value: Any, tags: set[str]) -> Dimension:
    import optuna.distributions as dist

    key = override.get_key_element()
    if isinstance(value, ChoiceSweep):
        # Hydra's choices may be lists or dicts, which Optuna takes as given (with a warning): not narrowed.
        choices: list[Any] = list(override.sweep_iterator(transformer=Transformer.identity))
        return Dimension(key, dist.CategoricalDistribution(choices))
    if isinstance(value, IntervalSweep):
        low, high = value.start, value.end
        if low is None or high is None:
            raise ValueError("an interval needs both ends")
        if "int" in tags:
            return Dimension(key, dist.IntDistribution(int(low), int(high), log="log" in tags))
        return Dimension(key, dist.FloatDistribution(float(low), float(high), log="log" in tags))
    if isinstance(value, RangeSweep):
        values: list[Any] = list(override.sweep_iterator(transformer=Transformer.identity))
        if not values:
            raise ValueError("the range is empty")
        ints = [v for v in values if isinstance(v, int)]
        if len(ints) == len(values) and "log" not in tags:
            return Dimension(key, dist.IntDistribution(ints[0], ints[-1], step=int(value.step)))
        return Dimension(key, dist.CategoricalDistribution(values))
    raise UserError(
        f"{override.input_line} cannot be searched; use choice(a, b, ...), range(start, stop, step) "
        "or interval(low, high), tagged log or int: e.g. optim.lr='tag(log, interval(1e-4, 1e-1))'"
    )


def override_text(key: str, value: Any) -> str:
    """`key=value` as Hydra parses it back to the same value."""
    if isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, float):
        text = repr(value)
    elif isinstance(value, str):
        text = value if _parses_back(key, value, value) else "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    else:
        text = str(value)
    return f"{key}={text}"


def _parses_back(key: str, text: str, value: Any) -> bool:
    try:
        (parsed,) = OverridesParser.create().parse_overrides([f"{key}={text}"])
    except Exception:
        return False
    return not parsed.is_sweep_override() and parsed.value() == value and type(parsed.value()) is type(value)


def reproduce_command(overrides: list[str], seeds: list[int] | None = None) -> str:
    """The single run a trial was, its overrides without the search preset; a trial of several seeds: the
    sweep over them (which hydralight.report reports as one row)."""
    from hydralight.config.compose import SEARCH_GROUP

    kept = [o for o in overrides if override_key(o) != SEARCH_GROUP]
    if not seeds or len(seeds) == 1:
        return " ".join(["python train.py", *(shlex.quote(o) for o in kept)])
    kept = [o for o in kept if override_key(o) != "seed"] + ["seed=" + ",".join(map(str, seeds))]
    return " ".join(["python train.py", "-m", *(shlex.quote(o) for o in kept)])


class OptunaSearch(Sweeper):
    """`hydra/sweeper=optuna`: see the module docstring."""

    # Set by setup(), which Hydra calls before sweep(): never None here (Sweeper declares them Optional).
    hydra_context: HydraContext
    config: DictConfig
    launcher: Launcher

    def __init__(
        self,
        n_trials: int,
        n_jobs: int,
        seed: int | None,
        n_startup_trials: int,
        study_name: str | None,
        storage: str | None,
        params: dict[str, str | None] | None,
        enqueue: list[dict[str, Any]] | None = None,
        seeds: int = 1,
    ) -> None:
        self.n_trials, self.n_jobs, self.seed, self.seeds = n_trials, n_jobs, seed, seeds
        self.n_startup_trials, self.study_name, self.storage = n_startup_trials, study_name or "search", storage
        self.params = dict(params or {})
        self.enqueue = [dict(OmegaConf.to_container(t) if isinstance(t, DictConfig) else t) for t in enqueue or []]

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        require("optuna", "search", "hparams_search=optuna")
        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )
        self.sweep_dir = Path(str(config.hydra.sweep.dir))
        self.files = SweepDir(self.sweep_dir)
        self.executor = getattr(self.launcher, "_EXECUTOR", "local")

    # -- the search ---------------------------------------------------------------------------------

    @exit_on_user_error
    def sweep(self, arguments: list[str]) -> list[Any]:
        from hydralight.rundir.lock import RunDirLock

        try:
            check_launcher(self.config)
            self._check_settings()
            fixed, space = self._split(arguments)
            if self.seeds > 1 and "seed" in space:
                raise UserError(
                    f"hydra.sweeper.seeds={self.seeds} runs every trial at seeds seed, seed + 1, ...; seed cannot "
                    "be searched as well: leave it out of the space, or set hydra.sweeper.seeds=1"
                )
            # What every trial shares is checked first, so a refusal there is not blamed on a searched key.
            if (reason := self._refusal(fixed)) is not None and not any(key in reason for key in space):
                raise UserError(f"every trial would be refused: {reason}")
            space = {key: self._feasible(dim, fixed) for key, dim in space.items()}
            self._check_enqueue(space)
        except UserError:
            discard_unused_run_dir(self.sweep_dir)  # refused before any trial: no sweep dir left behind
            raise
        self.fixed, self.space = fixed, space
        if self.config.get("plan"):  # the plan of the config every trial starts from; no trial runs, no study
            log.info(f"plan=true: none of the search's {self.n_trials} trials runs; the plan of the config they share:")
            with sweep_dir_kept_as_it_was(self.config):
                return list(self.launcher.launch([fixed], initial_job_idx=0))
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        # One search process per sweep dir: a second one would take the first one's running trials for stopped.
        with RunDirLock(self.sweep_dir):
            study = self._study()
            OmegaConf.save(self.config, self.sweep_dir / "multirun.yaml")
            redact_sweep_record(self.sweep_dir)  # the command line as given: secrets out
            return self._search(study)

    def _search(self, study: Any) -> list[Any]:
        import optuna

        running = optuna.trial.TrialState.RUNNING
        # Trials a stopped search left running: run again in their own job dirs (they continue from there);
        # one stopped before it had a job dir never ran.
        stale = [t for t in study.trials if t.state == running and "job" in t.user_attrs]
        for trial in study.trials:
            if trial.state == running and "job" not in trial.user_attrs:
                study.tell(trial.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
        if stale:
            log.info(f"continuing study {self.study_name}: {len(study.trials)} trial(s) so far, {len(stale)} to rerun")
        next_job = self._next_job_number()
        returns: list[Any] = []
        while True:
            batch = stale[: self.n_jobs]
            stale = stale[self.n_jobs :]
            rerun = bool(batch)
            while not rerun and len(batch) < self.n_jobs and self._counted(study) < self.n_trials:
                trial = study.ask({key: dim.distribution for key, dim in self.space.items()})
                overrides = self._overrides(trial.params)
                if (reason := self._refusal(overrides)) is not None:
                    log.warning(f"trial {trial.number} not run: {reason}")
                    trial.set_user_attr("reason", reason)
                    study.tell(trial, state=optuna.trial.TrialState.FAIL)
                    continue
                trial.set_user_attr("overrides", redact(overrides))  # the study's storage is a file too
                first = next_job + len(batch) * self.seeds
                trial.set_user_attr("job", str(first))
                if self.seeds > 1:  # one job per seed, numbered one after another
                    trial.set_user_attr("jobs", [str(first + i) for i in range(self.seeds)])
                    trial.set_user_attr("seeds", [int(self.config.seed) + i for i in range(self.seeds)])
                batch.append(trial)
            if not batch:
                break
            returns += self._run(study, batch, rerun, next_job)
            next_job = self._next_job_number()
            self._write_results(study)
        self._write_results(study)
        return returns

    @staticmethod
    def _counted(study: Any) -> int:
        """Trials that count towards n_trials: every one but those enqueued and not yet started."""
        import optuna

        return sum(t.state != optuna.trial.TrialState.WAITING for t in study.trials)

    def _study(self) -> Any:
        """The study, new or continued: a continued one must search the same way (direction, objective, fixed
        overrides, space); its sampler is seeded past the trials it has, so it proposes new ones."""
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        direction: Literal["minimize", "maximize"] = (
            "maximize" if str(self.config.objective.direction) == "max" else "minimize"
        )
        try:
            study = optuna.create_study(
                study_name=self.study_name, storage=self.storage, direction=direction, load_if_exists=True
            )
        except Exception as err:  # an unreachable or unreadable storage
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise UserError(f"cannot open the study storage {self.storage}: {reason}") from None
        metric = str(self.config.objective.metric)
        if not study.trials:
            study.set_user_attr("metric", metric)
            study.set_user_attr("fixed", redact(self.fixed))
            study.set_user_attr("seeds", self.seeds)
        again = "set hydra.sweeper.study_name (or another hydra.sweep.dir) to start another study"
        if study.direction.name.lower() != direction or study.user_attrs.get("metric", metric) != metric:
            raise UserError(
                f"the study {self.study_name} was made to {study.direction.name.lower()} "
                f"{study.user_attrs.get('metric')}, not to {direction} {metric}; {again}"
            )
        if sorted(study.user_attrs.get("fixed", redact(self.fixed))) != sorted(redact(self.fixed)):
            was = " ".join(study.user_attrs["fixed"]) or "(none)"
            raise UserError(
                f"the study {self.study_name} ran its trials with {was}, not {' '.join(self.fixed)}; {again}"
            )
        if (before := study.user_attrs.get("seeds", 1)) != self.seeds:
            raise UserError(
                f"the study {self.study_name} scored each trial over {before} seed(s), not {self.seeds}; "
                f"set hydra.sweeper.seeds={before} to continue it, or {again}"
            )
        self._check_same_space(study, self.space)
        seed = None if self.seed is None else self.seed + len(study.trials)
        # constant_liar: trials launched together are proposed knowing the others are running.
        study.sampler = optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=self.n_startup_trials, constant_liar=self.n_jobs > 1
        )
        if not study.trials:  # the given trials first (a continued study ran them already)
            for params in self.enqueue:
                study.enqueue_trial(params)
        return study

    def _check_settings(self) -> None:
        for key, value in (("n_trials", self.n_trials), ("n_jobs", self.n_jobs), ("seeds", self.seeds)):
            if value < 1:
                raise UserError(f"hydra.sweeper.{key}={value} must be at least 1")
        sweep = OmegaConf.to_container(self.config.hydra.sweep, resolve=False)
        assert isinstance(sweep, dict)  # hydra.sweep is a config node
        subdir = sweep.get("subdir")
        if subdir != "${hydra.job.num}":
            raise UserError(
                f"a search finds its trials' results in numbered job dirs: leave hydra.sweep.subdir at "
                f"${{hydra.job.num}} (not {subdir})"
            )
        self._check_objective()

    def _check_objective(self) -> None:
        """A search needs an objective on validation: not a test metric, and a module with a validation step."""
        import pytorch_lightning as pl

        from hydralight.config.resolve import check_objective
        from hydralight.training.modules import module_class

        check_objective(str(self.config.objective.metric))
        model = self.config.get("model") or {}
        target = model.get("_target_")
        if target is None:
            return  # refused with the trials' own config check
        cls = module_class({"_target_": target})
        if cls.validation_step is pl.LightningModule.validation_step:
            raise UserError(
                f"a search tunes {self.config.objective.metric}, a validation metric, and {cls.__name__} has no "
                "validation_step; give it one that logs the metric (self.log(...)), then set objective.metric"
            )

    def _check_enqueue(self, space: dict[str, Dimension]) -> None:
        for params in self.enqueue:
            if unknown := set(params) - set(space):
                raise UserError(f"hydra.sweeper.enqueue names {', '.join(sorted(unknown))}, which is not searched")
            for key, value in params.items():
                choices = getattr(space[key].distribution, "choices", None)
                if choices is not None and value not in choices:
                    raise UserError(
                        f"hydra.sweeper.enqueue has {key}={value}, not one of the values searched "
                        f"({', '.join(map(str, choices))})"
                    )

    def _run(self, study: Any, batch: list[Any], rerun: bool, next_job: int) -> list[Any]:
        """Launch the jobs of one batch of trials (one per trial and seed), then tell Optuna each trial's
        objective (or that it failed)."""
        import optuna

        # What a trial ran is its params and the fixed overrides (the storage has no secret's value).
        runs = [(int(job), trial, overrides) for trial in batch
                for job, overrides in zip(_jobs(trial.user_attrs), self._run_overrides(trial), strict=True)]  # fmt: skip
        returns = []
        # A launcher numbers the jobs of one call consecutively; reruns keep their own numbers.
        for first, group in self._consecutive(runs) if rerun else [(next_job, runs)]:
            for job, trial, overrides in group:
                log.info(f"trial {trial.number} (job {job}): {' '.join(overrides)}")
            returns += list(self.launcher.launch([o for _, _, o in group], initial_job_idx=first))
        for trial in batch:
            value, reason, _ = self._trial_outcome(trial.user_attrs)
            if value is None:
                log.warning(f"trial {trial.number} failed: {reason}")
                study.tell(trial.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
            else:
                log.info(f"trial {trial.number}: {self.config.objective.metric}={value:.6g}")
                study.tell(trial.number, value, skip_if_finished=True)
        return returns

    def _run_overrides(self, trial: Any) -> list[list[str]]:
        """The overrides of each job of a trial: its params and the fixed ones, and with several seeds its own
        seed (a fixed `seed=` is where they start, not a value they share)."""
        overrides = self._overrides(trial.params)
        seeds = trial.user_attrs.get("seeds")
        if not seeds:
            return [overrides]
        return [[*(o for o in overrides if override_key(o) != "seed"), f"seed={seed}"] for seed in seeds]

    def _check_same_space(self, study: Any, space: dict[str, Dimension]) -> None:
        """A continued study keeps each parameter's kind and choices (Optuna refuses them changed mid-study)."""
        for trial in study.trials:
            for key, before in trial.distributions.items():
                if (now := space.get(key)) is None:
                    continue
                if type(now.distribution) is not type(before) or (
                    hasattr(before, "choices") and now.distribution != before
                ):
                    raise UserError(
                        f"the study {self.study_name} searched {key} as {before}, now {now.distribution}; "
                        "search the same space to continue it, or set hydra.sweeper.study_name to start another"
                    )

    @staticmethod
    def _consecutive(runs: list[tuple[int, Any, list[str]]]) -> list[tuple[int, list[tuple[int, Any, list[str]]]]]:
        """Runs (job number first) in launches of consecutive job numbers, each with its first number."""
        groups: list[tuple[int, list[tuple[int, Any, list[str]]]]] = []
        for run in sorted(runs, key=lambda run: run[0]):
            if groups and groups[-1][0] + len(groups[-1][1]) == run[0]:
                groups[-1][1].append(run)
            else:
                groups.append((run[0], [run]))
        return groups

    # -- the space ----------------------------------------------------------------------------------

    def _split(self, arguments: list[str]) -> tuple[list[str], dict[str, Dimension]]:
        """Overrides every trial gets, and the searched dimensions (the command line's win over the preset's)."""
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        # A preset dimension set to null on the command line ('hydra.sweeper.params={optim.lr: null}') is left out.
        preset = [f"{key}={value}" for key, value in self.params.items() if value is not None]
        try:
            parsed = parser.parse_overrides(preset + list(arguments))
        except Exception as err:
            raise UserError(f"cannot read the search space: {str(err).strip().splitlines()[0]}") from None
        fixed: dict[str, str] = {}
        space: dict[str, Dimension] = {}
        for override in parsed:
            key = override.get_key_element()
            fixed.pop(key, None)
            space.pop(key, None)
            if override.is_sweep_override():
                space[key] = to_dimension(override)
            else:
                assert override.input_line is not None  # the parser sets it on every override
                fixed[key] = override.input_line
        given = {str(o.get_key_element()).lstrip("+~") for o in parsed[len(preset) :]}
        if "optim.lr" in space and "optim.lr" not in given:
            # The preset's learning rate would reach no constructor, or contradict model.lr: every trial refused.
            why = (
                "model.lr is given"
                if "model.lr" in given
                else None
                if self._module_takes_lr()
                else "your module takes no lr argument"
            )
            if why is not None:
                del space["optim.lr"]
                log.info(f"the search leaves the preset's optim.lr out: {why}")
        if not space:
            raise UserError(
                "nothing to search: give hydra.sweeper.params or a sweep override such as "
                "optim.lr='tag(log, interval(1e-4, 1e-1))'"
            )
        return list(fixed.values()), space

    def _module_takes_lr(self) -> bool:
        """Whether the sweep's module takes a learning rate."""
        from hydralight.config.binding import accepted_arguments, import_target

        target = OmegaConf.select(self.config, "model._target_")
        if target is None:
            return True  # the trials say that the model names no module
        try:
            names, takes_any = accepted_arguments(import_target(str(target), "model._target_"))
        except UserError:
            return True  # the trials say why it cannot be built
        return takes_any or "lr" in names

    def _feasible(self, dim: Dimension, fixed: list[str]) -> Dimension:
        """The dimension without the choices the resource plan refuses (checked with every other key as given)."""
        import optuna.distributions as dist

        if not isinstance(dim.distribution, dist.CategoricalDistribution):
            # An interval is kept when either end can run (a misspelt key cannot: refused here, once).
            ends = [dim.distribution.low, dim.distribution.high]
            reasons = [self._refusal([*fixed, override_text(dim.key, value)]) for value in ends]
            if all(reasons):
                raise UserError(f"{dim.key} cannot be searched: {reasons[0]}")
            return dim
        kept = []
        for value in dim.distribution.choices:
            if (reason := self._refusal([*fixed, override_text(dim.key, value)])) is None:
                kept.append(value)
            else:
                log.warning(f"{dim.key}={value} left out of the search: {reason}")
        if not kept:
            raise UserError(f"every value of {dim.key} is refused; the last: {reason}")
        return Dimension(dim.key, dist.CategoricalDistribution(kept))

    def _overrides(self, params: dict[str, Any]) -> list[str]:
        return [*self.fixed, *(override_text(key, value) for key, value in params.items())]

    def _refusal(self, overrides: list[str]) -> str | None:
        """Why the job with these overrides cannot run (its config or its plan), or None."""
        from hydralight.config.schema import explain
        from hydralight.launch.launchers import job_resources

        try:
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        except Exception as err:
            return explain(err, overrides)
        try:
            job_resources(cfg, self.executor)
        except UserError as err:
            return str(err)
        return None

    # -- results ------------------------------------------------------------------------------------

    def _next_job_number(self) -> int:
        numbers = [int(p.name) for p in self.sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()]
        # Submitted jobs that have not made their dir yet.
        numbers += [int(n) for n in read_json(self.files.jobs) or {} if n.isdigit()]
        return max(numbers, default=-1) + 1

    def _outcome(self, job: str) -> tuple[float | None, str | None]:
        """A trial's objective from its job's results, or why there is none (from its manifest)."""
        outcome = read_job(self.files.job(job).path)
        metric, value = outcome.objective
        if outcome.results is not None:
            if value is not None:
                return value, None
            return (
                None,
                f"{metric or self.config.objective.metric} is {(outcome.results.get('objective') or {}).get('value')} (never validated?)",
            )
        if outcome.manifest:  # said as "trial N failed: <reason>", or "... failed: interrupted: <reason>"
            reason = outcome.reason or "-"
            return None, reason if outcome.status == "failed" else f"{outcome.status}: {reason}"
        where = f"{self.sweep_dir / '.submitit'}" if hasattr(self.launcher, "_EXECUTOR") else "the output above"
        return None, f"the job wrote no result; see its log in {where}"

    def _trial_outcome(self, attrs: dict[str, Any]) -> tuple[float | None, str | None, list[dict[str, Any]]]:
        """A trial's value (the mean over its seeds' jobs), or why there is none; and each seed's job and value."""
        runs = []
        reasons: list[str] = []
        for job, seed in zip(_jobs(attrs), attrs.get("seeds") or [None], strict=True):
            value, reason = self._outcome(job)
            runs.append({"seed": seed, "job": job, "value": value})
            if value is None:
                reasons.append(f"{reason or '-'}" if seed is None else f"seed {seed} (job {job}): {reason or '-'}")
        if reasons:
            return None, "; ".join(reasons), runs
        return statistics.fmean(r["value"] for r in runs), None, runs

    def _write_results(self, study: Any) -> None:
        import optuna

        trials = []
        for t in study.trials:
            job = t.user_attrs.get("job")
            reason = t.user_attrs.get("reason")
            if t.state == optuna.trial.TrialState.FAIL and reason is None and job is not None:
                reason = self._trial_outcome(t.user_attrs)[1]
            trial = {"number": t.number, "state": t.state.name, "value": t.value, "params": t.params, "job": job,
                     "reason": reason}  # fmt: skip
            if "seeds" in t.user_attrs:  # each seed's job and value: the spread behind the mean
                trial |= {"jobs": _jobs(t.user_attrs), "seeds": self._trial_outcome(t.user_attrs)[2]}
            trials.append(trial)
        best = None
        if any(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials):
            b = study.best_trial
            overrides = b.user_attrs.get("overrides") or self._overrides(b.params)
            best = {"number": b.number, "value": b.value, "params": b.params, "job": b.user_attrs.get("job"),
                    "command": reproduce_command(overrides, b.user_attrs.get("seeds"))}  # fmt: skip
            if "seeds" in b.user_attrs:
                best |= {"jobs": _jobs(b.user_attrs), "seeds": self._trial_outcome(b.user_attrs)[2]}
        objective = {"metric": str(self.config.objective.metric), "direction": str(self.config.objective.direction)}
        summary = {
            "objective": objective,
            "study_name": self.study_name,
            "storage": self.storage,
            "fixed": self.fixed,
            "seeds": self.seeds,
            "space": {key: dim.describe() for key, dim in self.space.items()},
            "trials": trials,
            "best": best,
        }
        self.files.search.write_text(json.dumps(redact(summary), indent=2) + "\n")
        if best is not None:
            job = self.files.job(best["job"])
            tests = [(read_json(self.files.job(j).results) or {}).get("test") or {} for j in _jobs(best)]
            # Over several seeds: each test metric's mean (shown, never used to choose).
            numbers = [k for k in tests[0] if all(isinstance(t.get(k), int | float) for t in tests)]
            test = tests[0] if len(tests) == 1 else {k: statistics.fmean(t[k] for t in tests) for k in numbers}
            best_file = {**objective, **best, "job_dir": str(job.path), "test": test}
            self.files.best.write_text(yaml.safe_dump(redact(best_file), sort_keys=False))


def _jobs(attrs: dict[str, Any]) -> list[str]:
    """The job dirs of a trial: one per seed."""
    return list(attrs.get("jobs") or [attrs["job"]])
