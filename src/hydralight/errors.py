"""Errors a user can cause, reported as one line and a non-zero exit instead of a traceback."""

from __future__ import annotations

import errno
import functools
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])

EXIT_USER_ERROR = 2


class UserError(Exception):
    """A problem with the user's input (config, hardware, data, checkpoint), with the fix in the message."""

    # Set on a refusal by whoever knows (the entrypoint reads them): refused before the run recorded a result,
    # and its run dir is to go.
    before_any_result: bool = False
    discard_run_dir: bool = False
    saved_something: bool = False  # refused after the attempt saved a checkpoint: its record and log stay


def run_config_check(check: Callable[[dict[str, Any]], None], config: dict[str, Any]) -> None:
    """Run a module's `check_config(config)`: the ValueError it raises is the one line a user reads."""
    try:
        check(config)
    except ValueError as err:
        raise UserError(str(err)) from None


def exit_on_user_error(fn: F) -> F:
    """Turn a `UserError` raised by `fn` into `error: <message>` on stderr and exit code 2.

    `HYDRA_FULL_ERROR=1` keeps the traceback, as it does for Hydra's own errors.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (UserError, OSError) as err:
            if isinstance(err, OSError) and err.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise  # other OS errors are ours to explain
            if os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            # One write for the line and its end: the ranks of a run refusing at once do not join their lines.
            sys.stderr.write(f"error: {_message(err)}\n")
            sys.stderr.flush()
            # SystemExit passes through Hydra's own error reporting untouched.
            raise SystemExit(EXIT_USER_ERROR) from None

    return cast(F, wrapper)


def _message(err: Exception) -> str:
    if isinstance(err, OSError):  # a full disk while writing anything else than a checkpoint
        where = f" writing {err.filename}" if err.filename else ""
        return (
            f"no space left on the device{where}; free some space, then rerun the same command "
            "to continue from the run's last checkpoint"
        )
    return str(err)


def require(module: str, extra: str, needed_by: str) -> None:
    """Refuse in one line when an optional package is missing, naming the extra that installs it."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise UserError(f"{needed_by} needs {module}, which is not installed: pip install 'hydralight[{extra}]'")
