"""The configuration layer: from the command line to one frozen run plan (compose, schema, resolve).

No torch, Lightning or data imports (checked by the import contract in pyproject.toml): `--cfg job`,
`plan=true` and the launchers that size SLURM jobs stay quick.
"""
