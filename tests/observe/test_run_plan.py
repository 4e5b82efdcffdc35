"""The run plan printed and saved at the start of every fit (multigpu/observe/run_plan.py)."""

from __future__ import annotations

import json

import torch
from lightning.pytorch.utilities import CombinedLoader
from torch.utils.data import DataLoader, DistributedSampler

from multigpu.data.loaders import EngineSampler, World
from multigpu.observe.run_plan import SAME_ORDER, batch_meaning, data_order, per_loader
from tests.cli import main
from tests.conftest import TINY

PLAN = [
    *TINY,  # global batch 32 over 512 samples
    "--trainer.accumulate_grad_batches=2",
    "--trainer.limit_train_batches=8",
    "--trainer.limit_val_batches=2",
    "--trainer.max_epochs=2",
    "--progress_bar=none",
    "--seed_everything=7",
]


def test_plan_is_printed_and_saved_per_start_and_names_the_resumed_checkpoint(tmp_path, capsys):
    run_dir = tmp_path / "run"
    main(["fit", *PLAN, f"--trainer.default_root_dir={run_dir}"])
    printed = capsys.readouterr().out
    plan = json.loads((run_dir / "logs" / "version_0" / "run_plan.json").read_text())
    assert plan["global_batch"] == 32 and plan["micro_batch_per_process"] == 16  # 32 / accumulation 2
    assert plan["accumulate_grad_batches"] == 2 and plan["world_size"] == 1 and plan["nodes"] == 1
    assert plan["steps_per_epoch"] == 4 and plan["total_steps"] == 8  # 8 micro-batches / 2, over 2 epochs
    assert plan["strategy"] == "SingleDeviceStrategy" and plan["precision"] == "32-true"
    assert plan["validation"] == "every 1 epoch(s), 2 batches each"
    assert plan["seed"] == 7 and plan["resumes_from"] is None
    assert plan["batch_size_means"] == "global batch of one optimizer step" and plan["data_order"] == SAME_ORDER
    assert plan["run_dir"] == str(run_dir) and plan["loggers"] == [f"CSVLogger: {run_dir / 'logs' / 'version_0'}"]
    assert printed.count("Run plan") == 1
    for key, value in [("global_batch", "32"), ("micro_batch_per_process", "16"), ("seed", "7")]:
        assert any(line.split() == [key, value] for line in printed.splitlines()), (key, printed)

    main(["fit", *PLAN, "--trainer.max_epochs=3", "--ckpt_path=last", f"--trainer.default_root_dir={run_dir}"])
    resumed = json.loads((run_dir / "logs" / "version_1" / "run_plan.json").read_text())
    assert resumed["resumes_from"] == str(run_dir / "checkpoints" / "last.ckpt")
    assert resumed["total_steps"] == 12
    assert json.loads((run_dir / "logs" / "version_0" / "run_plan.json").read_text()) == plan  # kept as it was


def test_step_based_validation_schedule(tmp_path):
    run_dir = tmp_path / "run"
    main([
        "fit", *PLAN, "--trainer.max_steps=3", "--trainer.val_check_interval=2", "--trainer.accumulate_grad_batches=1",
        f"--trainer.default_root_dir={run_dir}",
    ])  # fmt: skip
    plan = json.loads((run_dir / "logs" / "version_0" / "run_plan.json").read_text())
    assert plan["validation"] == "every 2 training batches, 2 batches each"
    assert plan["total_steps"] == 3 and plan["max_steps"] == 3


def test_each_training_loader_says_what_its_batch_means_and_whether_its_order_depends_on_the_processes():
    data = torch.arange(16)
    sampled = DataLoader(data, batch_size=4, sampler=EngineSampler(data, 8, World(2, 0, 1, 0)))
    own = DataLoader(data, batch_size=4, sampler=DistributedSampler(data, num_replicas=2, rank=0))
    assert per_loader(sampled, batch_meaning) == "global batch of one optimizer step"
    assert per_loader(sampled, data_order) == SAME_ORDER
    assert per_loader(CombinedLoader([sampled, own]), data_order) == [
        f"loader 0: {SAME_ORDER}",
        "loader 1: depends on the number of processes: the engine does not sample this loader (Lightning's"
        " DistributedSampler, or the loader's own sampler or sharding, splits it among the processes)",
    ]
    assert per_loader(CombinedLoader([sampled, own]), batch_meaning)[1] == (
        "loader 1: per process (Lightning's meaning: the engine does not sample this loader)"
    )
