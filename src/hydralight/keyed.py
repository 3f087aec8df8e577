"""What keeps training the same on 1 and N processes beyond the batch: randomness keyed by sample, not by
process, and BatchNorm statistics over the global batch (hydralight.training.invariance reports what a
model or data uses that breaks it).

The same sample in the same epoch draws the same dropout mask and the same augmentation whichever rank
trains it and however many ranks there are, also after a resume.

torch's dropout draws from each process's own random stream, so 1 and N processes train different
networks. Here every random number is a counter-based hash of (seed, epoch, sample id, layer, element):
no state to carry or split, identical on CPU and GPU, and vectorized over the batch. Written by hand
because torch has no counter-based generator that takes a key per row.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

_MASK = 0xFFFFFFFF
# The per-sample keys of the micro-batch being trained, set around the model's forward.
_keys: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar("sample_keys", default=None)


def _mix(h: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche (murmur3's finalizer) on int64 tensors holding values in [0, 2^32).

    Products may wrap past 2^63; their low 32 bits, all that is kept, are exact either way.
    """
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _MASK
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _MASK
    return h ^ (h >> 16)


def sample_keys(seed: int, epoch: int, ids: torch.Tensor) -> torch.Tensor:
    """One 32-bit key per sample from (seed, epoch, sample id): the sample's own random stream this epoch."""
    ids = ids.to(torch.int64)
    base = _mix(torch.tensor((seed * 0x9E3779B1 + epoch * 0x85EBCA77) & _MASK, device=ids.device))
    return _mix((ids * 0xC2B2AE3D + base) & _MASK)


def uniform(keys: torch.Tensor, stream: int, n: int) -> torch.Tensor:
    """(len(keys), n) floats in [0, 1): element j of row i depends on (keys[i], stream, j) only."""
    salt = _mix(torch.tensor((stream * 0x27D4EB2F + 0x165667B1) & _MASK, device=keys.device))
    row = _mix((keys.to(torch.int64) ^ salt) & _MASK)
    counter = torch.arange(n, device=keys.device, dtype=torch.int64) * 0x9E3779B9
    bits = _mix((row[:, None] + counter[None, :]) & _MASK)
    return (bits >> 8).to(torch.float32) * (1.0 / (1 << 24))  # 24 bits: exact in float32


def set_keys(keys: torch.Tensor | None) -> None:
    """Per-sample dropout draws from `keys` (one per row of the batch) until the next call; None: torch's."""
    _keys.set(keys)


@contextlib.contextmanager
def keyed(keys: torch.Tensor | None) -> Iterator[None]:
    """Per-sample dropout inside this block draws from `keys` (one per row of the batch)."""
    token = _keys.set(keys)
    try:
        yield
    finally:
        _keys.reset(token)


class SampleDropout(nn.Module):
    """Dropout whose mask for a sample depends on the sample, the epoch and the layer, not on the process.

    `channels`: one decision per channel (as nn.Dropout2d); otherwise one per element. Outside a `keyed`
    block (a batch without sample ids) it is torch's dropout.
    """

    def __init__(self, p: float = 0.5, stream: int = 0, channels: bool = False) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability {p} must be in [0, 1]")
        self.p, self.stream, self.channels = p, stream, channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if self.p == 1.0:
            return x * 0.0
        keys = _keys.get()
        if keys is None or len(keys) != len(x):
            return (F.dropout2d if self.channels else F.dropout)(x, self.p, True)
        shape = (len(x), x.shape[1], *([1] * (x.dim() - 2))) if self.channels else x.shape
        n = 1
        for size in shape[1:]:
            n *= size
        keep = uniform(keys.to(x.device), self.stream, n).view(shape) >= self.p
        return x * keep.to(x.dtype) * (1.0 / (1.0 - self.p))

    def extra_repr(self) -> str:
        return f"p={self.p}, stream={self.stream}" + (", channels" if self.channels else "")


_DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d)


def with_sample_dropout(module: nn.Module) -> nn.Module:
    """Replace torch's dropout layers (nn.Dropout, nn.Dropout1d/2d/3d) by SampleDropout, each with its own
    stream; the weights are untouched (dropout has none), so checkpoints load either way."""
    stream = 0

    def convert(module: nn.Module) -> None:
        nonlocal stream
        for name, child in module.named_children():
            # Exactly these classes (isinstance too, for the type checker): a subclass may do more than drop.
            if isinstance(child, _DROPOUTS) and type(child) in _DROPOUTS:
                stream += 1
                setattr(module, name, SampleDropout(child.p, stream, channels=type(child) is not nn.Dropout))
            else:
                convert(child)

    convert(module)
    return module


def keyed_shift(x: torch.Tensor, keys: torch.Tensor, max_shift: int, fill: float) -> torch.Tensor:
    """Translate each image of (N, C, H, W) by its own (dy, dx) in [-max_shift, max_shift], drawn from its key;
    uncovered pixels take `fill`."""
    if max_shift <= 0:
        return x
    n, _, h, w = x.shape
    span = 2 * max_shift + 1
    offsets = (uniform(keys.to(x.device), stream=0x5A17, n=2) * span).long()  # (N, 2) in [0, span)
    padded = F.pad(x, (max_shift,) * 4, value=fill)
    rows = offsets[:, :1] + torch.arange(h, device=x.device)  # (N, H) rows of the padded image to take
    cols = offsets[:, 1:] + torch.arange(w, device=x.device)
    c = x.shape[1]
    out = padded.gather(2, rows[:, None, :, None].expand(n, c, h, padded.shape[3]))
    return out.gather(3, cols[:, None, None, :].expand(n, c, h, w))


class GlobalBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose training statistics cover the micro-batch of every rank, on CPU (gloo) as on GPU:
    what one process computes over the same samples. torch's SyncBatchNorm does this on GPUs only."""

    global_statistics = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        if not self.training or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
            return super().forward(x)
        from torch.distributed.nn.functional import all_reduce  # differentiable: gradients cross ranks too

        # Statistics in at least float32 (bf16/16-mixed autocast), float64 kept for 64-true.
        dtype, x = x.dtype, x.to(torch.promote_types(x.dtype, torch.float32))
        channels = x.shape[1]
        dims = [0, *range(2, x.dim())]
        shape = (1, channels, *([1] * (x.dim() - 2)))
        # Mean first, then the spread around it: E[x^2] - mean^2 would cancel catastrophically in float32.
        totals = all_reduce(torch.cat([x.sum(dims), x.new_full((1,), x.numel() / channels)]))
        count = totals[-1]
        mean = totals[:channels] / count
        centered = x - mean.view(shape)
        var = all_reduce((centered * centered).sum(dims)) / count
        # torch types the buffers as optional: they exist when running statistics are tracked.
        tracked, running_mean, running_var = self.num_batches_tracked, self.running_mean, self.running_var
        if self.track_running_stats and tracked is not None and running_mean is not None and running_var is not None:
            with torch.no_grad():
                tracked.add_(1)
                momentum = self.momentum if self.momentum is not None else 1.0 / float(tracked)
                unbiased = var * count / (count - 1).clamp_min(1.0)
                running_mean.lerp_(mean.detach(), momentum)
                running_var.lerp_(unbiased.detach(), momentum)
        y = centered * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape).to(x.dtype) + self.bias.view(shape).to(x.dtype)
        return y.to(dtype)

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {x.dim()}D input)")


_BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def with_global_batchnorm(module: nn.Module) -> nn.Module:
    """Replace BatchNorm1d/2d/3d layers by GlobalBatchNorm, keeping their parameters and statistics."""
    for name, child in module.named_children():
        if isinstance(child, _BATCHNORMS) and type(child) in _BATCHNORMS:  # as for dropout: not subclasses
            replacement = GlobalBatchNorm(
                child.num_features, child.eps, child.momentum, child.affine, child.track_running_stats
            )
            replacement.load_state_dict(child.state_dict())
            setattr(module, name, replacement.to(next(child.parameters(), torch.empty(0)).device))
        else:
            with_global_batchnorm(child)
    return module
