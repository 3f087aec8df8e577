"""The plain PyTorch DDP reference of `experiment=fast hardware=cpu hardware.devices=2 strategy=ddp`: the recipe
of scripts/plain_floor.py on 2 processes with torch alone (gloo, one thread a rank, each rank its half of every
global batch of 128, one epoch, then rank 0 tests). No Lightning, Hydra or project import.

Usage: python scripts/plain_ddp.py DATA_DIR SEED [name=value ...]   (the settings of plain_floor.RECIPE)

Both ranks start at once (as torchrun starts them). Prints `test/acc=0.xxxx` as `train.py` does, and
`train_seconds=` for the loop alone.
"""

import os
import socket
import sys

import torch
import torch.distributed as dist
from plain_floor import RECIPE, changes_of, test_accuracy, train
from torch.nn.parallel import DistributedDataParallel

WORLD = 2


def rank_main(rank: int, data_dir: str, seed: int, port: int, changes: dict) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    r = {**RECIPE, **changes}
    # The same seed on both ranks: the same initial weights, and the same order and shifts (each its half).
    net, seconds = train(data_dir, seed, r, rank, WORLD, wrap=DistributedDataParallel)
    if rank == 0:
        print(f"test/acc={test_accuracy(data_dir, net, r):.4f}\ntrain_seconds={seconds:.2f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: python scripts/plain_ddp.py DATA_DIR SEED [name=value ...]")
    if "PLAIN_DDP_RANK" in os.environ:  # a rank started below
        rank_main(int(os.environ["PLAIN_DDP_RANK"]), sys.argv[1], int(sys.argv[2]), int(os.environ["PLAIN_DDP_PORT"]),
                  changes_of(sys.argv[3:]))  # fmt: skip
        sys.exit(0)
    import subprocess

    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PLAIN_DDP_PORT": str(port)}
    ranks = [subprocess.Popen([sys.executable, *sys.argv], env={**env, "PLAIN_DDP_RANK": str(r)}) for r in range(WORLD)]
    sys.exit(max(p.wait() for p in ranks))
