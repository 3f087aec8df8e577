import pytest
import torch

from hydralight.data.sampling import GlobalBatchSampler, ShardSampler


def steps(sampler: GlobalBatchSampler) -> list[list[torch.Tensor]]:
    """Micro-batches grouped by optimizer step."""
    batches = list(sampler)
    a = sampler.accumulation
    return [batches[i : i + a] for i in range(0, len(batches), a)]


def test_ranks_share_the_same_global_batches_as_one_process():
    single = steps(GlobalBatchSampler(100, 20, seed=3))
    for world, accumulation in ((2, 1), (4, 1), (2, 5), (5, 2)):
        ranks = [steps(GlobalBatchSampler(100, 20, accumulation, r, world, seed=3)) for r in range(world)]
        for step, batch in enumerate(single):
            merged = torch.cat([torch.cat(ranks[r][step]) for r in range(world)])
            assert torch.equal(merged, batch[0]), (world, accumulation, step)
            sizes = {len(micro) for r in range(world) for micro in ranks[r][step]}
            assert sizes == {20 // (world * accumulation)}


def test_every_sample_once_per_epoch_and_new_order_each_epoch():
    sampler = GlobalBatchSampler(96, 32, rank=0, world_size=1, seed=0)
    first = torch.cat(list(sampler))
    assert sorted(first.tolist()) == list(range(96))
    sampler.set_epoch(1)
    second = torch.cat(list(sampler))
    assert sorted(second.tolist()) == list(range(96))
    assert not torch.equal(first, second)


def test_drop_last_and_partial_last_batch():
    assert len(GlobalBatchSampler(100, 32)) == 3
    keep = GlobalBatchSampler(100, 32, world_size=2, rank=1, drop_last=False)
    assert len(keep) == 4
    assert sum(len(b) for b in keep) == 16 * 3 + 2


def test_resume_inside_an_epoch_continues_the_same_order():
    full = list(GlobalBatchSampler(100, 10, seed=1))
    resumed = GlobalBatchSampler(100, 10, seed=1)
    resumed.resume_at(GlobalBatchSampler(100, 10, seed=1).position(4))
    assert all(torch.equal(a, b) for a, b in zip(full[4:], resumed, strict=True))
    assert len(list(resumed)) == 10  # the next epoch starts from the beginning again


def test_position_carries_over_to_another_world_size():
    two_ranks = [GlobalBatchSampler(96, 16, 2, r, 2, seed=4) for r in range(2)]
    position = two_ranks[0].position(6)  # 3 optimizer steps of 2 micro-batches each
    assert position["samples"] == 48
    single = GlobalBatchSampler(96, 16, seed=4)
    single.resume_at(position)
    rest = torch.cat(list(single))
    assert torch.equal(rest, single.order()[48:])
    with pytest.raises(ValueError, match="batch.global_size=16"):
        GlobalBatchSampler(96, 32).resume_at(position)


def test_shards_cover_every_sample_exactly_once():
    for world in (1, 2, 3, 7):
        seen = torch.cat([torch.cat(list(ShardSampler(1003, 100, r, world))) for r in range(world)])
        assert sorted(seen.tolist()) == list(range(1003))


def test_the_first_batches_of_every_rank_are_the_first_batches_of_one_process():
    # What an evaluation limit of 4 batches scores: 2 a rank on 2 processes, 1 on 4.
    one = torch.cat(list(ShardSampler(1003, 100))[:4])
    for world in (2, 4):
        limited = [list(ShardSampler(1003, 100, r, world))[: 4 // world] for r in range(world)]
        assert sorted(torch.cat([b for batches in limited for b in batches]).tolist()) == one.tolist()
