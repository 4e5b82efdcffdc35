"""The callbacks the engine adds to a run; their order: ``run_callbacks`` in ``multigpu/run.py``."""
