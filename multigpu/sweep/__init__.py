"""Hyperparameter sweeps over fit runs, with Optuna (``python -m multigpu.sweep``; docs/sweeps.md): workers share
one journal, claim trials under a lock, and resume a stopped trial from its checkpoint."""
