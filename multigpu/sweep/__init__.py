"""Hyperparameter sweeps over ``python -m src.cli fit`` runs, with Optuna (``python -m multigpu.sweep``).

Every trial is a normal run in its own directory; workers on one machine (``--workers K``) or SLURM array tasks
share one Optuna journal in the sweep directory, claim trials under a lock, and resume a trial stopped by a
signal from its checkpoint. See docs/sweeps.md.

Modules: ``spec`` (the sweep file), ``study`` (the journal, claiming trials), ``worker`` (running trials),
``pruning`` (the callback inside each fit run), ``runner`` (the ``run`` command: checks, then K workers),
``report`` (the leaderboard and plots).
"""
