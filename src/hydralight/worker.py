"""Entry point of the extra DDP ranks of a job: `python -m hydralight.worker <job dir>/plan.yaml`.

They run the plan rank 0 resolved and saved, not the command line again. Started early by the launching
rank (`python -m hydralight.worker -`), a rank imports what it runs first, then reads one line on stdin: its
environment and the plan file, sent when Lightning would start it; an empty stdin (the job ended before it
trained) ends it quietly."""

from __future__ import annotations

import json
import os
import signal
import sys

import yaml

from hydralight.config.plan import RunPlan
from hydralight.errors import exit_on_user_error


@exit_on_user_error
def main(plan_file: str) -> None:
    if plan_file == "-":
        # Ctrl-C in the shell reaches every process of the group; the launching rank stops this one itself.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        # The imports that take seconds, done while the launching rank prepares.
        import hydralight.data.contract  # noqa: F401
        import hydralight.resume.policy  # noqa: F401
        import hydralight.train  # noqa: F401
        import hydralight.training.trainer  # noqa: F401

        told = sys.stdin.readline()
        if not told.strip():
            return
        message = json.loads(told)
        os.environ.clear()
        os.environ.update(message["env"])
        plan_file = message["plan_file"]
        signal.signal(signal.SIGINT, previous)
    from hydralight.train import run
    from hydralight.training.machine import detect

    with open(plan_file) as f:
        run(RunPlan.from_dict(yaml.safe_load(f)), detect())


if __name__ == "__main__":
    main(sys.argv[1])
