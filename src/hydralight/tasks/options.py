"""Typed configs of the built-in model options (model=cnn, mlp, fastcnn, ...), checked when a config is
composed. No torch imports: the command line is checked before torch loads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hydralight.config.schema import ModuleOptions, choice

CompileMode = choice("CompileMode", ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"))


@dataclass
class ClassifierOptions(ModuleOptions):
    """The classifier's options: a network under `net`."""

    _target_: str = "hydralight.tasks.classifier.Classifier"
    # The classifier builds its network itself, sized by the data: Hydra must not build `net` first.
    _recursive_: bool = False
    net: Any = None  # a `_target_` spec of an nn.Module
    label_smoothing: float = 0.0
    compile: bool = False  # torch.compile the network (worth it on GPUs, where Python overhead dominates)
    compile_mode: CompileMode = CompileMode.default  # type: ignore[attr-defined]
    channels_last: bool = False  # NHWC memory layout for convolutions (faster with tensor cores)


# `- /schema@_here_: <name>` in an option's defaults.
SCHEMAS = {"classifier": ClassifierOptions}
