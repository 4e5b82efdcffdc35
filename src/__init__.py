"""This repository's own project on the engine (``multigpu``): its command line, the example models and
data modules, run as ``python -m src.cli``."""
