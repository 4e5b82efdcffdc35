"""When per-step work is due: each time the optimizer step count crosses a multiple of ``n``.

"Crossed", not "is": with manual optimization one batch may make several optimizer steps, and between the
micro-batches of an accumulated step the count does not move.
"""

from __future__ import annotations


class EveryNSteps:
    """``due(step)`` is true once each time ``step`` crosses a multiple of ``n`` (``n=1``: any new step; ``n=0``:
    never). ``start``: the step already seen, e.g. ``trainer.global_step`` of a resumed run."""

    def __init__(self, n: int = 1, start: int = -1) -> None:
        self.n = n
        self.last = start

    def due(self, step: int) -> bool:
        if self.n <= 0 or step // self.n <= self.last // self.n:
            return False
        self.last = step
        return True
