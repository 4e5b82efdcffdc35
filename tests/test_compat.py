"""One fast test per function of ``src/compat.py``: each fails when the library changes the private name under it."""

from __future__ import annotations

# -- Lightning: the fit loop's counters and switches --------------------------------------------------------

# -- Lightning: checkpointing, strategies, launchers --------------------------------------------------------


def test_set_mesh_sizes_sets_the_sizes_model_parallel_strategy_keeps():
    from lightning.pytorch.strategies import ModelParallelStrategy

    from src.compat import set_mesh_sizes

    strategy = ModelParallelStrategy(data_parallel_size="auto", tensor_parallel_size="auto")
    kept = {name: value for name, value in vars(strategy).items() if value == "auto"}
    assert set(kept) == {"_data_parallel_size", "_tensor_parallel_size"}  # the names the function writes
    set_mesh_sizes(strategy, data_parallel=4, tensor_parallel=1)
    assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == (4, 1)


# -- jsonargparse and LightningCLI --------------------------------------------------------------------------

# -- torch --------------------------------------------------------------------------------------------------
