"""Secrets kept out of every file a run or a sweep writes: environment values, command-line values, config values."""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

# Environment variables whose values never reach a file this project writes.
SECRET_SUFFIXES = ("_KEY", "_TOKEN", "_SECRET", "_PASSWORD")
# `db_password: pw1`, `+db_password=pw1` in a text: a secret's name, then a value of 1 to 3 characters (longer
# ones are known values, replaced wherever they stand), or a sweep's list of them (`=pw1,pw2`, `=choice(a,b)`,
# some long and already replaced); null, ~ and interpolations are no values to hide.
_SHORT = r"(?:<redacted>|(?!null\b|~|\$\{)[^\s,()\]}'\"]{1,3})"
_SHORT_ASSIGNED = re.compile(
    rf"(?i)\b((?:\w+_)?(?:key|token|secret|password)\s*[:=]\s*['\"]?(?:choice\()?)({_SHORT}(?:,{_SHORT})*)"
    r"(?=[\s,)\]}'\"]|$)"
)
REDACTED = "<redacted>"
# Hydra's record of a sweep, in the sweep dir: the sweep's config and its command line.
SWEEP_RECORD = "multirun.yaml"


def _is_secret_name(name: str) -> bool:
    name = name.upper()
    return name.endswith(SECRET_SUFFIXES) or name in {s.lstrip("_") for s in SECRET_SUFFIXES}


def _override_secrets(overrides: Iterable[str]) -> Iterator[str]:
    """The values that overrides with a secret's name set: as written, unquoted, and each value of a sweep
    (`+api_key=a,b` gives its jobs `a` and `b`); and the secrets inside a dict or list value, at any depth
    (`+auth='{api_key: X}'` gives `X`)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = None
    for arg in overrides:
        key, sep, value = arg.partition("=")
        if not sep or arg.startswith("-"):
            continue
        secret = _is_secret_name(key.rsplit(".", 1)[-1].lstrip("+~"))
        if secret:
            yield value
            yield value.strip("'\"")
        elif not any(c in value for c in "{["):
            continue
        parser = parser or OverridesParser.create()
        with contextlib.suppress(Exception):  # a value Hydra cannot read: Hydra refuses the run itself
            (override,) = parser.parse_overrides([arg])
            if override.is_sweep_override():
                if secret:
                    yield from override.sweep_string_iterator()
                continue
            yield from _nested_secrets(override.value(), secret)


def _nested_secrets(value: Any, secret: bool) -> Iterator[str]:
    """The scalar values under a secret's name inside a dict or list (all of them under a secret name)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _nested_secrets(v, secret or _is_secret_name(str(k)))
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _nested_secrets(v, secret)
    elif secret and isinstance(value, str | int | float) and not isinstance(value, bool):
        yield str(value)


def _job_overrides() -> list[str]:
    """The overrides of the Hydra job running in this process (a launcher's job process has its own
    command line, not the user's)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    overrides = HydraConfig.get().overrides
    return [*overrides.task, *overrides.hydra]


def secret_values() -> list[str]:
    """Values of the secrets this process knows: environment variables and command-line overrides whose
    names end in _KEY, _TOKEN, _SECRET or _PASSWORD (or are KEY, TOKEN, SECRET, PASSWORD), longest first
    (so that one containing another is replaced whole)."""
    values = {v for k, v in os.environ.items() if _is_secret_name(k)}
    values.update(_override_secrets([*sys.argv[1:], *_job_overrides()]))
    return sorted((v for v in values if len(v) >= 4), key=len, reverse=True)


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
        # Values too short to replace wherever they stand (`pw1`) are replaced where a secret's name sets them.
        return _SHORT_ASSIGNED.sub(lambda m: m[1] + ",".join([REDACTED] * len(m[2].split(","))), value)
    if isinstance(value, dict):  # a value under a secret's name is one, whatever this process was told
        return {k: REDACTED if _is_secret_name(str(k)) and _filled(v) else redact(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v, secrets) for v in value]
    return value


def _filled(value: Any) -> bool:
    """A secret's value worth hiding: a non-empty scalar (null, a missing value or a nested config is not)."""
    return isinstance(value, str | int | float) and not isinstance(value, bool) and value not in ("", "???")


def redact_file(path: Path, secrets: list[str] | None = None) -> None:
    """Scrub secrets from a text file already written by someone else (Hydra's records, a log)."""
    secrets = secret_values() if secrets is None else secrets
    if not path.is_file():
        return
    text = path.read_text(errors="surrogateescape")
    if (scrubbed := redact(text, secrets)) != text:
        # Written beside it and moved over it: a reader never sees half a file.
        temporary = path.with_name(f".{path.name}.redacted")
        temporary.write_text(scrubbed, errors="surrogateescape")
        os.replace(temporary, path)


def redact_files(folder: Path) -> None:
    """Scrub secrets from text files already written (Hydra's record of the command line)."""
    secrets = secret_values()
    for path in folder.glob("*.yaml") if folder.is_dir() else ():
        redact_file(path, secrets)


def redact_sweep_record(sweep_dir: Path | str | None) -> None:
    """Scrub the sweep's `multirun.yaml`, which Hydra (or the search) writes with the command line as given."""
    if sweep_dir is not None:
        redact_file(Path(sweep_dir) / SWEEP_RECORD)


def redact_hydra_records(run_dir: Path) -> None:
    """Scrub what Hydra wrote for the job running in this process: its record in the run dir and, for a job of
    a sweep, the sweep's record (Hydra's basic launcher runs the jobs in the process that wrote it)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    redact_files(run_dir / ".hydra")
    if not HydraConfig.initialized():
        return
    from omegaconf.errors import InterpolationResolutionError

    hc = HydraConfig.get()
    try:
        subdir = hc.output_subdir
    except InterpolationResolutionError:  # resolved against the job's run dir (conf/hydra): none before a job
        subdir = None
    if subdir:
        redact_files(Path(str(hc.runtime.output_dir)) / str(subdir))
    if hc.mode == RunMode.MULTIRUN:
        redact_sweep_record(str(hc.sweep.dir))
