"""`python train.py [overrides]`: see README.md. The entrypoint lives in the hydralight package."""

if __name__ == "__main__":
    try:
        from hydralight.train import cli
    except KeyboardInterrupt:  # Ctrl-C while Python imports it: the shell's code for it, no traceback
        raise SystemExit(130) from None
    cli()
