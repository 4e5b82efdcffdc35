"""The engine's ``DDPStrategy`` (multigpu/strategies/ddp.py): its process group waits for the ranks to join as long
as ``START_TIMEOUT``, and its ``timeout`` in every collective; a ``ddp`` name with ``--collective_timeout`` builds it.
Two ranks stuck past a short collective timeout: tests/faults/test_stack_dumps.py."""

from __future__ import annotations

import os
from datetime import timedelta

import lightning as L
import torch
import torch.distributed as dist

from multigpu.compat import collective_timeout
from multigpu.strategies.ddp import START_TIMEOUT, DDPStrategy
from tests.cli import TemplateCLI
from tests.conftest import TINY

LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


def test_the_ranks_join_within_the_start_bound_and_the_collectives_wait_the_timeout():
    strategy = DDPStrategy(timeout=timedelta(seconds=5))
    L.Trainer(accelerator="cpu", strategy=strategy, devices=1, logger=False)  # its accelerator and environment
    try:
        strategy.setup_environment()
        store = dist.distributed_c10d._get_default_store()
        assert store.timeout == START_TIMEOUT == timedelta(minutes=30)  # the rendezvous' bound, and the store's
        gloo = dist.group.WORLD._get_backend(torch.device("cpu"))
        assert gloo.options._timeout == timedelta(seconds=5) == collective_timeout(strategy)
    finally:
        strategy.teardown()
        dist.destroy_process_group()


def test_a_ddp_name_with_a_collective_timeout_builds_the_engines_strategy():
    args = [*TINY, "--trainer.accelerator=cpu", "--trainer.devices=2", "--collective_timeout=42"]
    for name in ("ddp", "ddp_spawn"):
        strategy = TemplateCLI(args=[*args, f"--trainer.strategy={name}"], run=False).trainer.strategy
        assert type(strategy) is DDPStrategy and collective_timeout(strategy) == timedelta(seconds=42)


def test_every_process_is_told_its_place_by_torchruns_variables_until_the_teardown(monkeypatch):
    """A data library that shards itself by reading torchrun's variables (MosaicML's streaming) finds this process's
    ranks, however it was launched; after the run the process holds what it held before."""
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "1")  # as Lightning's launcher sets it
    strategy = DDPStrategy()
    L.Trainer(accelerator="cpu", strategy=strategy, devices=1, logger=False)
    try:
        strategy.setup_environment()
        assert {name: os.environ.get(name) for name in LAUNCH_VARIABLES} == dict.fromkeys(LAUNCH_VARIABLES, "0") | {
            "WORLD_SIZE": "1",
            "LOCAL_WORLD_SIZE": "1",
        }
    finally:
        strategy.teardown()
        dist.destroy_process_group()
    assert {name: os.environ.get(name) for name in LAUNCH_VARIABLES} == dict.fromkeys(LAUNCH_VARIABLES) | {
        "WORLD_SIZE": "1"
    }
