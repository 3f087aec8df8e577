"""Decisions the ranks make together at optimizer-step boundaries, in one reduction every few steps.

Some decisions must be the same on every rank or a collective would hang: stop because some rank got a
signal, save `last.ckpt` because rank 0's clock says it is time. Each is a flag a callback registers;
all of them travel in one small all-reduce, and not at every step: on a fast accelerator a collective
per step costs more than the step. Rank 0 picks the number of steps to the next agreement from the
measured step time (about `EVERY_S` seconds) and sends it in the same reduction, so every rank reduces
again at the same step. A single process has nothing to agree on and reads its flags at every step.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import pytorch_lightning as pl
import torch

# Seconds between agreements: how late a signal or a time-based save can be acted on, at most a step more.
EVERY_S = 0.5
MAX_STEPS_BETWEEN = 1000


@dataclass
class _Flag:
    read: Callable[[], int]
    rank_zero_decides: bool  # rank 0's value for all (its clock), else the largest over ranks


class StepAgreement:
    """The flags of one `fit`, agreed at the step boundaries where the ranks meet (see the module)."""

    def __init__(self) -> None:
        self.flags: dict[str, _Flag] = {}
        self._step = -1
        self._agreed: dict[str, int] = {}
        self._next = 0  # the step of the next reduction
        self._since: tuple[int, float] | None = None  # (step, time) of the last reduction

    def register(self, name: str, read: Callable[[], int], rank_zero_decides: bool = False) -> None:
        """Agree on `read()` from now on: the largest value over ranks, or rank 0's."""
        self.flags[name] = _Flag(read, rank_zero_decides)

    def agreed(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, int]:
        """Each flag's agreed value at this step boundary; zeros between agreements. Every rank must ask at
        the same boundaries (the callbacks ask at every optimizer step)."""
        step = trainer.global_step
        if step != self._step:
            self._step = step
            self._agreed = self._decide(trainer, pl_module, step)
        return self._agreed

    def at_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, int]:
        """Each flag agreed once more where every rank ends training: what was asked for after the last
        reduction (a signal during the final validation) is not lost."""
        self._step, self._next = -1, 0
        return self.agreed(trainer, pl_module)

    def _decide(self, trainer: pl.Trainer, pl_module: pl.LightningModule, step: int) -> dict[str, int]:
        if trainer.world_size == 1:
            return {name: flag.read() for name, flag in self.flags.items()}
        if step < self._next:
            return dict.fromkeys(self.flags, 0)
        zero = trainer.global_rank == 0
        values = [self._interval(step) if zero else 0]
        values += [flag.read() if zero or not flag.rank_zero_decides else 0 for flag in self.flags.values()]
        reduced = trainer.strategy.reduce(torch.tensor(values, device=pl_module.device), reduce_op="max")
        interval, *agreed = (int(v) for v in reduced.tolist())
        self._next = step + interval
        return dict(zip(self.flags, agreed, strict=True))

    def _interval(self, step: int) -> int:
        """Rank 0's choice of steps to the next reduction, from the time the last ones took."""
        now = time.monotonic()
        since, self._since = self._since, (step, now)
        if since is None or step <= since[0]:
            return 1
        per_step = (now - since[1]) / (step - since[0])
        return max(1, min(MAX_STEPS_BETWEEN, int(EVERY_S / max(per_step, 1e-6))))


_AGREEMENTS: weakref.WeakKeyDictionary[pl.Trainer, StepAgreement] = weakref.WeakKeyDictionary()


def agreement(trainer: pl.Trainer) -> StepAgreement:
    """The one agreement of this trainer, shared by the callbacks that register flags in it."""
    if trainer not in _AGREEMENTS:
        _AGREEMENTS[trainer] = StepAgreement()
    return _AGREEMENTS[trainer]
