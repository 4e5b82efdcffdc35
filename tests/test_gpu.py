"""GPU checks: dp with real replicas, autocast dtype inside the replicas, ddp and the GPU presets on a GPU.

Run on a GPU machine with ``python -m pytest -m gpu -v`` (or ``bash scripts/gpu_check.sh`` for these plus a
throughput line per strategy and precision). On a machine without a CUDA GPU every test here is skipped.

With a single GPU, dp is exercised with two replicas on the same device (``parallel_devices=[cuda:0, cuda:0]``):
the scatter, the replicas running in two threads, the gather and the gradient reduction all run as they do
across GPUs; only the copies between devices are trivial.
"""

from __future__ import annotations

import threading

import lightning as L
import pytest
import torch
from torch import nn

import src.strategies.dp as dp_module
from src.data import CIFAR10DataModule
from src.models import ImageClassifier
from src.strategies import DataParallelStrategy, register_dp_strategy
from tests.conftest import TINY_IMAGE, relative_difference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run with: python -m pytest -m gpu)"),
]
CUDA0 = torch.device("cuda", 0)


def replicate_supports_one_device_twice() -> bool:
    try:
        torch.nn.parallel.replicate(nn.Linear(2, 2).to(CUDA0), [0, 0])
        return True
    except Exception:  # any failure means: use the same-device stand-in below
        return False


def same_device_replicate(module: nn.Module, devices: list[int], detach: bool = False) -> list[nn.Module]:
    """Replicas that share the module's parameters, as torch's replicate does for the source device."""
    return [module._replicate_for_data_parallel() for _ in devices]


@pytest.fixture
def two_replicas_on_one_gpu(monkeypatch) -> DataParallelStrategy:
    """A dp strategy with two replicas; on one GPU torch's broadcast may refuse duplicate devices."""
    if torch.cuda.device_count() < 2 and not replicate_supports_one_device_twice():
        monkeypatch.setattr(dp_module, "replicate", same_device_replicate)
        print("dp check: torch.nn.parallel.replicate refuses [0, 0]; replicas share the parameters instead")
    devices = (
        [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
        if torch.cuda.device_count() > 1
        else [CUDA0, CUDA0]
    )
    return DataParallelStrategy(parallel_devices=devices)


class Recorder:
    """Forward hook recording, per call: the thread, the input batch size, autocast state and output dtype."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, bool, torch.dtype, torch.dtype]] = []
        self.lock = threading.Lock()

    def __call__(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        with self.lock:
            self.calls.append(
                (threading.get_ident(), inputs[0].shape[0], torch.is_autocast_enabled("cuda"),
                 torch.get_autocast_dtype("cuda"), output.dtype)
            )  # fmt: skip


def train(strategy, precision: str = "32-true", steps: int = 6, hook: Recorder | None = None) -> ImageClassifier:
    L.seed_everything(0)
    model = ImageClassifier(widths=(8, 16), optimizer=lambda p: torch.optim.SGD(p, lr=0.01))
    if hook is not None:
        model.net.stem[0].register_forward_hook(hook)
    data = CIFAR10DataModule(synthetic_train_size=256, synthetic_val_size=64, batch_size=32)
    trainer = L.Trainer(accelerator="gpu", devices=1, strategy=strategy, precision=precision, max_steps=steps,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=2)  # fmt: skip
    trainer.fit(model, data)
    return model


def test_dp_replicas_run_in_parallel_and_train_like_one_device(two_replicas_on_one_gpu):
    recorder = Recorder()
    dp_model = train(two_replicas_on_one_gpu, hook=recorder)
    single = train("auto")
    threads = {call[0] for call in recorder.calls}
    assert len(threads) >= 2  # the replicas ran in their own threads
    assert {call[1] for call in recorder.calls} == {16}  # each got half of the global batch of 32
    # same loss on the gathered outputs, same summed gradients: agreement to float rounding
    assert relative_difference(single.state_dict(), dp_model.state_dict()) < 1e-5
    assert list(dp_model.state_dict()) == list(single.state_dict())  # checkpoints have single-device keys
    assert "forward" not in dp_model.__dict__  # the strategy removed its forward on teardown


@pytest.mark.parametrize(("precision", "dtype"), [("16-mixed", torch.float16), ("bf16-mixed", torch.bfloat16)])
def test_autocast_dtype_inside_dp_replicas(precision, dtype, two_replicas_on_one_gpu):
    recorder = Recorder()
    train(two_replicas_on_one_gpu, precision=precision, steps=3, hook=recorder)
    replica_calls = [call for call in recorder.calls if call[0] != threading.main_thread().ident]
    assert replica_calls
    for _, _, enabled, autocast_dtype, output_dtype in replica_calls:
        assert enabled and autocast_dtype == dtype and output_dtype == dtype


def test_dp_supports_manual_optimization(two_replicas_on_one_gpu):
    class Manual(ImageClassifier):
        def __init__(self) -> None:
            super().__init__(widths=(8, 16))
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            optimizer = self.optimizers()
            loss, _, _ = self.model_step(batch)
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()
            return loss

    model = Manual()
    before = [p.detach().clone() for p in model.parameters()]
    data = CIFAR10DataModule(synthetic_train_size=128, synthetic_val_size=32, batch_size=32)
    trainer = L.Trainer(accelerator="gpu", devices=1, strategy=two_replicas_on_one_gpu, max_steps=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, limit_val_batches=1)  # fmt: skip
    trainer.fit(model, data)
    assert any(not torch.equal(a, b.cpu()) for a, b in zip(before, model.parameters(), strict=True))


def test_dp_name_resolves_on_gpu():
    register_dp_strategy()
    trainer = L.Trainer(strategy="dp", accelerator="gpu", devices=1, logger=False)
    assert isinstance(trainer.strategy, DataParallelStrategy)


# every GPU trainer preset once, and every precision preset at least once (the benchmark in scripts/gpu_check.sh
# runs every strategy in every precision)
PRESET_RUNS = [("gpu", "16-mixed"), ("dp", "bf16-mixed"), ("ddp", "32"), ("ddp_spawn", "bf16-mixed")]


@pytest.mark.parametrize(("preset", "precision"), PRESET_RUNS)
def test_gpu_presets_train(preset, precision, run_cli, tmp_path):
    configs = ["--config", f"configs/trainer/{preset}.yaml", "--config", f"configs/precision/{precision}.yaml"]
    run_cli(
        "fit", *TINY_IMAGE, *configs, "--trainer.accelerator=gpu", "--trainer.devices=1", "--trainer.max_steps=5",
        "--trainer.limit_val_batches=2", f"--trainer.default_root_dir={tmp_path}",
    )  # fmt: skip
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert checkpoint["global_step"] == 5
