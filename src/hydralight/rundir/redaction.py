"""Secrets kept out of every file a run writes: environment values, command-line values, config values."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Environment variables whose values never reach a file this project writes.
SECRET_SUFFIXES = ("_KEY", "_TOKEN", "_SECRET", "_PASSWORD")
REDACTED = "<redacted>"


def _is_secret_name(name: str) -> bool:
    name = name.upper()
    return name.endswith(SECRET_SUFFIXES) or name in {s.lstrip("_") for s in SECRET_SUFFIXES}


def secret_values() -> list[str]:
    """Values of the secrets this process knows: environment variables and command-line overrides whose
    names end in _KEY, _TOKEN, _SECRET or _PASSWORD (or are KEY, TOKEN, SECRET, PASSWORD)."""
    values = [v for k, v in os.environ.items() if _is_secret_name(k)]
    for arg in sys.argv[1:]:
        key, sep, value = arg.partition("=")
        if sep and _is_secret_name(key.rsplit(".", 1)[-1].lstrip("+~")):
            values.append(value.strip("'\""))
    return [v for v in values if len(v) >= 4]


@contextlib.contextmanager
def redacted_argv() -> Iterator[None]:
    """`sys.argv` with secrets replaced, for libraries that record the command line (wandb's metadata)."""
    saved = list(sys.argv)
    sys.argv[:] = redact(saved)
    try:
        yield
    finally:
        sys.argv[:] = saved


def redact(value: Any, secrets: list[str] | None = None) -> Any:
    """`value` with every secret replaced, through dicts, lists and strings."""
    secrets = secret_values() if secrets is None else secrets
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, REDACTED)
        return value
    if isinstance(value, dict):
        return {k: redact(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v, secrets) for v in value]
    return value


def redact_files(folder: Path) -> None:
    """Scrub secrets from text files already written (Hydra's record of the command line)."""
    secrets = secret_values()
    for path in folder.glob("*.yaml") if secrets and folder.is_dir() else ():
        text = path.read_text()
        if any(s in text for s in secrets):
            path.write_text(redact(text, secrets))
