"""A sweep job's pickles on disk hold no secret: submitit writes each job's function and arguments
(`<id>_submitted.pkl`, the launcher's config and the job's command line, secrets included) and its result
(`<id>_result.pkl`) into the sweep's `.submitit` folder, where they stay while the job runs, and for good
when the submitting process is killed. Every string holding a secret is pickled as a reference instead; the
values travel in the job's environment (`SECRETS_ENV`), which submitit's local executor and `sbatch`
(`--export=ALL`, SLURM's default) hand on to the job, and which each side reads back.

Written by hand: neither submitit nor Hydra's launcher has a hook between a job's objects and its pickle.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import re
from typing import Any

import cloudpickle

# Ends in _SECRET: its own value is redacted wherever the project writes the environment's secrets.
SECRETS_ENV = "HYDRALIGHT_JOB_SECRET"
_REFERENCE = re.compile("\x00secret:([0-9a-f]{32})\x00")


def _name(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()[:32]


def _secrets_here() -> dict[str, str]:
    """The secrets this process was given, by name (a digest: jobs submitted at different times agree)."""
    try:
        found = json.loads(os.environ.get(SECRETS_ENV) or "{}")
    except json.JSONDecodeError:
        return {}
    return {k: v for k, v in found.items() if isinstance(v, str)} if isinstance(found, dict) else {}


class _SealingPickler(cloudpickle.Pickler):
    def __init__(self, file: io.BytesIO, secrets: list[str]) -> None:
        super().__init__(file)
        self._secrets = sorted(secrets, key=len, reverse=True)  # one inside another is replaced whole

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is not str or not any(s in obj for s in self._secrets):
            return None
        for secret in self._secrets:
            obj = obj.replace(secret, f"\x00secret:{_name(secret)}\x00")
        return ("secret", obj)


class _UnsealingUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, secrets: dict[str, str]) -> None:
        super().__init__(file)
        self._secrets = secrets

    def persistent_load(self, pid: Any) -> Any:
        kind, text = pid
        if kind != "secret":
            raise pickle.UnpicklingError(f"unknown reference {kind!r}")
        return _REFERENCE.sub(lambda m: self._secrets.get(m[1], "<redacted>"), text)


def unseal(blob: bytes) -> Any:
    """The object a `Sealed` was pickled from, its secrets read back from this process's environment."""
    return _UnsealingUnpickler(io.BytesIO(blob), _secrets_here()).load()


class Sealed:
    """`value`, pickled with every string that holds a secret of this process (`share_secrets`) as a reference
    to it; unpickled as `value` itself (not a `Sealed`) where the environment holds the secrets."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        buffer = io.BytesIO()
        _SealingPickler(buffer, list(_secrets_here().values())).dump(self.value)
        return unseal, (buffer.getvalue(),)


def share_secrets(secrets: list[str]) -> None:
    """Put the secrets where the jobs about to be submitted find them (and this process, reading results)."""
    known = _secrets_here()
    known.update({_name(s): s for s in secrets})
    os.environ[SECRETS_ENV] = json.dumps(known)


class SealedJob:
    """The function submitit runs for each job: the launcher's call, both its arguments and what it returns
    pickled sealed. Resubmitted as it is on a timeout or preemption (the launcher's own `checkpoint`)."""

    def __call__(self, call: Any) -> Any:
        launcher, arguments = call.value if isinstance(call, Sealed) else call
        return Sealed(launcher(*arguments))

    def checkpoint(self, call: Any) -> Any:
        import submitit

        launcher, arguments = call.value if isinstance(call, Sealed) else call
        return submitit.helpers.DelayedSubmission(self, Sealed((launcher, arguments)))
