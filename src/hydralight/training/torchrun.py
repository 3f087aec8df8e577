"""What the ranks of a torchrun launch tell each other when they refuse their run, before their process group
exists, through the store torchrun's agent serves them. torchrun stops every rank as soon as one exits
non-zero: rank 0 stopped half-way through its clean-up leaves the run dir it began behind, and a rank whose
Hydra makes the launch's run dir after rank 0 removed it leaves that. So each other rank says it has refused
(its run dir is made by then) and waits; rank 0 cleans up once they all have, then lets them exit."""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any


def _launch_store(timeout_s: float) -> Any:
    """The store torchrun's agent serves to the ranks it started (None under another launcher, or when it
    cannot be reached)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    from datetime import timedelta

    from torch.distributed import TCPStore

    try:
        return TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                        timeout=timedelta(seconds=timeout_s), wait_for_workers=False)  # fmt: skip
    except (KeyError, ValueError, RuntimeError):
        return None


def _key(what: str) -> str:
    # A restarted launch (--max-restarts) shares the agent's store with its earlier attempts.
    return f"hydralight/{what}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def others_refused(timeout_s: float = 10.0) -> None:
    """Rank 0, refusing: wait (at most `timeout_s`: a rank that did not refuse goes on to its process group)
    until every other rank has refused too, so that no rank makes the run dir again after its clean-up."""
    store = _launch_store(timeout_s)
    others = int(os.environ.get("WORLD_SIZE", "1")) - 1
    if store is None or others < 1:
        return
    deadline = time.monotonic() + timeout_s
    with contextlib.suppress(RuntimeError):
        while store.add(_key("refused"), 0) < others and time.monotonic() < deadline:
            time.sleep(0.05)


def start_up_ended() -> None:
    """Rank 0 has refused its run and cleaned up after it: the other ranks may exit now."""
    store = _launch_store(5.0)
    if store is not None:
        with contextlib.suppress(RuntimeError):
            store.set(_key("start-up-ended"), "1")


def refused(timeout_s: float = 30.0) -> None:
    """Another rank, refusing: say so, and wait (at most `timeout_s`) until rank 0 has cleaned up."""
    store = _launch_store(timeout_s)
    if store is None:
        return
    from datetime import timedelta

    with contextlib.suppress(RuntimeError):
        store.add(_key("refused"), 1)
        store.wait([_key("start-up-ended")], timedelta(seconds=timeout_s))
