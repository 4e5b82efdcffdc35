"""Every private name of Lightning, jsonargparse and torch that the template relies on, in one place.

Each is a small function with a one-line reason; ``tests/test_compat.py`` has a fast test for each that fails
loudly when a library release renames or changes it. Nothing else in ``src/`` reaches into another object's
internals, so an upgrade of Lightning is checked by running that one test file.
"""

from __future__ import annotations

from typing import Any

# -- Lightning: the fit loop's counters and switches --------------------------------------------------------

# -- Lightning: checkpointing, strategies, launchers --------------------------------------------------------


def set_mesh_sizes(strategy: Any, data_parallel: int, tensor_parallel: int) -> None:
    """Set a ``ModelParallelStrategy``'s mesh sizes once the world size is known (its ``__init__`` takes them
    before the processes exist, and its ``"auto"`` puts the processes of a node on the tensor-parallel side)."""
    strategy._data_parallel_size = data_parallel
    strategy._tensor_parallel_size = tensor_parallel


# -- jsonargparse and LightningCLI --------------------------------------------------------------------------

# -- torch --------------------------------------------------------------------------------------------------
