"""Lightning's ``DDPStrategy`` as the engine builds it for a ``ddp`` name (``ddp``, ``ddp_spawn``, ...) given a
collective timeout (``--collective_timeout``): the ranks' start is bounded apart from the collectives; and every
process told its place in the job by torchrun's variables, however it was launched."""

from __future__ import annotations

import os
from datetime import timedelta

import torch.distributed
from lightning.pytorch.strategies import DDPStrategy as LightningDDPStrategy
from lightning.pytorch.strategies import ParallelStrategy

from multigpu.compat import ranks_join_within

#: how long a process group waits for its ranks to join (torch's rendezvous), however short the collectives'
#: timeout: torch's and Lightning's default, 30 minutes. A rank's start (its imports, its node, a slow file system)
#: is no collective: a rank that starts late must not fail a run whose collectives are quick
START_TIMEOUT: timedelta = torch.distributed.default_pg_timeout


def export_launch_variables(strategy: ParallelStrategy) -> None:
    """Set the variables torchrun sets in every process it starts (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``) where the launch did not: Lightning's own launcher sets three of them and
    SLURM none, and a data library that shards itself by reading them (rather than ``torch.distributed``) would
    otherwise take every process for rank 0. A value the launch set is kept."""
    place = {
        "RANK": strategy.global_rank,
        "WORLD_SIZE": strategy.world_size,
        "LOCAL_RANK": strategy.local_rank,
        "LOCAL_WORLD_SIZE": strategy.num_processes,  # type: ignore[attr-defined]
        "GROUP_RANK": strategy.node_rank,
    }
    for name, value in place.items():
        os.environ.setdefault(name, str(value))


class DDPStrategy(LightningDDPStrategy):
    """Lightning's ``DDPStrategy`` whose process group waits up to ``START_TIMEOUT`` (or its ``timeout``, where
    longer) for the ranks to join, and ``timeout`` in every collective after."""

    def setup_environment(self) -> None:
        with ranks_join_within(self, START_TIMEOUT):
            super().setup_environment()
        export_launch_variables(self)
