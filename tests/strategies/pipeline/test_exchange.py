"""``multigpu/strategies/pipeline/exchange.py`` in one process (the GPT example's runs over two processes are in
tests/examples/test_gpt_pipeline.py): an activation's header, and the forward through the stages."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from multigpu.strategies.pipeline.exchange import _DTYPES, _header, _read_header, forward_through_stages


@pytest.mark.parametrize("dtype", _DTYPES)
def test_a_header_carries_an_activations_dtype_and_shape(dtype):
    for shape in [(), (2,), (2, 3, 4, 5, 6, 7)]:  # up to 6 dimensions
        activation = torch.zeros(shape, dtype=dtype)
        assert _read_header(_header(activation, activation.device)) == (activation.shape, dtype)


def test_the_forward_runs_the_stages_in_order_and_gives_the_pipeline_the_last_stages_output(process_group):
    stages = {0: nn.Linear(3, 4), 1: nn.Linear(4, 2)}  # one rank holding both stages
    inputs = torch.randn(5, 3)
    with torch.no_grad():
        output = forward_through_stages(stages, inputs, process_group, 0, 1, 2, torch.device("cpu"))
        torch.testing.assert_close(output, stages[1](stages[0](inputs)))
