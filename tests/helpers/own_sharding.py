"""A module that shards itself in its own `configure_model`: strategy=fsdp leaves it to it."""

import logging

from torch.distributed.fsdp import FSDPModule, fully_shard

from hydralight.tasks.charlm import CharLM

log = logging.getLogger(__name__)


class SelfShardingCharLM(CharLM):
    def configure_model(self) -> None:
        if isinstance(self, FSDPModule):
            return
        mesh = self.device_mesh["data_parallel"]
        for block in self.blocks.layers:
            fully_shard(block, mesh=mesh)
        fully_shard(self, mesh=mesh)
        if self.global_rank == 0:
            log.info(f"own configure_model sharded {len(self.blocks.layers)} blocks")
