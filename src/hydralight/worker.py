"""Entry point of the extra DDP ranks of a job: `python -m hydralight.worker <job dir>/plan.yaml`.

They run the plan rank 0 resolved and saved, not the command line again."""

from __future__ import annotations

import sys

import yaml

from hydralight.config.plan import RunPlan
from hydralight.errors import exit_on_user_error


@exit_on_user_error
def main(plan_file: str) -> None:
    from hydralight.train import run
    from hydralight.training.machine import detect

    with open(plan_file) as f:
        run(RunPlan.from_dict(yaml.safe_load(f)), detect())


if __name__ == "__main__":
    main(sys.argv[1])
