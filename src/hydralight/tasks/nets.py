"""Networks for the built-in classifier, sized by their task.

A network learns the task's sizes through its constructor: `num_classes`, `input_shape` (C, H, W, as the
data module delivers them) and `in_chans` / `in_channels` (the channel count) are passed to any
`_target_` whose signature names them. The defaults are MNIST's, so networks saved before the sizes
were passed rebuild as they were.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from hydralight.config.binding import bind, import_target, instantiate
from hydralight.errors import UserError

MNIST_SHAPE = (1, 28, 28)


class SeedCNN(nn.Sequential):
    """conv32 -> conv64 -> max-pool -> fc128 -> classes, the classic MNIST example network."""

    def __init__(self, dropout: float = 0.25, num_classes: int = 10, input_shape: Sequence[int] = MNIST_SHAPE) -> None:
        c, h, w = input_shape
        super().__init__(
            nn.Conv2d(c, 32, 3), nn.ReLU(),
            nn.Conv2d(32, 64, 3), nn.ReLU(),
            nn.MaxPool2d(2), nn.Dropout(dropout), nn.Flatten(),
            nn.Linear(64 * ((h - 4) // 2) * ((w - 4) // 2), 128), nn.ReLU(), nn.Dropout(2 * dropout),
            nn.Linear(128, num_classes),
        )  # fmt: skip


class MLP(nn.Sequential):
    """C*H*W -> hidden... -> classes with ReLU."""

    def __init__(
        self,
        hidden: list[int] = (128, 256),  # type: ignore[assignment]
        num_classes: int = 10,
        input_shape: Sequence[int] = MNIST_SHAPE,
    ) -> None:
        sizes = [math.prod(input_shape), *hidden]
        layers: list[nn.Module] = [nn.Flatten()]
        for n_in, n_out in itertools.pairwise(sizes):
            layers += [nn.Linear(n_in, n_out), nn.ReLU()]
        super().__init__(*layers, nn.Linear(sizes[-1], num_classes))


class FastCNN(nn.Sequential):
    """Two conv + BatchNorm blocks (5x5 by default) and one hidden layer: cheap per sample, quick to converge.

    `pooled` > 0 pools the last feature map to pooled x pooled before the head, so large images keep a
    small head; 0 flattens the whole map (a quarter of the image per side, as on 28x28 digits).
    `kernels` are the two convolutions' sizes (odd: "same" padding keeps the map's size before each pool).
    `pool_first` max-pools each convolution's output before its BatchNorm and ReLU (conv -> pool -> norm ->
    ReLU): both then work on a quarter of the map, and on CPU the block costs about half as much.
    """

    def __init__(
        self,
        channels: list[int] = (16, 32),  # type: ignore[assignment]
        hidden: int = 128,
        conv_bias: bool = True,
        num_classes: int = 10,
        input_shape: Sequence[int] = MNIST_SHAPE,
        pooled: int = 0,
        kernels: Sequence[int] = (5, 5),
        pool_first: bool = False,
    ) -> None:
        c1, c2 = channels
        c, h, w = input_shape
        k1, k2 = kernels
        if k1 % 2 == 0 or k2 % 2 == 0:
            raise ValueError(f"FastCNN kernels={list(kernels)}: use odd sizes (e.g. [5, 3])")
        if not isinstance(pool_first, bool):  # a string from the command line ("maybe") would count as true
            raise ValueError(f"FastCNN pool_first={pool_first!r}: use true or false")
        # conv_bias=false (model=fastcnn): a bias before BatchNorm is removed by the normalization, its
        # gradient is rounding noise that Adam turns into steps. The default keeps older checkpoints loadable.
        head: list[nn.Module] = [nn.AdaptiveAvgPool2d(pooled)] if pooled else []
        side = (pooled, pooled) if pooled else (h // 4, w // 4)

        def block(n_in: int, n_out: int, k: int) -> list[nn.Module]:
            conv, norm = nn.Conv2d(n_in, n_out, k, padding=k // 2, bias=conv_bias), nn.BatchNorm2d(n_out)
            # pool_first=false keeps the layer order (and state_dict keys) of networks saved before the option.
            return [conv, nn.MaxPool2d(2), norm, nn.ReLU()] if pool_first else [conv, norm, nn.ReLU(), nn.MaxPool2d(2)]

        super().__init__(
            *block(c, c1, k1), *block(c1, c2, k2),
            *head, nn.Flatten(), nn.Linear(c2 * side[0] * side[1], hidden), nn.ReLU(), nn.Linear(hidden, num_classes),
        )  # fmt: skip


def small_resnet(
    arch: str = "resnet18", num_classes: int = 10, input_shape: Sequence[int] = MNIST_SHAPE, **kwargs: Any
) -> nn.Module:
    """A torchvision ResNet for small images: a 3x3 stride-1 stem without max-pool (the ImageNet stem
    would shrink a 28x28 or 32x32 image to 7x7 or 8x8 before the first block), any input channel count."""
    from torchvision import models

    net = getattr(models, arch)(weights=None, num_classes=num_classes, **kwargs)
    net.conv1 = nn.Conv2d(input_shape[0], net.conv1.out_channels, 3, stride=1, padding=1, bias=False)
    net.maxpool = nn.Identity()
    return net


def timm_net(name: str, num_classes: int = 10, input_shape: Sequence[int] = MNIST_SHAPE, **kwargs: Any) -> nn.Module:
    """Any timm image model by name (`model=timm model.net.name=resnet18`), with the task's classes and channels.

    timm is an optional extra: `pip install 'hydralight[timm]'`.
    """
    try:
        import timm
    except ImportError:
        raise UserError("model=timm needs timm: pip install 'hydralight[timm]' (or pip install timm)") from None
    if not timm.is_model(name):
        close = timm.list_models(f"*{name.split('_')[0]}*")[:8]
        hint = f"; similar: {', '.join(close)}" if close else "; timm.list_models() lists them"
        raise UserError(f"model.net.name={name} is not a timm model{hint}")
    return timm.create_model(name, num_classes=num_classes, in_chans=input_shape[0], **kwargs)


def task_sizes(num_classes: int, input_shape: Sequence[int]) -> dict[str, Any]:
    """What a network may take of its task, by name."""
    return {
        "num_classes": num_classes,
        "input_shape": list(input_shape),
        "in_chans": input_shape[0],
        "in_channels": input_shape[0],
    }


def build_net(
    spec: Mapping[str, Any], num_classes: int, input_shape: Sequence[int], origin: str | None = None
) -> nn.Module:
    """The network of a `_target_` spec, given the task's sizes where its constructor names them (explicit
    settings in the spec win; torchvision's builders pass `num_classes` on through **kwargs)."""
    target = import_target(str(spec.get("_target_")), "model.net._target_")
    given = bind(target, spec, task_sizes(num_classes, input_shape), "model.net", through_kwargs=("num_classes",),
                 origin=origin)  # fmt: skip
    net = instantiate(spec, **given)
    if not isinstance(net, nn.Module):
        raise UserError(
            f"model.net._target_={spec.get('_target_')} built a {type(net).__name__}, not a torch nn.Module"
        )
    return net
