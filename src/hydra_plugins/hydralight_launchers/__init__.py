"""Hydra finds launchers and search path plugins only under `hydra_plugins`: the classes are declared here, the
launchers' logic lives in `hydralight.launch.launchers`. Kept light: Hydra imports this module on every start."""

from collections.abc import Sequence
from dataclasses import dataclass

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.config_store import ConfigStore
from hydra.plugins.search_path_plugin import SearchPathPlugin
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher, SlurmLauncher

from hydralight.config.compose import jobs_to_check, sweep_checked
from hydralight.config.folders import user_conf
from hydralight.config.hydra_internals import basic_sweeper
from hydralight.launch.launchers import HydralightLocalConf, HydralightSlurmConf, PlannedLauncherMixin


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
    """hydra/sweeper=hydralight_basic (the default): Hydra's basic sweeper, whose check of a batch before it
    launches composes the jobs `train.py` did not check already, and of a large sweep only those that give each
    swept value once: its first job starts in seconds, not after composing every job of a 10,000-job grid."""

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        if sweep_checked(len(batch)):
            return
        groups = frozenset(str(name) for name in self.config.hydra.runtime.choices)
        super().validate_batch_is_legal([job for _, job in jobs_to_check(batch, groups)])


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
