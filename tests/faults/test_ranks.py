"""What each rank of a multi-process run gets from multigpu/faults/ranks.py: a ``ddp_spawn`` worker its own copy of
the module's metric states (a ``validate`` under ``ddp_spawn`` that counts each sample once is in
tests/data/test_evaluation_order.py, on that module's shared checkpoint); when the first process fails, the ranks it
started stopped at once, and after a stop every rank agreed on, waited for; the process group destroyed at exit,
once, after the run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import lightning as L
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel
from torchmetrics import CatMetric, MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from multigpu.errors import TrainingStopped
from multigpu.faults import ranks as ranks_module
from multigpu.faults.ranks import STOPPED_RANKS_GRACE_S, StopOtherRanksOnError, unshare_module_tensors
from tests import prewarmed
from tests.conftest import REPO, cli_env
from tests.errors.test_errors import TINY_RUN, run_cli

# -- ddp_spawn: private metric states ----------------------------------------------------------------------------------


class TwoMetrics(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mean = MeanMetric()
        self.acc = MulticlassAccuracy(3, average="micro")
        self.alias = self.mean.mean_value  # two names for one tensor, as a MetricCollection's compute group has


def test_torchmetrics_keeps_a_metrics_states_as_attributes_of_the_instance():
    """What ``unshare_module_tensors`` walks: each state is in the metric's own namespace, and compute reads it."""
    mean, collected = MeanMetric(), CatMetric()
    mean.update(torch.tensor([1.0, 3.0]))
    collected.update(torch.tensor([1.0]))
    for metric in (mean, collected):
        assert metric.metric_state and all(vars(metric)[name] is state for name, state in metric.metric_state.items())
    assert isinstance(vars(collected)["value"], list)  # a list state, kept as a list
    mean.mean_value, mean.weight = torch.tensor(10.0), torch.tensor(1.0)  # as the un-sharing replaces them
    assert float(mean.compute()) == 10.0  # what compute reads


def test_metric_states_that_a_spawn_left_in_shared_memory_get_private_copies():
    module = TwoMetrics()
    module.mean.update(torch.tensor([1.0, 3.0]))
    for tensor in (module.mean.mean_value, module.mean.weight, module.acc.tp):
        tensor.share_memory_()  # what torch.multiprocessing does to every tensor it sends to a spawned process
    shared = module.mean.mean_value
    assert unshare_module_tensors(module) == 3
    assert not any(t.is_shared() for t in (module.mean.mean_value, module.mean.weight, module.acc.tp))
    assert module.alias is module.mean.mean_value  # aliases stay one tensor
    module.mean.update(torch.tensor([5.0]))
    assert shared.item() == 4.0  # the shared copy, which the other workers would see, is left alone
    assert module.mean.compute().item() == 3.0
    assert unshare_module_tensors(module) == 0  # nothing shared is left


def test_lightning_unshares_only_parameters_and_buffers_in_spawned_workers():
    """If this fails, Lightning's spawn launcher changed how it copies the module for its workers: check whether
    it now copies metric states too, and whether ``UnshareSpawnedTensors`` is still needed."""
    from lightning.fabric.strategies.launchers.multiprocessing import _disable_module_memory_sharing

    module = TwoMetrics()
    module.linear = torch.nn.Linear(2, 2)
    module.mean.mean_value.share_memory_()
    module.linear.weight.data.share_memory_()
    _disable_module_memory_sharing(module)
    assert not module.linear.weight.is_shared()
    assert module.mean.mean_value.is_shared()  # left shared: the template's callback copies it


# -- a failed rank: the others stopped ---------------------------------------------------------------------------------


def ddp_trainer_with_ranks(count: int) -> tuple[L.Trainer, list[subprocess.Popen]]:
    """A two-process ddp Trainer (not started) whose launcher watches ``count`` running processes, as the first
    process watches the ranks it started."""
    trainer = L.Trainer(accelerator="cpu", strategy="ddp", devices=2, logger=False, enable_checkpointing=False)
    ranks = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(count)]
    trainer.strategy.launcher.procs.extend(ranks)
    return trainer, ranks


def test_a_failure_kills_the_ranks_this_process_started():
    trainer, ranks = ddp_trainer_with_ranks(2)
    StopOtherRanksOnError().on_exception(trainer, BoringModel(), RuntimeError("rank 0 failed"))
    assert [rank.wait(timeout=10) for rank in ranks] == [-signal.SIGKILL] * 2
    assert trainer.strategy.launcher.procs == []  # out of Lightning's watch, which would kill this process


def test_an_agreed_stop_waits_for_the_ranks_at_exit_instead(monkeypatch):
    registered = []
    monkeypatch.setattr(ranks_module.atexit, "register", lambda *call: registered.append(call))
    trainer, ranks = ddp_trainer_with_ranks(1)
    StopOtherRanksOnError().on_exception(trainer, BoringModel(), TrainingStopped("stopped at step 3", exit_code=75))
    assert ranks[0].poll() is None  # still running: it saves and exits with the same status
    assert registered == [(ranks_module.wait_for_exit, ranks, STOPPED_RANKS_GRACE_S)]
    ranks[0].kill()
    ranks[0].wait(timeout=10)


def test_one_process_has_no_ranks_to_stop():
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
    StopOtherRanksOnError().on_exception(trainer, BoringModel(), RuntimeError("failed"))  # nothing to stop


class FailAtStep(L.Callback):
    """Test-only: on rank ``rank``, after optimizer step ``step``, raise (``how="raise"``) or SIGKILL itself."""

    def __init__(self, step: int = 3, rank: int = 1, how: str = "raise") -> None:
        self.step, self.rank, self.how = step, rank, how

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"rank {self.rank} fails at step {self.step}")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("strategy", "rank", "how"),
    # rank 1 raising under ddp: test_the_rank_that_raised_first_is_the_error_read_last (test_stack_dumps.py)
    [("ddp", 0, "raise"), ("ddp", 1, "kill"), ("ddp", 0, "kill"), ("ddp_spawn", 1, "raise")],
)
def test_a_failing_rank_stops_every_process_promptly(tmp_path, strategy, rank, how):
    result, seconds = run_cli(
        "fit",
        *TINY_RUN,
        "--trainer.accelerator=cpu",
        f"--trainer.strategy={strategy}",
        "--trainer.devices=2",
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.max_steps=20",
        "--trainer.callbacks+=tests.faults.test_ranks.FailAtStep",
        f"--trainer.callbacks.rank={rank}",
        f"--trainer.callbacks.how={how}",
    )
    assert result.returncode != 0
    assert seconds < 60
    if how == "raise":
        error = f"RuntimeError: rank {rank} fails at step 3"
        lines = result.stderr.splitlines()
        assert sum(line.endswith(error) for line in lines) == 1, result.stderr  # its traceback, once
        # a rank that lost it in a collective ends the output with that first failure, in one line
        assert error in lines[-1] or lines[-1].endswith(error), result.stderr
    # a rank still waiting in a collective may add gloo's own error for the lost connection, which points at the
    # failing rank ("This is typically caused by a remote worker ..."); nothing else
    others = result.stderr.count("Traceback") - (how == "raise")
    assert others == 0 or (others == 1 and "remote worker" in result.stderr), result.stderr
    assert result.stderr.count("stopped: ") <= 1, result.stderr
    if (strategy, rank, how) == ("ddp", 0, "kill"):  # rank 0, which speaks for the others, is gone: rank 1 reports
        assert result.returncode == -signal.SIGKILL
        assert "error: (rank 1) a collective failed on rank 1 (" in result.stderr, result.stderr
        assert "Rank 0 sent no stack (its process is gone" in result.stderr, result.stderr


# -- exit: the process group destroyed ---------------------------------------------------------------------------------


SCRIPT = textwrap.dedent(
    """
    import sys
    import torch.distributed as dist
    from multigpu.faults.ranks import DestroyProcessGroupAtExit

    dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}", rank=0, world_size=1)
    destroy = dist.destroy_process_group

    def counted():
        print("destroyed", flush=True)
        destroy()
        print("initialized after:", dist.is_initialized(), flush=True)

    dist.destroy_process_group = counted
    callback = DestroyProcessGroupAtExit()
    callback.setup(None, None, "fit")
    callback.setup(None, None, "validate")  # a second run in the same process: still destroyed once
    print("run ends", flush=True)
    """
)


def test_the_process_group_is_destroyed_once_at_exit_after_the_run(tmp_path):
    result = prewarmed.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "store")],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["run ends", "destroyed", "initialized after: False"]
