"""Lightning's ``DDPStrategy`` as the engine builds it for a ``ddp`` name (``ddp``, ``ddp_spawn``, ...) given a
collective timeout (``--collective_timeout``): the ranks' start is bounded apart from the collectives."""

from __future__ import annotations

from datetime import timedelta

import torch.distributed
from lightning.pytorch.strategies import DDPStrategy as LightningDDPStrategy

from multigpu.compat import ranks_join_within

#: how long a process group waits for its ranks to join (torch's rendezvous), however short the collectives'
#: timeout: torch's and Lightning's default, 30 minutes. A rank's start (its imports, its node, a slow file system)
#: is no collective: a rank that starts late must not fail a run whose collectives are quick
START_TIMEOUT: timedelta = torch.distributed.default_pg_timeout


class DDPStrategy(LightningDDPStrategy):
    """Lightning's ``DDPStrategy`` whose process group waits up to ``START_TIMEOUT`` (or its ``timeout``, where
    longer) for the ranks to join, and ``timeout`` in every collective after."""

    def setup_environment(self) -> None:
        with ranks_join_within(self, START_TIMEOUT):
            super().setup_environment()
