"""A rank that falls behind, written the way a user's code does it: a classifier whose training step sleeps on
one rank, once for long (stuck, the others time out in the gradient all-reduce) or a little at every step (a
straggler)."""

from __future__ import annotations

import time
from typing import Any

from multigpu.errors import ConfigurationError
from tests.fixtures.workload import TinyClassifier


class SleepyClassifier(TinyClassifier):
    """``TinyClassifier`` whose ``training_step`` on rank ``rank`` sleeps ``stuck_seconds`` at step
    ``stuck_at_step`` (-1: never) and ``slow_seconds`` at every step.

    Args:
        rank: The rank that sleeps.
        stuck_at_step: The optimizer step at which it sleeps ``stuck_seconds``.
        stuck_seconds: How long it sleeps there.
        slow_seconds: How long it sleeps at every step.
        **kwargs: ``TinyClassifier``'s.
    """

    def __init__(
        self,
        rank: int = 1,
        stuck_at_step: int = -1,
        stuck_seconds: float = 600.0,
        slow_seconds: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.rank, self.stuck_at_step = rank, stuck_at_step
        self.stuck_seconds, self.slow_seconds = stuck_seconds, slow_seconds

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.global_rank == self.rank:
            if self.global_step == self.stuck_at_step:
                time.sleep(self.stuck_seconds)  # STUCK HERE
            time.sleep(self.slow_seconds)
        return super().training_step(batch, batch_idx)


class FailingClassifier(TinyClassifier):
    """``TinyClassifier`` whose ``training_step`` raises on rank ``rank`` at optimizer step ``fail_at_step``, as a
    bug met by one rank only (its data, its branch) does, or a bad input only that rank reads.

    Args:
        rank: The rank that raises.
        fail_at_step: The optimizer step at which it raises.
        configuration_error: Raise a ``ConfigurationError`` (one paragraph, exit status 2) instead of a bug's error.
        **kwargs: ``TinyClassifier``'s.
    """

    def __init__(self, rank: int = 1, fail_at_step: int = 3, configuration_error: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rank, self.fail_at_step, self.configuration_error = rank, fail_at_step, configuration_error

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.global_rank == self.rank and self.global_step == self.fail_at_step:
            if self.configuration_error:
                raise ConfigurationError(f"rank {self.rank}'s shard is empty. Fix: give every rank samples.")
            raise ValueError(f"a sample of rank {self.rank} has no label")  # FAILS HERE
        return super().training_step(batch, batch_idx)


class DesyncClassifier(TinyClassifier):
    """``TinyClassifier`` whose rank ``rank`` alone gathers its loss at step ``at_step``, as a collective under
    a rank condition does: the other ranks are in the gradient all-reduce meanwhile.

    Args:
        rank: The rank that gathers.
        at_step: The optimizer step at which it does.
        **kwargs: ``TinyClassifier``'s.
    """

    def __init__(self, rank: int = 1, at_step: int = 3, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rank, self.at_step = rank, at_step

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        if self.global_rank == self.rank and self.global_step == self.at_step:
            self.all_gather(loss.detach())  # GATHERS HERE
        return loss
