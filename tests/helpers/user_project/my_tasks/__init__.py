"""A user's own package: LightningModules and a LightningDataModule written without any part of hydralight."""
