"""`python -m hydralight [overrides]`: the training entrypoint, as `python train.py` (see README.md)."""

if __name__ == "__main__":
    # The entrypoint is run from the imported `hydralight.train`, never defined here: submitit pickles
    # `hydralight.train.main` for its jobs, and processes started with spawn re-import this file as
    # `__mp_main__`, where the guard keeps them from starting another run.
    from hydralight.train import cli

    cli()
