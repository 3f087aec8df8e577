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
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from plain_floor import HOLD_OUT, HOLD_OUT_SEED, RECIPE, as_input, changes_of, jitter, network, read_idx
from torch.nn.parallel import DistributedDataParallel

WORLD = 2


def rank_main(rank: int, data_dir: str, seed: int, port: int, changes: dict) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    r = {**RECIPE, **changes}
    layout = torch.channels_last if r["channels_last"] else torch.contiguous_format
    raw = Path(data_dir) / "MNIST" / "raw"
    torch.manual_seed(seed)  # the same initial weights on both ranks
    generator = torch.Generator().manual_seed(seed)  # the same order and shifts on both ranks: each takes its half
    images, labels = read_idx(raw, "train")
    hold_out = min(HOLD_OUT, len(labels) // 6)
    keep = torch.randperm(len(labels), generator=torch.Generator().manual_seed(HOLD_OUT_SEED))[hold_out:]
    images, labels = images[keep], labels[keep]
    model = DistributedDataParallel(network(r).to(memory_format=layout))
    optimizer = torch.optim.Adam(model.parameters(), lr=r["peak_lr"])
    batch, share = r["batch"], r["batch"] // WORLD
    steps = max(1, int(len(labels) // batch * r["epoch_fraction"]))
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, r["peak_lr"], total_steps=steps, pct_start=r["warmup"])
    order = torch.randperm(len(labels), generator=generator)
    start = time.perf_counter()
    for i in range(steps):
        chosen = order[i * batch : (i + 1) * batch]
        x = images[chosen] if not r["shift"] else jitter(images[chosen], r["shift"], generator)
        mine = slice(rank * share, (rank + 1) * share)
        loss = F.cross_entropy(model(as_input(x[mine], layout)), labels[chosen][mine], label_smoothing=r["smoothing"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
    seconds = time.perf_counter() - start
    if rank == 0:
        net = model.module.eval()
        test_images, test_labels = read_idx(raw, "t10k")
        step = r["eval_batch"]
        with torch.inference_mode():
            right = sum(
                int((net(as_input(test_images[i : i + step], layout)).argmax(1) == test_labels[i : i + step]).sum())
                for i in range(0, len(test_labels), step)
            )
        print(f"test/acc={right / len(test_labels):.4f}\ntrain_seconds={seconds:.2f}", flush=True)
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
