"""``--trainer.strategy=dp`` on one device costs what ``single`` costs: the module's forward is not wrapped, and a
training step runs the same operators and the same strategy calls, and trains the same weights, as under ``single``
(dp over several devices: tests/strategies/test_dp.py)."""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from multigpu.strategies import DataParallelStrategy
from multigpu.strategies.dp import ParallelForward
from tests.cli import main
from tests.conftest import TINY, load_state

#: the strategy's methods Lightning and the engine may call in a step: the collectives under ddp, the batch's move
STRATEGY_CALLS = ("reduce", "all_gather", "barrier", "broadcast", "reduce_boolean_decision", "batch_to_device")
#: what a ParallelStrategy answers by a property where SingleDeviceStrategy has a constant or an attribute
RANK_PROPERTIES = {"is_distributed", "world_size", "root_device", "parallel_devices"}
#: the step counted, after the first steps' one-time work (the optimizer's state, the loggers' first rows)
COUNTED_STEP = 5


def test_one_cuda_device_leaves_the_forward_unwrapped_and_two_wrap_it():
    one, two = nn.Linear(2, 2), nn.Linear(2, 2)
    DataParallelStrategy(parallel_devices=[torch.device("cuda", 0)])._setup_model(one)
    assert "forward" not in vars(one)  # the class's forward, called directly
    DataParallelStrategy(parallel_devices=[torch.device("cuda", 0), torch.device("cuda", 1)])._setup_model(two)
    assert isinstance(vars(two).get("forward"), ParallelForward)


class OperatorLog(TorchDispatchMode):
    """Every aten operator run while the mode is on, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


class OneStepCounts(L.Callback):
    """By the strategy's name: the operators and the strategy's calls from the start of training step
    ``COUNTED_STEP`` to the next one's, and the Python functions called in the step after (without the operators'
    log, whose own Python work runs once per process)."""

    counted: dict[str, tuple[list[str], Counter, Counter]] = {}

    def __init__(self) -> None:
        self.mode: OperatorLog | None = None
        self.mode_ops: list[str] = []
        self.calls: Counter = Counter()
        self.functions: Counter = Counter()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        strategy = trainer.strategy
        for name in STRATEGY_CALLS:
            method = getattr(strategy, name)

            def counted(*args: Any, _method: Any = method, _name: str = name, **kwargs: Any) -> Any:
                self.calls[_name] += self.mode is not None
                return _method(*args, **kwargs)

            setattr(strategy, name, counted)

    def called(self, frame: Any, event: str, arg: Any) -> None:  # sys.setprofile's hook
        if event == "call":
            self.functions[(frame.f_code.co_filename, frame.f_code.co_name)] += 1

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, index: int) -> None:
        # from one step's start to the next's: the other callbacks' work at the batch's end and the logging count
        sys.setprofile(None)
        if self.mode is not None:
            self.mode.__exit__(None, None, None)
            self.mode_ops, self.mode = self.mode.ops, None
            sys.setprofile(self.called)
        if trainer.global_step == COUNTED_STEP:
            self.mode = OperatorLog()
            self.mode.__enter__()
        if trainer.global_step == COUNTED_STEP + 2:
            self.counted[type(trainer.strategy).__name__] = (self.mode_ops, self.calls, self.functions)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for name in STRATEGY_CALLS:
            vars(trainer.strategy).pop(name)


def test_dp_on_one_device_runs_the_steps_of_single_and_trains_the_same_weights(tmp_path, monkeypatch):
    monkeypatch.setattr(OneStepCounts, "counted", {})
    for strategy in ("single_device", "dp"):
        main(["fit", *TINY, f"--trainer.strategy={strategy}", "--trainer.devices=1", "--trainer.max_steps=8",
              "--trainer.limit_val_batches=1", "--trainer.log_every_n_steps=1", "--model.init_args.dropout=0.25",
              "--trainer.callbacks+=tests.strategies.test_dp_one_device.OneStepCounts", "--progress_bar=plain",
              f"--trainer.default_root_dir={tmp_path / strategy}"])  # fmt: skip
    single, dp = OneStepCounts.counted["SingleDeviceStrategy"], OneStepCounts.counted["DataParallelStrategy"]
    assert {"aten.addmm.default", "aten.bernoulli_.float", "aten.addcdiv_.default"} <= set(single[0])  # AdamW
    assert dp[0] == single[0]  # the same operators, in the same order
    assert dp[1] == single[1] and single[1]["batch_to_device"] == 1  # the strategy's calls, logging's among them
    # the Python functions that ran: the same, but for the rank properties a ParallelStrategy reads (a few µs)
    differ = (single[2] - dp[2]) + (dp[2] - single[2])
    assert sum(single[2].values()) > 1000 and {function for _, function in differ} <= RANK_PROPERTIES
    assert sum(differ.values()) < 0.01 * sum(single[2].values())
    weights = [load_state(tmp_path / strategy / "checkpoints" / "last.ckpt") for strategy in ("single_device", "dp")]
    assert list(weights[0]) == list(weights[1])
    assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0])
