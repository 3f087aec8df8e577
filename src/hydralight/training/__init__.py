"""Building and running a training job from its plan: the module and its keyed layers, the trainer and its
callbacks, loggers, the DDP strategy, the console, and the records a run keeps of itself."""
