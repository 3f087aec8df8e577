"""Offline reports of sweeps and searches, read from the files the runs wrote (hydralight.rundir) only."""
