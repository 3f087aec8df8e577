"""`lightning.pytorch` and `lightning.fabric` imports resolve to the classes the project's Trainer runs."""

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_both_namespaces_are_one_set_of_classes():
    code = """
from hydralight import lightning_namespaces
lightning_namespaces.install()
import lightning as L
import lightning_fabric
import pytorch_lightning as pl
from lightning.pytorch import LightningDataModule, Trainer
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.fabric.utilities.seed import seed_everything
import lightning.pytorch.loggers as loggers
assert L.LightningModule is pl.LightningModule and LightningDataModule is pl.LightningDataModule
assert Trainer is L.Trainer is pl.Trainer and Callback is pl.Callback
assert ModelCheckpoint is pl.callbacks.ModelCheckpoint and loggers is pl.loggers
assert L.fabric is lightning_fabric and seed_everything is lightning_fabric.utilities.seed.seed_everything
assert pl.__spec__.name == "pytorch_lightning" and L.__version__ == pl.__version__
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
