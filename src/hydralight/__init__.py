"""Hydra-configured PyTorch Lightning training, from one CPU to many GPU nodes."""

__version__ = "0.1.0"
