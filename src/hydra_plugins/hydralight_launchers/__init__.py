"""Hydra finds launchers only under `hydra_plugins`: the classes are declared here, their logic lives in
`hydralight.launch.launchers`. Kept light: Hydra imports this module on every start."""

from hydra.core.config_store import ConfigStore
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
