"""Step-boundary agreement: one reduction every few steps carries every flag; one process reads them every step."""

from types import SimpleNamespace

import torch

from hydralight.resume import agreement as agreement_module
from hydralight.resume.agreement import StepAgreement


class Strategy:
    """Rank 0 of two, where the other rank sends `other` (its own flags, zero for rank 0's)."""

    def __init__(self, other: list[int]) -> None:
        self.other, self.reductions = other, []

    def reduce(self, tensor: torch.Tensor, reduce_op: str) -> torch.Tensor:
        assert reduce_op == "max"
        self.reductions.append(tensor.tolist())
        return torch.maximum(tensor, torch.tensor(self.other))


def trainer(world_size: int, strategy: Strategy | None = None) -> SimpleNamespace:
    return SimpleNamespace(world_size=world_size, global_rank=0, global_step=0, strategy=strategy)


MODULE = SimpleNamespace(device=torch.device("cpu"))


def test_one_process_reads_its_flags_at_every_step():
    flags = {"signal": 0}
    agreed = StepAgreement()
    agreed.register("signal", lambda: flags["signal"])
    t = trainer(1)
    seen = []
    for step in range(1, 5):
        t.global_step = step
        flags["signal"] = int(step == 3)
        seen.append(agreed.agreed(t, MODULE)["signal"])
    assert seen == [0, 0, 1, 0]


def test_ranks_reduce_at_the_step_rank_0_chose_and_share_every_flag(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(agreement_module.time, "monotonic", lambda: now[0])
    strategy = Strategy(other=[0, 0, 2])  # the other rank: no interval, its clock not asked, a requeue signal
    agreed = StepAgreement()
    agreed.register("save_due", lambda: 1, rank_zero_decides=True)
    agreed.register("signal", lambda: 0)
    t = trainer(2, strategy)
    decided = {}
    for step in range(1, 40):
        t.global_step, now[0] = step, step / 8  # 0.125 s per step: 4 steps make the 0.5 s between reductions
        decided[step] = agreed.agreed(t, MODULE)
        assert agreed.agreed(t, MODULE) is decided[step]  # a second callback at the same step: no new reduction
    reduced_at = [step for step, flags in decided.items() if flags["signal"]]
    # The first two measure the step time (no time known, then one step); then every 4 steps.
    assert reduced_at == [1, 2, *range(6, 40, 4)]
    assert all(decided[s] == {"save_due": 1, "signal": 2} for s in reduced_at)
    assert all(decided[s] == {"save_due": 0, "signal": 0} for s in decided if s not in reduced_at)
    assert len(strategy.reductions) == len(reduced_at)
