"""Strategies this template adds to Lightning's registry (``dp``)."""

from src.strategies.dp import DataParallelStrategy, register_dp_strategy

__all__ = ["DataParallelStrategy", "register_dp_strategy"]
