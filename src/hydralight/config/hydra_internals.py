"""Every place the project reaches into Hydra's internals, behind one wall (as hydralight.lightning_internals
is Lightning's). Hydra 1.3 has no public API for these; tests/test_private_apis.py exercises each the way the
project uses it and names this module when one moves."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def basic_sweeper() -> tuple[Any, Any]:
    """Hydra's basic sweeper and its config: the only code that expands a command line's sweep into its jobs
    (the project's default sweeper, hydra_plugins.hydralight_launchers.CheckedSweeper, extends it). Read when
    asked: Hydra reloads its plugin modules as it scans them, and a class kept from before is another class."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper, BasicSweeperConf

    return BasicSweeper, BasicSweeperConf


def sweep_jobs(parsed: list[Any]) -> list[list[str]]:
    """The overrides of every job of a basic sweep over `parsed` (Hydra's parsed overrides), in Hydra's order."""
    sweeper, _ = basic_sweeper()
    return [job for batch in sweeper.split_arguments(parsed, None) for job in batch]


def hydra_args(argv: list[str]) -> tuple[Any, list[str]]:
    """The command line as `@hydra.main` reads it (Hydra's own argument parser), and what it would refuse."""
    from hydra._internal.utils import get_args_parser

    return get_args_parser().parse_known_args(argv)


@contextlib.contextmanager
def mode_known(mode: Any) -> Iterator[None]:
    """While Hydra starts the run: Hydra 1.3 composes the whole config once more only to read `hydra.mode`
    (`_run_hydra` -> the private `Hydra.get_mode`); the command line's check has read it already, so Hydra is
    told. tests/config/test_schema.py counts the compositions of a run."""
    from unittest import mock

    from hydra._internal.hydra import Hydra

    with mock.patch.object(Hydra, "get_mode", lambda self, config_name, overrides: mode):
        yield


@contextlib.contextmanager
def run_composed(cfg: Any, composed_with: list[str], multirun: bool = False) -> Iterator[None]:
    """While Hydra starts a run or a sweep: Hydra 1.3 composes its config itself (`Hydra.run`, `Hydra.multirun`
    -> the private `Hydra.compose_config`), and the command line's check has composed that config already, with
    the same overrides (`cfg`, Hydra's node included): it is handed over once, so that it is composed once. When
    no config sets the mode, Hydra composes with `hydra.mode=RUN` (`MULTIRUN`) added; it is set on `cfg` as that
    composition sets it. Any other composition (other overrides, a sweep job's) is Hydra's own. tests/test_private_apis.py checks the
    hook, tests/config/test_schema.py that the handed config is the one Hydra composes itself."""
    import logging
    from unittest import mock

    from hydra._internal import hydra as hydra_module
    from hydra.core.utils import configure_log
    from hydra.types import RunMode
    from omegaconf import open_dict, read_write

    real = hydra_module.Hydra.compose_config
    pending = [cfg]
    mode = RunMode.MULTIRUN if multirun else RunMode.RUN

    def compose_config(
        self: Any,
        config_name: str | None,
        overrides: list[str],
        run_mode: Any,
        with_log_configuration: bool = False,
        from_shell: bool = True,
        validate_sweep_overrides: bool = True,
    ) -> Any:
        given = list(overrides)
        added = given[len(composed_with) :]
        same = bool(pending) and run_mode == mode and given[: len(composed_with)] == composed_with
        if not same or added not in ([], [f"hydra.mode={mode.name}"]) or (added and pending[0].hydra.mode is not None):
            return real(
                self, config_name, given, run_mode, with_log_configuration, from_shell, validate_sweep_overrides
            )
        kept = pending.pop()
        if added:
            with read_write(kept.hydra), open_dict(kept.hydra):
                kept.hydra.mode = mode
                kept.hydra.overrides.hydra.append(f"hydra.mode={mode.name}")
        if with_log_configuration:  # what Hydra's compose_config does after composing
            configure_log(kept.hydra.hydra_logging, kept.hydra.verbose)
            hydra_module.log = logging.getLogger(hydra_module.__name__)
            self._print_debug_info(config_name, given, run_mode)
        return kept

    with mock.patch.object(hydra_module.Hydra, "compose_config", compose_config):
        yield
