"""How runs and sweeps are sent out: the SLURM and local launchers sized by each job's plan, the
hyperparameter search (a Hydra sweeper), the line a sweep ends with, and dstack task configurations."""
