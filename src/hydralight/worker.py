"""Entry point of the extra DDP ranks of a job: `python -m hydralight.worker <job dir>/config.yaml`."""

from __future__ import annotations

import sys

from omegaconf import OmegaConf

from hydralight.errors import exit_on_user_error


@exit_on_user_error
def main(config_file: str) -> None:
    from hydralight.train import run

    run(OmegaConf.load(config_file))


if __name__ == "__main__":
    main(sys.argv[1])
