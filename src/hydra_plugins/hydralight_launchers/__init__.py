"""Hydra finds launchers and search path plugins only under `hydra_plugins`: the classes are declared here, the
launchers' logic lives in `hydralight.launch.launchers`. Kept light: Hydra imports this module on every start."""

from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.config_store import ConfigStore
from hydra.plugins.search_path_plugin import SearchPathPlugin
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher, SlurmLauncher

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


class UserConfigs(SearchPathPlugin):
    """`./conf` of the folder a run starts from, after the shipped options, for every lookup Hydra makes: also
    the option lists behind `glob(...)`, which read no `hydra.searchpath` of the primary config."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        user = Path("conf")
        if user.is_dir():
            search_path.append(provider="hydralight-user", path=f"file://{user.resolve()}")
