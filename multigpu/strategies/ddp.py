"""Lightning's ``DDPStrategy`` for the ``ddp`` names given ``--collective_timeout``."""

from __future__ import annotations

from datetime import timedelta

import torch.distributed
from lightning.pytorch.strategies import DDPStrategy as LightningDDPStrategy

from multigpu.compat import ranks_join_within

# a rank that starts late (imports, a slow file system) must not fail a run whose collectives are quick
START_TIMEOUT: timedelta = torch.distributed.default_pg_timeout


class DDPStrategy(LightningDDPStrategy):
    """Lightning's ``DDPStrategy`` whose ranks have ``START_TIMEOUT`` to join, and ``timeout`` in every collective."""

    def setup_environment(self) -> None:
        with ranks_join_within(self, START_TIMEOUT):
            super().setup_environment()
