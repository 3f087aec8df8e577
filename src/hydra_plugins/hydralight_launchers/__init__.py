"""Hydra finds launchers and search path plugins only under `hydra_plugins`: the classes are declared here, the
launchers' logic lives in `hydralight.launch.launchers`. Kept light: Hydra imports this module on every start."""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.plugins.search_path_plugin import SearchPathPlugin
from hydra.types import HydraContext
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher, SlurmLauncher
from omegaconf import DictConfig

from hydralight.config.compose import ComposedOnce, check_sweep
from hydralight.config.folders import user_conf
from hydralight.config.hydra_internals import basic_sweeper
from hydralight.errors import EXIT_USER_ERROR, UserError, exit_on_user_error
from hydralight.launch.launchers import HydralightLocalConf, HydralightSlurmConf, PlannedLauncherMixin, check_launcher
from hydralight.rundir.outcome import REFUSED_HERE
from hydralight.rundir.ownership import check_sweep_usable, claim_sweep_dir
from hydralight.rundir.record import discard_refused_sweep, sweep_dir_kept_as_it_was
from hydralight.rundir.redaction import SWEEP_RECORD


class PlannedSlurmLauncher(PlannedLauncherMixin, SlurmLauncher):
    """hydra/launcher=slurm: submitit's SLURM launcher, sized per job by the resource plan."""


class PlannedLocalLauncher(PlannedLauncherMixin, LocalLauncher):
    """hydra/launcher=local: submitit's local launcher, same interface as the SLURM one."""


ConfigStore.instance().store(
    group="hydra/launcher", name="hydralight_slurm", node=HydralightSlurmConf, provider="hydralight"
)
ConfigStore.instance().store(
    group="hydra/launcher", name="hydralight_local", node=HydralightLocalConf, provider="hydralight"
)


BasicSweeper, BasicSweeperConf = basic_sweeper()


class CheckedSweeper(BasicSweeper):  # type: ignore[misc]
    """hydra/sweeper=hydralight_basic (the default): Hydra's basic sweeper, checking every job's config before
    the sweep writes anything (of a large sweep those that give each swept value once: its first job starts in
    seconds, not after composing every job of a 10,000-job grid), and handing each config it composed to the
    launcher, which runs it as it is: a job is composed once."""

    def setup(self, *, hydra_context: HydraContext, task_function: Any, config: DictConfig) -> None:
        loader = ComposedOnce(hydra_context.config_loader)
        super().setup(
            hydra_context=HydraContext(config_loader=loader, callbacks=hydra_context.callbacks),
            task_function=task_function,
            config=config,
        )

    def sweep(self, arguments: list[str]) -> Any:
        # The sweep dir first (`multirun/${now:...}`): each job's config takes the time its sweep resolved.
        earlier = (Path(str(self.config.hydra.sweep.dir)) / SWEEP_RECORD).is_file()
        self._check([*self._parse_config(), *arguments])
        returns: list[Sequence[Any]] = []
        refused = False  # the launch refused in one line before any job ran (sbatch said no, a time limit)

        def unchanged() -> bool:  # only plans printed, or an earlier sweep's jobs all refused: its record stays
            ran = sum(len(batch) for batch in returns)
            return refused or self.config.get("plan") is True or (earlier and ran > 0 and len(REFUSED_HERE) == ran)

        with sweep_dir_kept_as_it_was(self.config, when=unchanged):
            self._claim_sweep_dir()
            try:
                returns.extend(super().sweep(arguments))
            except SystemExit as stop:
                refused = stop.code == EXIT_USER_ERROR and not returns
                raise
        return returns

    @exit_on_user_error
    def _claim_sweep_dir(self) -> None:
        """The sweep dir as Hydra worked it out (`${...}` in it: not known before Hydra started, where a named one
        was claimed), checked before the launcher writes its record there: a folder of the user's is refused as
        it is, nothing written (a job dir of the user's in it was refused only as its job started)."""
        path = Path(str(self.config.hydra.sweep.dir))
        if self.config.get("plan") is True:
            check_sweep_usable(path)
        else:
            claim_sweep_dir(path)

    @exit_on_user_error
    def _check(self, overrides: list[str]) -> None:
        from hydralight.config.resolve import check_task_values

        loader = self.hydra_context.config_loader
        groups = frozenset(str(name) for name in self.config.hydra.runtime.choices)
        parser = OverridesParser.create(config_loader=loader)
        try:
            check_launcher(self.config)
            check_sweep(
                overrides,
                groups,
                parser,
                lambda job: loader.keep(job, loader.load_sweep_config(self.config, job)),
                check_task_values,
            )
        except UserError:
            discard_refused_sweep(self.config)
            raise

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        """Checked in `sweep`, before anything was written (a job not composed there is checked as it starts)."""


@dataclass
class CheckedSweeperConf(BasicSweeperConf):  # type: ignore[misc]
    _target_: str = "hydra_plugins.hydralight_launchers.CheckedSweeper"


ConfigStore.instance().store(
    group="hydra/sweeper", name="hydralight_basic", node=CheckedSweeperConf, provider="hydralight"
)


class UserConfigs(SearchPathPlugin):
    """`./conf` of the folder a run starts from, after the shipped options, for every lookup Hydra makes: also
    the option lists behind `glob(...)`, which read no `hydra.searchpath` of the primary config."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        if (user := user_conf()) is not None:
            search_path.append(provider="hydralight-user", path=f"file://{user.resolve()}")
