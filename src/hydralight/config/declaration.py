"""What a LightningModule declares to the run, read from its class. Any module may; every part is optional,
and the built-in ones use nothing else:

- `lr_from_plan = True`: its learning rate is always the plan's (`optim.lr`, scaled with the batch), even where
  its constructor has a default; `model.lr` is refused. Without it, a module whose `lr` argument has no
  default gets the plan's, and one with a default keeps its own unless the run chooses one.
- `how_it_runs = ("compile", ...)`: constructor arguments that choose how it runs, not what it is (the weights
  are the same): a checkpoint is tested with this run's values of them.
- `check_config(config)`, a classmethod (of a data module too): refuses values of its config (`raise ValueError("model.x=... is out of
  range: ...")`) before anything is written or launched; the message is the line the user reads.
- `takes_sample_ids = True`: its batches may carry sample ids (the built-in data modules' last element).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from hydralight.errors import UserError, run_config_check


@dataclass(frozen=True)
class ModuleDeclaration:
    target: Any = None  # the class, when it could be imported here
    lr_from_plan: bool = False
    lr_required: bool = False
    own_lr: float | None = None  # the default of its `lr` argument
    how_it_runs: tuple[str, ...] = ()

    @classmethod
    def of(cls, spec: dict[str, Any]) -> ModuleDeclaration:
        """The declaration of the module `spec` names; nothing declared when it cannot be imported here (a plan
        made elsewhere: the module is refused in one line where it is built)."""
        from hydralight.config.binding import import_target

        try:
            target = import_target(str(spec["_target_"]), "model._target_")
            lr = inspect.signature(target).parameters.get("lr")
        except (UserError, TypeError, ValueError, KeyError):
            return cls()
        return cls(
            target=target,
            lr_from_plan=bool(getattr(target, "lr_from_plan", False)),
            lr_required=lr is not None and lr.default is inspect.Parameter.empty,
            own_lr=float(lr.default) if lr is not None and isinstance(lr.default, int | float) else None,
            how_it_runs=tuple(getattr(target, "how_it_runs", ())),
        )

    def check(self, spec: dict[str, Any]) -> None:
        """The module's own check of its config: a refusal is one line."""
        checker = getattr(self.target, "check_config", None)
        if callable(checker):
            run_config_check(checker, {k: v for k, v in spec.items() if not k.startswith("_")})
