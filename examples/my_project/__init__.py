"""An example project trained by hydralight: a network for the built-in classifier, a LightningModule and a
LightningDataModule of its own. None of it imports hydralight."""
