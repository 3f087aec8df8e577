"""`python train.py [overrides]`: see README.md. The entrypoint lives in the hydralight package."""

# Imported here, not under __main__: ddp_spawn's workers import this file again as their main module.
try:
    from hydralight.train import cli
except KeyboardInterrupt:  # Ctrl-C while Python imports it: the shell's code for it, no traceback
    raise SystemExit(130) from None

if __name__ == "__main__":
    cli()
