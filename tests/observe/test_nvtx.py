"""The Nsight preset (configs/debug/nsight.yaml, ``NvtxRanges``): on the CPU it says in one line that it marks
nothing; on a CUDA device (here the device check stands in, and torch's NVTX calls are recorded) every training step
and its phases open and close in balanced, named ranges over a real fit, with accumulation, with manual optimization
and around the background checkpoint's copy. A run under ``nsys``: scripts/gpu_check.sh, part ``nvtx``."""

from __future__ import annotations

import itertools
import re

import pytest
import torch

from multigpu.observe import nvtx as marks
from tests.cli import main
from tests.conftest import TINY

PRESET = ["--config", "configs/debug/nsight.yaml", "--progress_bar=none"]
SHORT = ["--trainer.limit_train_batches=6", "--trainer.limit_val_batches=1", "--trainer.max_epochs=2"]
CPU_LINE = "marks NVTX ranges on CUDA devices only; this run trains on cpu and marks nothing"


def test_on_the_cpu_the_preset_says_once_that_it_marks_nothing_and_trains(tmp_path, capfd, monkeypatch):
    started: list[str] = []
    monkeypatch.setattr(torch.cuda.nvtx, "range_start", started.append)
    main(["fit", *TINY, *PRESET, *SHORT, f"--trainer.default_root_dir={tmp_path}"])
    assert "".join(capfd.readouterr()).count(CPU_LINE) == 1
    assert not started
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert checkpoint["global_step"] == 12


class NvtxLog:
    """torch.cuda.nvtx's range_start and range_end, recorded: ("start", name, id) and ("end", id)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.ids = itertools.count(1)

    def range_start(self, name: str) -> int:
        self.calls.append(("start", name, ident := next(self.ids)))
        return ident

    def range_end(self, ident: int) -> None:
        self.calls.append(("end", ident))

    def names(self) -> dict[int, str]:
        return {call[2]: call[1] for call in self.calls if call[0] == "start"}

    def open_at_end(self) -> list[str]:
        opened = self.names()
        ended = [call[1] for call in self.calls if call[0] == "end"]
        assert len(ended) == len(set(ended)) and set(ended) <= set(opened)  # each range ended once, after its start
        return [opened[ident] for ident in opened if ident not in ended]

    def steps(self) -> list[tuple[str, list[str]]]:
        """Each step range's name with the ranges started inside it, in order, each ended before the step's end."""
        steps, inside, ended = [], None, set()
        for call in self.calls:
            if call[0] == "start" and call[1].startswith("step "):
                inside = (call[1], call[2], [], [])
                steps.append(inside)
            elif call[0] == "start" and inside is not None:
                inside[2].append(call[1])
                inside[3].append(call[2])
            elif call[0] == "end":
                ended.add(call[1])
                if inside is not None and call[1] == inside[1]:
                    assert set(inside[3]) <= ended, f"{inside[0]} ended with a phase open"
                    inside = None
        return [(name, phases) for name, _, phases, _ in steps]


@pytest.fixture
def on_cuda(monkeypatch) -> NvtxLog:
    """The preset's callback believes it trains on CUDA; torch's NVTX calls are recorded."""
    log = NvtxLog()
    monkeypatch.setattr(marks, "on_cuda", lambda trainer: True)
    monkeypatch.setattr(torch.cuda.nvtx, "range_start", log.range_start)
    monkeypatch.setattr(torch.cuda.nvtx, "range_end", log.range_end)
    return log


def test_each_step_marks_its_phases_and_the_background_checkpoint_copy(tmp_path, on_cuda, capfd):
    main(
        ["fit", *TINY, *PRESET, *SHORT, "--checkpoint.every_n_train_steps=4", f"--trainer.default_root_dir={tmp_path}"]
    )
    assert CPU_LINE not in "".join(capfd.readouterr())
    assert on_cuda.open_at_end() == []
    steps = on_cuda.steps()
    assert [name for name, _ in steps] == [f"step {n}" for n in range(12)]
    assert all(phases == ["forward", "backward", "optimizer"] for _, phases in steps)
    calls, opened = on_cuda.calls, on_cuda.names()
    # a data wait ends as every step starts, the epoch's first included
    waits = [calls[i - 1] for i, call in enumerate(calls) if call[0] == "start" and call[1].startswith("step ")]
    assert all(call[0] == "end" and opened[call[1]] == "data wait" for call in waits) and len(waits) == 12
    names = [call[1] for call in calls if call[0] == "start"]
    # every 4 steps and at each epoch's end (last.ckpt); each copy once, outside any step
    assert names.count("checkpoint copy") >= 3
    assert "checkpoint copy" not in {phase for _, phases in steps for phase in phases}


def test_accumulated_batches_mark_the_optimizer_only_on_the_stepping_one(tmp_path, on_cuda):
    main(["fit", *TINY, *PRESET, *SHORT, "--trainer.accumulate_grad_batches=2", "--checkpoint.async_save=false",
          f"--trainer.default_root_dir={tmp_path}"])  # fmt: skip
    assert on_cuda.open_at_end() == []
    steps = on_cuda.steps()
    assert [name for name, _ in steps][:4] == ["step 0, micro-batch 0", "step 0, micro-batch 1",
                                               "step 1, micro-batch 0", "step 1, micro-batch 1"]  # fmt: skip
    assert [phases for _, phases in steps] == [["forward", "backward"], ["forward", "backward", "optimizer"]] * 6
    assert "checkpoint copy" not in [call[1] for call in on_cuda.calls if call[0] == "start"]  # written in line


def test_manual_optimization_marks_each_backward_and_optimizer_step(tmp_path, on_cuda):
    main(["fit", "--model=tests.zoo.gan.TinyGAN", "--data=tests.zoo.gan.RingData", "--trainer.accelerator=cpu",
          *PRESET, "--trainer.max_epochs=3", "--trainer.limit_val_batches=0",
          f"--trainer.default_root_dir={tmp_path}"])  # fmt: skip
    assert on_cuda.open_at_end() == []
    steps = on_cuda.steps()
    assert len(steps) == 3 and all(re.fullmatch(r"step \d+", name) for name, _ in steps)
    # a discriminator and a generator update each step; between backward and the step the user's code (clipping)
    update = ["forward", "backward", "forward", "optimizer"]
    assert all(phases == [*update, *update, "forward"] for _, phases in steps)
