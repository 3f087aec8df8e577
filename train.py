"""`python train.py [overrides]`: see README.md. The entrypoint lives in the hydralight package."""

from hydralight.train import cli

if __name__ == "__main__":
    cli()
