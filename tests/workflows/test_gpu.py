"""GPU checks: dp with real replicas, autocast dtype inside the replicas, ddp and the GPU presets on a GPU.

Run on a GPU machine with ``python -m pytest -m gpu -v`` (or ``bash scripts/gpu_check.sh`` for these plus a
throughput line per strategy and precision). On a machine without a CUDA GPU every test here is skipped.

dp is exercised with two replicas: on GPUs 0 and 1, or on a single GPU with two replicas on the same device
(``parallel_devices=[cuda:0, cuda:0]``): the scatter, the replicas running in two threads, the gather and the
gradient reduction all run as they do across GPUs; only the copies between devices are trivial. The dp checks
are those of ``tests/strategies/test_dp.py`` (which runs them on the CPU), called here on CUDA devices.
"""

from __future__ import annotations

import sys
import threading
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from torch import nn

from multigpu.strategies import DataParallelStrategy, register_strategies
from tests.conftest import TINY, relative_difference
from tests.fixtures.workload import TinyClassifier, TinyData
from tests.strategies import test_dp

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run with: python -m pytest -m gpu)"),
]
CUDA0 = torch.device("cuda", 0)


@pytest.fixture
def dp_devices(monkeypatch) -> list[torch.device]:
    """Two dp devices: GPUs 0 and 1, or GPU 0 twice on a one-GPU machine.

    On GPU 0 twice, torch's broadcast (made for distinct GPUs) is replaced by tests/strategies/test_dp.py's, so that the
    second replica still gets real copies of the parameters, on GPU 0; everything else is torch's CUDA code.
    """
    if torch.cuda.device_count() > 1:
        return [CUDA0, torch.device("cuda", 1)]
    monkeypatch.setattr(torch.nn.parallel._functions, "Broadcast", test_dp.CpuBroadcast)
    replicate_module = sys.modules["torch.nn.parallel.replicate"]
    monkeypatch.setattr(replicate_module, "comm", SimpleNamespace(broadcast_coalesced=test_dp.cpu_broadcast_coalesced))
    return [CUDA0, CUDA0]


@pytest.fixture
def dp_strategy(dp_devices) -> DataParallelStrategy:
    return DataParallelStrategy(parallel_devices=dp_devices)


# -- the checks of tests/strategies/test_dp.py, with torch's CUDA scatter / replicate / parallel_apply / gather --


@pytest.mark.parametrize(("batch", "chunks"), [(batch, chunks) for batch, n, chunks in test_dp.BATCHES if n == 2])
def test_dp_any_batch_size_gives_the_single_device_outputs_and_gradients(dp_devices, batch, chunks):
    test_dp.check_outputs_and_gradients(dp_devices, batch, chunks)


@pytest.mark.parametrize("mode", test_dp.MODES)
def test_dp_replicas_run_in_the_callers_grad_inference_and_autocast_modes(dp_devices, mode):
    test_dp.check_modes(dp_devices, mode)


def test_dp_containers_and_keywords_are_split_and_other_values_shared(dp_devices):
    test_dp.check_containers(dp_devices)


@pytest.mark.parametrize(("dp_modules", "use", "error"), test_dp.REFUSALS)
def test_dp_what_replicas_must_not_use_is_refused_with_a_fix(dp_devices, dp_modules, use, error):
    test_dp.check_refusal(dp_devices, dp_modules, use, error)


def test_dp_batchnorm_running_statistics_come_from_replica_zero(dp_devices):
    test_dp.check_batchnorm(dp_devices)


def test_dp_supports_manual_optimization_and_inference_mode_validation(dp_strategy):
    test_dp.check_manual_optimization(dp_strategy, "gpu")


# -- in Lightning's loop, with the tests' model ----------------------------------------------------------------


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


def train(strategy, precision: str = "32-true", steps: int = 6, hook: Recorder | None = None) -> TinyClassifier:
    L.seed_everything(0)
    model = TinyClassifier(optimizer=lambda p: torch.optim.SGD(p, lr=0.01))
    if hook is not None:
        model.net[0].register_forward_hook(hook)  # the first layer: runs under autocast in every replica
    data = TinyData(train_size=256, val_size=64, batch_size=32)
    trainer = L.Trainer(accelerator="gpu", devices=1, strategy=strategy, precision=precision, max_steps=steps,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=2)  # fmt: skip
    trainer.fit(model, data)
    return model


def test_dp_replicas_run_in_parallel_and_train_like_one_device(dp_strategy):
    recorder = Recorder()
    dp_model = train(dp_strategy, hook=recorder)
    single = train("auto")
    threads = {call[0] for call in recorder.calls}
    assert len(threads) >= 2  # the replicas ran in their own threads
    assert {call[1] for call in recorder.calls} == {16}  # each got half of the global batch of 32
    # same loss on the gathered outputs, same summed gradients: agreement to float rounding
    assert relative_difference(single.state_dict(), dp_model.state_dict()) < 1e-5
    assert list(dp_model.state_dict()) == list(single.state_dict())  # checkpoints have single-device keys
    assert "forward" not in dp_model.__dict__  # the strategy removed its forward on teardown


@pytest.mark.parametrize(("precision", "dtype"), [("16-mixed", torch.float16), ("bf16-mixed", torch.bfloat16)])
def test_autocast_dtype_inside_dp_replicas(precision, dtype, dp_strategy):
    recorder = Recorder()
    train(dp_strategy, precision=precision, steps=3, hook=recorder)
    replica_calls = [call for call in recorder.calls if call[0] != threading.main_thread().ident]
    assert replica_calls
    for _, _, enabled, autocast_dtype, output_dtype in replica_calls:
        assert enabled and autocast_dtype == dtype and output_dtype == dtype


def test_dp_name_resolves_on_gpu():
    register_strategies()
    trainer = L.Trainer(strategy="dp", accelerator="gpu", devices=1, logger=False)
    assert isinstance(trainer.strategy, DataParallelStrategy)


# every GPU trainer preset once, and every precision preset at least once (the benchmark in scripts/gpu_check.sh
# runs every strategy in every precision)
PRESET_RUNS = [("gpu", "16-mixed"), ("dp", "bf16-mixed"), ("ddp", "32"), ("ddp_spawn", "bf16-mixed")]


@pytest.mark.parametrize(("preset", "precision"), PRESET_RUNS)
def test_gpu_presets_train(preset, precision, run_cli, tmp_path):
    configs = ["--config", f"configs/trainer/{preset}.yaml", "--config", f"configs/precision/{precision}.yaml"]
    run_cli(
        "fit", *TINY, *configs, "--trainer.accelerator=gpu", "--trainer.devices=1", "--trainer.max_steps=5",
        "--trainer.limit_val_batches=2", f"--trainer.default_root_dir={tmp_path}",
    )  # fmt: skip
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert checkpoint["global_step"] == 5
