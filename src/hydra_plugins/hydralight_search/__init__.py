"""Hydra finds sweepers only under `hydra_plugins`: the class is declared here, its logic lives in
`hydralight.launch.search`. Kept light: Hydra imports this module on every start (Optuna is imported by a search only)."""

from hydra.core.config_store import ConfigStore

from hydralight.launch.search import OptunaSearch as _Search
from hydralight.launch.search import OptunaSearchConf


class OptunaSearch(_Search):
    """hydra/sweeper=optuna: Optuna's TPE over `hydra.sweeper.params`, trials through the configured launcher."""


ConfigStore.instance().store(
    group="hydra/sweeper", name="hydralight_optuna", node=OptunaSearchConf, provider="hydralight"
)
