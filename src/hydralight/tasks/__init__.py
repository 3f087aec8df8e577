"""Task modules: LightningModules the run trains like any a user brings (the built-in classifier and its
networks, the character-level language model example). They use no part of the core but the binding of
the plan's values to constructor arguments."""
