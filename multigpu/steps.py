"""When per-step work is due: each time the optimizer step count crosses a multiple of ``n`` (not "is": one batch may
make several steps under manual optimization, and none between accumulated micro-batches)."""

from __future__ import annotations


class EveryNSteps:
    """``due(step)`` is true once each time ``step`` crosses a multiple of ``n`` (``n=0``: never) after ``start``."""

    def __init__(self, n: int = 1, start: int = -1) -> None:
        self.n = n
        self.last = start

    def due(self, step: int) -> bool:
        if self.n <= 0 or step // self.n <= self.last // self.n:
            return False
        self.last = step
        return True
