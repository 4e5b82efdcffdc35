"""This project: its command line (``python -m src.cli``), models and data modules, on the engine ``multigpu``."""
