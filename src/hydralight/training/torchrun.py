"""What the ranks of a torchrun launch tell each other before their process group exists, through the store
torchrun's agent serves them: torchrun stops every rank as soon as one exits non-zero."""

from __future__ import annotations

import contextlib
import os
from typing import Any


def _launch_store(timeout_s: float) -> Any:
    """The store torchrun's agent serves to the ranks it started (None under another launcher, or when it
    cannot be reached): the one place the ranks can meet before their process group exists."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    from datetime import timedelta

    from torch.distributed import TCPStore

    try:
        return TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                        timeout=timedelta(seconds=timeout_s), wait_for_workers=False)  # fmt: skip
    except (KeyError, ValueError, RuntimeError):
        return None


def _start_up_key() -> str:
    return f"hydralight/start-up-ended/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def start_up_ended() -> None:
    """Rank 0 of a torchrun launch has refused its run and cleaned up after it: the other ranks may exit now."""
    store = _launch_store(5.0)
    if store is not None:
        with contextlib.suppress(RuntimeError):
            store.set(_start_up_key(), "1")


def wait_for_rank_zero(timeout_s: float = 30.0) -> None:
    """Another rank of a torchrun launch, refusing its run, waits (at most `timeout_s`) until rank 0 has
    cleaned up after its own start-up: torchrun stops every rank when one exits non-zero, and rank 0 stopped
    half-way leaves the run dir it began (its record, its marker) behind."""
    store = _launch_store(timeout_s)
    if store is not None:
        from datetime import timedelta

        with contextlib.suppress(RuntimeError):
            store.wait([_start_up_key()], timedelta(seconds=timeout_s))
