"""When per-step work is due (multigpu/steps.py): once each time the step count crosses a multiple."""

from __future__ import annotations

from multigpu.steps import EveryNSteps


def test_every_n_steps_is_due_when_a_multiple_is_crossed():
    every = EveryNSteps(5, start=3)  # resumed at step 3
    assert [step for step in (4, 5, 5, 6, 9, 11, 12, 15) if every.due(step)] == [5, 11, 15]
    new_step = EveryNSteps()
    assert [step for step in (0, 0, 1, 1, 3) if new_step.due(step)] == [0, 1, 3]
    assert not EveryNSteps(0).due(100)
