"""Throughput, TFLOP/s, MFU, memory and data wait in every run (multigpu/observe/throughput.py)."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from multigpu.observe.throughput import dense_peak_flops, first_tensor
from tests.cli import main
from tests.conftest import TINY, read_metrics

LOAD_SECONDS = 0.02  # per batch, in the loader of the user workload below
STEP_SECONDS = 0.005  # per training step
FLOPS_PER_BATCH = 3.0e9


class Clock:
    """The time the speed monitor reads in these tests: it moves only when the loader loads or a step computes, so
    the figures follow from the run's hooks alone, whatever else the machine runs."""

    now = 0.0

    @classmethod
    def perf_counter(cls) -> float:
        return cls.now

    @classmethod
    def advance(cls, seconds: float) -> None:
        cls.now += seconds


class SlowDictData(Dataset):
    """A user's dataset: dict samples, plain DataLoader, and a collate that takes LOAD_SECONDS per batch."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": torch.full((4,), float(index)), "y": torch.tensor(float(index % 2))}


def slow_collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    Clock.advance(LOAD_SECONDS)
    return {key: torch.stack([item[key] for item in items]) for key in items[0]}


class UserModule(L.LightningModule):
    """A plain LightningModule (not the template's base class) that declares its FLOPs the Lightning way."""

    flops_per_batch = FLOPS_PER_BATCH

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        Clock.advance(STEP_SECONDS)
        return torch.nn.functional.mse_loss(self.layer(batch["x"]).squeeze(1), batch["y"])

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.log("val/loss", torch.nn.functional.mse_loss(self.layer(batch["x"]).squeeze(1), batch["y"]))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class UserData(L.LightningDataModule):
    """A plain LightningDataModule with plain DataLoaders."""

    def train_dataloader(self) -> DataLoader:
        return DataLoader(SlowDictData(), batch_size=8, collate_fn=slow_collate)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(SlowDictData(), batch_size=8, collate_fn=slow_collate)


def logged(rows: list[dict[str, str]], key: str) -> list[float]:
    return [float(row[key]) for row in rows if row.get(key)]


class HookTimes(L.Callback):
    """When each training batch started and ended on the monitor's clock, as the test sees it."""

    epoch_start = 0.0
    starts: list[float] = []
    ends: list[float] = []

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        type(self).epoch_start = Clock.perf_counter()

    def on_train_batch_start(self, *args: object) -> None:
        self.starts.append(Clock.perf_counter())

    def on_train_batch_end(self, *args: object) -> None:
        self.ends.append(Clock.perf_counter())


def test_user_module_gets_throughput_mfu_memory_and_data_wait(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("multigpu.observe.throughput.time", Clock)
    monkeypatch.setattr(HookTimes, "starts", [])
    monkeypatch.setattr(HookTimes, "ends", [])
    run_dir = tmp_path / "run"
    main([
        "fit", "--model=tests.observe.test_throughput.UserModule", "--data=tests.observe.test_throughput.UserData",
        "--trainer.accelerator=cpu", "--trainer.max_epochs=1", "--trainer.log_every_n_steps=2",
        "--trainer.limit_val_batches=1", "--throughput.peak_tflops=2.0", "--progress_bar=plain",
        "--trainer.callbacks+=tests.observe.test_throughput.HookTimes", f"--trainer.default_root_dir={run_dir}",
    ])  # fmt: skip
    rows = read_metrics(run_dir)
    samples = logged(rows, "perf/samples_per_s")
    assert len(samples) == 4  # 8 steps, logged every 2
    # each figure covers two steps: from the end of the last logged one (the epoch's start at first) to its own end
    window_ends = [HookTimes.ends[step] for step in (1, 3, 5, 7)]
    elapsed = [end - start for start, end in zip([HookTimes.epoch_start, *window_ends[:-1]], window_ends, strict=True)]
    assert samples == pytest.approx([16 / seconds for seconds in elapsed], rel=1e-9)
    gaps = [
        start - end for start, end in zip(HookTimes.starts, [HookTimes.epoch_start, *HookTimes.ends[:-1]], strict=True)
    ]
    waits = [sum(gaps[step : step + 2]) for step in (0, 2, 4, 6)]
    assert logged(rows, "perf/data_wait") == pytest.approx(
        [w / e for w, e in zip(waits, elapsed, strict=True)], rel=1e-9
    )
    # every batch loaded was waited for, and every step's compute was not
    assert sum(waits) == pytest.approx(8 * LOAD_SECONDS) and sum(elapsed) == pytest.approx(
        8 * (LOAD_SECONDS + STEP_SECONDS)
    )
    assert logged(rows, "perf/samples_per_s_per_device") == samples  # one device
    tflops = logged(rows, "perf/tflops_per_device")
    assert tflops == pytest.approx([s / 8 * FLOPS_PER_BATCH / 1e12 for s in samples], rel=1e-5)
    assert logged(rows, "perf/mfu") == pytest.approx([t / 2.0 for t in tflops], rel=1e-5)
    assert all(0.01 < rss < 64 for rss in logged(rows, "perf/memory_rss_gb"))
    assert "perf/tokens_per_s" not in rows[0]  # float features are not token ids
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("done "))
    assert "perf/samples_per_s=" in line and "perf/mfu=" in line and "perf/data_wait=" in line


def test_tokens_on_request_and_the_figures_at_the_step_of_the_loss(tmp_path):
    """``--throughput.count=tokens`` counts every element of the batch's first tensor (the language model example
    counts its token ids by itself, tests/examples/test_gpt.py)."""
    run_dir = tmp_path / "run"
    main([
        "fit", *TINY, "--throughput.count=tokens", "--trainer.max_steps=6", "--trainer.log_every_n_steps=3",
        "--trainer.limit_val_batches=1", "--progress_bar=none", f"--trainer.default_root_dir={run_dir}",
    ])  # fmt: skip
    rows = read_metrics(run_dir)
    samples, tokens = logged(rows, "perf/samples_per_s"), logged(rows, "perf/tokens_per_s")
    assert len(samples) == 2 and tokens == pytest.approx([16 * s for s in samples], rel=1e-5)  # 16 features each
    # written straight to the logger, at the step Lightning gives the loss logged on the same optimizer step (if a
    # Lightning release counts its logging steps differently, multigpu.compat.logging_step must follow)
    assert [row["step"] for row in rows if row.get("perf/samples_per_s")] == ["2", "5"]
    assert [row["step"] for row in rows if row.get("train/loss")] == ["2", "5"]
    flops_per_sample = 6 * (16 * 32 + 32 * 4)  # TinyClassifier.flops_per_sample: 6 per weight
    assert logged(rows, "perf/tflops_per_device") == pytest.approx([s * flops_per_sample / 1e12 for s in samples])
    assert "perf/mfu" not in rows[0]  # a CPU has no known peak unless one is given


@pytest.mark.parametrize(
    ("name", "precision", "tflops"),
    [
        ("NVIDIA H200", "bf16-mixed", 989.4),  # dense, not Lightning's sparse 2000
        ("NVIDIA H100 80GB HBM3", "bf16-mixed", 989.4),
        ("NVIDIA H200 NVL", "16-mixed", 835.5),
        ("NVIDIA H100 PCIe", "bf16-mixed", 756.0),
        ("NVIDIA A100-SXM4-80GB", "bf16-true", 312.0),
        ("NVIDIA H100 80GB HBM3", "32-true", 66.9),
    ],
)
def test_dense_peak_of_the_device_at_the_run_precision(name, precision, tflops, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "highest")
    assert dense_peak_flops(torch.device("cuda", 0), precision) == pytest.approx(tflops * 1e12)


def test_unknown_device_has_no_peak(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Future GPU")
    with pytest.warns(UserWarning, match="FLOPs not found"):
        assert dense_peak_flops(torch.device("cuda", 0), "bf16-mixed") is None
    assert dense_peak_flops(torch.device("cpu"), "32-true") is None


def test_samples_are_counted_from_the_first_tensor_of_any_batch():
    images = torch.zeros(5, 3, 2, 2)
    assert first_tensor({"meta": ["a"], "image": images, "label": torch.zeros(5)}) is images
    assert first_tensor([("text", images)]) is images
    assert first_tensor(["no tensors"]) is None


def test_fp16_loss_scale_is_logged_and_bf16_has_none(tmp_path):
    """16-mixed trains with a GradScaler: its scale is logged with the other figures (it falls on overflows)."""
    from lightning.pytorch.loggers import CSVLogger
    from lightning.pytorch.plugins import MixedPrecision

    from multigpu.observe.throughput import SpeedMonitor

    scales = {}
    for precision, plugin in [
        ("16-mixed", MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))),
        ("bf16-mixed", MixedPrecision("bf16-mixed", "cpu")),
    ]:
        trainer = L.Trainer(
            accelerator="cpu", max_steps=4, log_every_n_steps=2, limit_val_batches=0, plugins=[plugin],
            callbacks=[SpeedMonitor()], logger=CSVLogger(tmp_path / precision, name="logs"), enable_progress_bar=False,
            enable_checkpointing=False, enable_model_summary=False,
        )  # fmt: skip
        trainer.fit(UserModule(), datamodule=UserData())
        rows = read_metrics(tmp_path / precision)
        scales[precision] = logged(rows, "perf/grad_scale")
    fp16 = scales["16-mixed"]
    # inputs up to 63 overflow fp16 at first: each overflowing step halves GradScaler's initial 2**16
    assert len(fp16) == 2 and all(s == 2.0 ** round(math.log2(s)) for s in fp16), fp16
    assert 2.0**16 > fp16[0] >= fp16[1]
    assert scales["bf16-mixed"] == []  # bf16 has fp32's range: no loss scaling
