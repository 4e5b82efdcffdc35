"""The dp strategy's wiring, on the CPU: torch's scatter / replicate / parallel_apply / gather need CUDA, so here
they are replaced by CPU stand-ins with the same contract (chunks along dim 0, replicas sharing the parameters as
torch's replica on the source device does, one thread per replica, concatenation). What runs for real is this
template's code: the forward redirection, the replica threads, the gradient flow into the shared parameters,
Lightning's loop around it, and the teardown. ``tests/test_gpu.py`` runs the same with torch's CUDA primitives.
"""

from __future__ import annotations

import threading
from typing import Any

import lightning as L
import pytest
import torch

import src.strategies.dp as dp
from src.data import CIFAR10DataModule
from src.models import ImageClassifier
from src.strategies import DataParallelStrategy

CPU = torch.device("cpu")


def scatter_kwargs(args: tuple, kwargs: dict, device_ids: list, dim: int = 0) -> tuple[tuple, tuple]:
    chunks = [
        arg.chunk(len(device_ids), dim) if isinstance(arg, torch.Tensor) else [arg] * len(device_ids) for arg in args
    ]
    count = min(len(c) for c in chunks) if chunks else 0
    return tuple(tuple(c[i] for c in chunks) for i in range(count)), tuple(dict(kwargs) for _ in range(count))


def replicate(module: torch.nn.Module, devices: list, detach: bool = False) -> list[torch.nn.Module]:
    return [module._replicate_for_data_parallel() for _ in devices]


THREADS: set[int] = set()


def parallel_apply(modules: list, inputs: tuple, kwargs: tuple, devices: list) -> list[Any]:
    results: list[Any] = [None] * len(modules)
    grad = torch.is_grad_enabled()

    def work(i: int) -> None:
        torch.set_grad_enabled(grad)
        THREADS.add(threading.get_ident())
        results[i] = modules[i](*inputs[i], **kwargs[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(modules))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def gather(outputs: list[torch.Tensor], target_device: Any, dim: int = 0) -> torch.Tensor:
    return torch.cat(outputs, dim)


@pytest.fixture
def cpu_primitives(monkeypatch):
    for name, stand_in in {"scatter_kwargs": scatter_kwargs, "replicate": replicate,
                           "parallel_apply": parallel_apply, "gather": gather}.items():  # fmt: skip
        monkeypatch.setattr(dp, name, stand_in)
    THREADS.clear()


def test_parallel_forward_gives_the_single_device_outputs_and_gradients(cpu_primitives):
    torch.manual_seed(0)
    model = ImageClassifier(widths=(8, 16))
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    reference = model(images)
    torch.nn.functional.cross_entropy(reference, labels).backward()
    reference_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    model.forward = dp.ParallelForward(model, [CPU, CPU])
    output = model(images)
    torch.nn.functional.cross_entropy(output, labels).backward()
    assert len(THREADS) == 2  # two replicas, each in its own thread
    torch.testing.assert_close(output, reference)
    for grad, expected in zip((p.grad for p in model.parameters()), reference_grads, strict=True):
        torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-6)


def train(strategy: Any) -> ImageClassifier:
    L.seed_everything(0)
    model = ImageClassifier(widths=(8, 16))
    data = CIFAR10DataModule(synthetic_train_size=256, synthetic_val_size=64, batch_size=32)
    # fp64: in fp32, AdamW turns the rounding differences of a split batch into ~1e-5 differences in 6 steps
    trainer = L.Trainer(accelerator="cpu", devices=1, strategy=strategy, max_steps=6, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=2, precision="64-true")  # fmt: skip
    trainer.fit(model, data)
    return model


def test_dp_in_lightnings_loop_trains_like_one_device(cpu_primitives, monkeypatch):
    # keep two CPU "devices" (the strategy normally runs as one device on a CPU) and switch the parallel forward on
    monkeypatch.setattr(DataParallelStrategy, "parallel_forward_active", property(lambda self: True))
    monkeypatch.setattr(
        DataParallelStrategy, "setup_environment", L.pytorch.strategies.ParallelStrategy.setup_environment
    )
    dp_model = train(DataParallelStrategy(parallel_devices=[CPU, CPU]))
    assert len(THREADS) >= 2 and threading.main_thread().ident not in THREADS  # forwards ran in replica threads
    assert "forward" not in dp_model.__dict__  # the strategy removed its forward at teardown
    single = train("auto")
    assert list(dp_model.state_dict()) == list(single.state_dict())  # checkpoints keep single-device keys
    for key, value in single.state_dict().items():
        torch.testing.assert_close(dp_model.state_dict()[key], value, rtol=1e-10, atol=1e-12)
