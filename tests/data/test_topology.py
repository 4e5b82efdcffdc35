"""``multigpu/data/topology.py``: the data-parallel replica a process feeds, for the data side."""

import sys

from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy

from multigpu.data.topology import data_parallel_world
from tests import prewarmed
from tests.conftest import REPO, cli_env


def test_data_parallel_world_is_only_for_model_parallel_strategies():
    assert data_parallel_world(DDPStrategy()) is None

    class TwoByTwo(ModelParallelStrategy):  # a mesh of 2 data-parallel x 2 tensor-parallel ranks, rank 3
        @property
        def distributed_sampler_kwargs(self) -> dict:
            return {"num_replicas": 2, "rank": 1}

    assert data_parallel_world(TwoByTwo()) == (2, 1)


def test_a_data_module_imports_no_strategy():
    """The data side learns the replica it feeds without loading FSDP2, DTensor or the sharded checkpoints."""
    probe = "import sys, multigpu.data.base; print(sorted(m for m in sys.modules if m.startswith('multigpu.')))"
    loaded = prewarmed.run(
        [sys.executable, "-c", probe], cwd=REPO, env=cli_env(), capture_output=True, text=True, check=True
    )
    assert "multigpu.data.topology" in loaded.stdout
    assert "multigpu.strategies" not in loaded.stdout and "multigpu.checkpoints" not in loaded.stdout
