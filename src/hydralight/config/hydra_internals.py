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


@contextlib.contextmanager
def mode_known(mode: Any) -> Iterator[None]:
    """While Hydra starts the run: Hydra 1.3 composes the whole config once more only to read `hydra.mode`
    (`_run_hydra` -> the private `Hydra.get_mode`); the command line's check has read it already, so Hydra is
    told. tests/config/test_schema.py counts the compositions of a run."""
    from unittest import mock

    from hydra._internal.hydra import Hydra

    with mock.patch.object(Hydra, "get_mode", lambda self, config_name, overrides: mode):
        yield
