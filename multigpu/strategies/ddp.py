"""Lightning's ``DDPStrategy`` for the ``ddp`` names given ``--collective_timeout``; every process told its place
by torchrun's variables, however it was launched."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import TYPE_CHECKING

import torch.distributed
from lightning.pytorch.strategies import DDPStrategy as LightningDDPStrategy
from lightning.pytorch.strategies import ParallelStrategy

from multigpu.compat import ranks_join_within

# a rank that starts late (imports, a slow file system) must not fail a run whose collectives are quick
START_TIMEOUT: timedelta = torch.distributed.default_pg_timeout


def export_launch_variables(strategy: ParallelStrategy) -> dict[str, str | None]:
    """Set the variables torchrun sets in every process it starts (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``): Lightning's own launcher sets three of them and SLURM none, and a data
    library that shards itself by reading them (rather than ``torch.distributed``) would otherwise take every process
    for rank 0. Where the launch set them (torchrun), the strategy's ranks are theirs. Returns the values they had,
    for ``put_back_launch_variables`` at the strategy's teardown: a process started after the run must not take
    itself for one of torchrun's."""
    place = {
        "RANK": strategy.global_rank,
        "WORLD_SIZE": strategy.world_size,
        "LOCAL_RANK": strategy.local_rank,
        "LOCAL_WORLD_SIZE": strategy.num_processes,  # type: ignore[attr-defined]
        "GROUP_RANK": strategy.node_rank,
    }
    before = {name: os.environ.get(name) for name in place}
    os.environ.update({name: str(value) for name, value in place.items()})
    return before


def put_back_launch_variables(before: dict[str, str | None]) -> None:
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


# typed as the strategy it is mixed into; a plain mixin at run time
_Parallel = ParallelStrategy if TYPE_CHECKING else object


class PlacedRanks(_Parallel):
    """Ranks given ``START_TIMEOUT`` to join, and torchrun's variables set from setup to teardown."""

    #: torchrun's variables as they were before ``setup_environment`` set them, put back at ``teardown``
    launch_variables_before: dict[str, str | None] = {}

    def setup_environment(self) -> None:
        with ranks_join_within(self, START_TIMEOUT):
            super().setup_environment()
        self.launch_variables_before = export_launch_variables(self)

    def teardown(self) -> None:
        super().teardown()
        put_back_launch_variables(self.launch_variables_before)
        self.launch_variables_before = {}


class DDPStrategy(PlacedRanks, LightningDDPStrategy):
    """Lightning's ``DDPStrategy`` whose ranks have ``START_TIMEOUT`` to join, and ``timeout`` in every collective."""
