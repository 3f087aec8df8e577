"""The run dir layer: the names of every file a run or a sweep writes, which process writes them (launchers,
ranks), the lock that keeps one live process per dir, the records, and the secrets kept out of them.

The lowest layer: no torch, Lightning, Hydra composition or data imports; launchers and reports use it
before anything heavy is loaded.
"""
