"""The dp strategy on the CPU, with torch's own scatter / replicate / gather code running for real.

torch's DataParallel primitives move tensors between GPUs through CUDA-only autograd functions (``Scatter``,
``Gather``, ``Broadcast``) and ``comm.broadcast_coalesced``; ``parallel_apply`` needs CUDA streams. Here those
few pieces are replaced by CPU ones with the same contract, and everything around them is torch's code:
``scatter_kwargs`` walks the containers, ``replicate`` builds the replica modules and copies the parameters
(replica 0 gets the originals, the others copies whose gradients flow back and are summed, as ``Broadcast``
does), ``gather`` concatenates. ``parallel_apply`` is a copy of torch's thread logic: it re-enters grad mode and
autocast (with its default dtype) in each thread, and not inference mode, exactly as torch does, so what the
strategy must add is tested. ``tests/workflows/test_gpu.py`` runs the same models with torch's CUDA primitives.
"""

from __future__ import annotations

import sys
import threading
from collections import namedtuple
from dataclasses import dataclass
from itertools import chain
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch
from torch import Tensor, nn
from torch._utils import ExceptionWrapper
from torch.autograd import Function
from torchmetrics import MeanMetric

import multigpu.strategies.dp as dp
from multigpu.strategies import DataParallelStrategy
from tests.fixtures.workload import TinyClassifier, TinyData

CPU = torch.device("cpu")


# -- CPU stand-ins for torch's CUDA-only pieces --------------------------------------------------------------------


def cpu_broadcast_coalesced(tensors: list[Tensor], devices: list) -> list[list[Tensor]]:
    # as comm.broadcast_coalesced: the source device (the first) gets the tensors themselves, the others copies
    return [list(tensors)] + [[tensor.detach().clone() for tensor in tensors] for _ in devices[1:]]


class CpuBroadcast(Function):
    """torch's ``Broadcast``: one copy of every input per device; backward sums the copies' gradients."""

    @staticmethod
    def forward(ctx, target_gpus, *inputs):
        ctx.num_inputs = len(inputs)
        outputs = cpu_broadcast_coalesced(list(inputs), target_gpus)
        frozen = [output[i] for i, needs in enumerate(ctx.needs_input_grad[1:]) if not needs for output in outputs]
        ctx.mark_non_differentiable(*frozen)
        return tuple(chain.from_iterable(outputs))

    @staticmethod
    def backward(ctx, *grads):
        n = ctx.num_inputs
        return (None, *(sum(grads[i::n]) for i in range(n)))


class CpuScatter(Function):
    """torch's ``Scatter``: chunks along ``dim``, the first a view (same device), the others copies."""

    @staticmethod
    def forward(ctx, target_gpus, chunk_sizes, dim, input):
        ctx.dim = dim
        chunks = input.split(chunk_sizes, dim) if chunk_sizes else input.chunk(len(target_gpus), dim)
        return (chunks[0], *(chunk.clone() for chunk in chunks[1:]))

    @staticmethod
    def backward(ctx, *grads):
        return None, None, None, torch.cat(grads, ctx.dim)


class CpuGather(Function):
    """torch's ``Gather``: concatenation along ``dim`` (0-dim inputs are stacked, as torch does with a warning)."""

    @staticmethod
    def forward(ctx, target_device, dim, *inputs):
        ctx.unsqueezed = all(t.dim() == 0 for t in inputs) and dim == 0
        inputs = tuple(t.view(1) for t in inputs) if ctx.unsqueezed else inputs
        ctx.dim, ctx.sizes = dim, [t.size(dim) for t in inputs]
        return torch.cat(inputs, dim)

    @staticmethod
    def backward(ctx, grad):
        grads = grad.split(ctx.sizes, ctx.dim)
        return (None, None, *(g[0] for g in grads)) if ctx.unsqueezed else (None, None, *grads)


def parallel_apply(modules: list, inputs: tuple, kwargs_tup: tuple, devices: list) -> list[Any]:
    """torch's ``parallel_apply`` without CUDA streams: the same per-thread grad mode and autocast handling."""
    results: dict[int, Any] = {}
    grad_enabled, autocast_enabled = torch.is_grad_enabled(), torch.is_autocast_enabled("cpu")

    def worker(i: int) -> None:
        torch.set_grad_enabled(grad_enabled)
        try:
            with torch.autocast("cpu", enabled=autocast_enabled):  # torch's default dtype, as in torch
                results[i] = modules[i](*inputs[i], **kwargs_tup[i])
        except Exception:
            results[i] = ExceptionWrapper(where=f"in replica {i}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(modules))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for result in results.values():
        if isinstance(result, ExceptionWrapper):
            result.reraise()
    return [results[i] for i in range(len(modules))]


@pytest.fixture
def cpu_primitives(monkeypatch) -> list[int]:
    """Runs dp's parallel forward on the CPU; returns the number of tensors each ``replicate`` copied."""
    copied: list[int] = []

    class CountingBroadcast(CpuBroadcast):
        @staticmethod
        def forward(ctx, target_gpus, *inputs):
            copied.append(len(inputs))
            return CpuBroadcast.forward(ctx, target_gpus, *inputs)

    monkeypatch.setattr(torch.nn.parallel._functions, "Broadcast", CountingBroadcast)
    replicate_module = sys.modules["torch.nn.parallel.replicate"]
    monkeypatch.setattr(replicate_module, "comm", SimpleNamespace(broadcast_coalesced=cpu_broadcast_coalesced))
    monkeypatch.setattr(torch.nn.parallel.scatter_gather, "Scatter", CpuScatter)
    monkeypatch.setattr(torch.nn.parallel.scatter_gather, "Gather", CpuGather)
    monkeypatch.setattr(dp, "parallel_apply", parallel_apply)
    return copied


# -- models ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """What one forward call saw: its thread, batch size, modes and the storage of its first weight."""

    thread: int
    batch: int
    grad: bool
    inference: bool
    autocast: bool
    autocast_dtype: torch.dtype
    weight: int


class Probe(L.LightningModule):
    """A small MLP whose forward records every call (replicas share the list: they are shallow copies)."""

    def __init__(self, device_type: str = "cpu") -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
        self.device_type = device_type
        self.calls: list[Call] = []

    def record(self, x: Tensor) -> None:
        self.calls.append(
            Call(threading.get_ident(), x.shape[0], torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
                 torch.is_autocast_enabled(self.device_type), torch.get_autocast_dtype(self.device_type),
                 self.net[0].weight.data_ptr())
        )  # fmt: skip

    def forward(self, x: Tensor) -> Tensor:
        self.record(x)
        x.mul_(0.5)  # in place on the input chunk: must work in training and in inference mode
        return self.net(x)

    def replica_calls(self) -> list[Call]:
        return [call for call in self.calls if call.thread != threading.main_thread().ident]


Pair = namedtuple("Pair", ["left", "right"])


class ManyInputs(Probe):
    """forward with a dict, a list, a namedtuple, keyword tensors and non-tensors; returns a dict and a loss."""

    def forward(self, batch: dict, extra: list, pair: Pair, *, scale: float, tag: object, target: Tensor) -> dict:
        self.seen.append((batch["x"].shape[0], extra[0].shape[0], pair.right.shape[0], target.shape[0], scale, tag,
                          extra[1], pair.left))  # fmt: skip
        logits = self.net(batch["x"] * scale + extra[0] + pair.right)
        loss = nn.functional.cross_entropy(logits, target)
        return {"logits": logits, "loss": loss, "pair": Pair(pair.left, logits.sum(1)), "none": None}


def parallel(model: nn.Module, devices: list[torch.device]) -> nn.Module:
    model.to(devices[0])
    model.forward = dp.ParallelForward(model, devices)
    return model


def twin(model_cls: type[nn.Module], devices: list[torch.device]) -> tuple[nn.Module, nn.Module]:
    """Two fp64 models with the same weights on ``devices[0]``: one plain, one with dp's parallel forward."""
    torch.manual_seed(0)
    single = model_cls().double().to(devices[0])
    other = model_cls().double()
    other.load_state_dict(single.state_dict())
    return single, parallel(other, devices)


def assert_same_grads(model: nn.Module, reference: nn.Module) -> None:
    for (name, param), expected in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(param.grad, expected.grad, msg=name)


# -- the parallel forward, as checks shared with tests/workflows/test_gpu.py (with torch's CUDA primitives there) --

#: (batch, devices, chunk sizes): even, uneven, fewer samples than devices, a single sample
BATCHES = [(8, 2, [4, 4]), (5, 2, [3, 2]), (5, 4, [2, 2, 1]), (3, 4, [1, 1, 1]), (1, 2, [1])]


def check_outputs_and_gradients(devices: list[torch.device], batch: int, chunks: list[int]) -> None:
    single, model = twin(Probe, devices)
    x = torch.randn(batch, 4, dtype=torch.float64, device=devices[0])
    labels = torch.randint(0, 3, (batch,), device=devices[0])
    nn.functional.cross_entropy(single(x.clone()), labels).backward()
    output = model(x.clone())
    nn.functional.cross_entropy(output, labels).backward()
    torch.testing.assert_close(output, single(x.clone()))
    assert_same_grads(model, single)
    assert sorted((call.batch for call in model.calls), reverse=True) == chunks  # replicas finish in any order
    if len(chunks) > 1:  # replicas ran in their own threads, on real copies of the parameters
        assert len(model.replica_calls()) == len(chunks)
        assert len({call.weight for call in model.calls}) == len(chunks)


@pytest.mark.parametrize(("batch", "replicas", "chunks"), BATCHES)
def test_any_batch_size_gives_the_single_device_outputs_and_gradients(cpu_primitives, batch, replicas, chunks):
    check_outputs_and_gradients([CPU] * replicas, batch, chunks)
    if len(chunks) > 1:
        assert cpu_primitives == [len(list(Probe().parameters()))]  # one broadcast of the network per forward


MODES = {
    "grad": lambda device_type: torch.enable_grad(),
    "no_grad": lambda device_type: torch.no_grad(),
    "inference_mode": lambda device_type: torch.inference_mode(),
    "fp16-autocast": lambda device_type: torch.autocast(device_type, dtype=torch.float16),
    "bf16-autocast": lambda device_type: torch.autocast(device_type, dtype=torch.bfloat16),
}


def check_modes(devices: list[torch.device], mode: str) -> None:
    device_type = devices[0].type
    model = parallel(Probe(device_type), devices)
    with MODES[mode](device_type):
        output = model(torch.randn(6, 4, device=devices[0]))
        expected = Call(0, 3, torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
                        torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type), 0)  # fmt: skip
    assert len(model.replica_calls()) == 2
    for call in model.replica_calls():
        assert (call.grad, call.inference, call.autocast) == (expected.grad, expected.inference, expected.autocast)
        if expected.autocast:
            assert call.autocast_dtype == expected.autocast_dtype
    assert output.requires_grad == expected.grad and output.is_inference() == expected.inference
    assert output.dtype == (expected.autocast_dtype if expected.autocast else torch.float32)


@pytest.mark.parametrize("mode", MODES)
def test_replicas_run_in_the_callers_grad_inference_and_autocast_modes(cpu_primitives, mode):
    check_modes([CPU, CPU], mode)


def check_containers(devices: list[torch.device]) -> None:
    class Model(ManyInputs):
        seen: list = []

    single, model = twin(Model, devices)
    tag = object()
    x, extra, right = (torch.randn(5, 4, dtype=torch.float64, device=devices[0]) for _ in range(3))
    target = torch.randint(0, 3, (5,), device=devices[0])

    def call(m: nn.Module) -> dict:
        return m({"x": x}, [extra, "shared"], Pair("left", right), scale=2.0, tag=tag, target=target)

    reference, output = call(single), call(model)
    replica_views = Model.seen[1:]
    # replicas run in threads, so they record in whichever order they finish
    assert sorted(view[:4] for view in replica_views) == [(2, 2, 2, 2), (3, 3, 3, 3)]  # every tensor split alike
    assert all(view[4:] == (2.0, tag, "shared", "left") and view[5] is tag for view in replica_views)
    assert output.keys() == reference.keys() and output["none"] is None and output["pair"].left == "left"
    torch.testing.assert_close(output["logits"], reference["logits"])
    torch.testing.assert_close(output["pair"].right, reference["pair"].right)
    # a 0-dim output is the chunk-size-weighted mean: the batch-mean loss of one device, with its gradients
    torch.testing.assert_close(output["loss"], reference["loss"])
    reference["loss"].backward()
    output["loss"].backward()
    assert_same_grads(model, single)


def test_containers_and_keywords_are_split_and_other_values_shared(cpu_primitives):
    check_containers([CPU, CPU])


def test_calls_without_tensors_run_once_on_the_first_device(cpu_primitives):
    class Constant(Probe):
        def forward(self, n: int) -> list[int]:
            self.record(torch.empty(n))
            return [n]

    model = parallel(Constant(), [CPU, CPU])
    assert model(4) == [4] and [call.thread for call in model.calls] == [threading.main_thread().ident]


@pytest.mark.parametrize(
    ("inputs", "error"),
    [((torch.randn(4, 4), torch.randn(3, 4)), "different sizes there: \\[3, 4\\]"), ((torch.tensor(1.0),), "0-dim")],
)
def test_inputs_dp_cannot_split_are_refused(cpu_primitives, inputs, error):
    with pytest.raises(ValueError, match=f"{error}.*Fix: "):
        parallel(Probe(), [CPU, CPU])(*inputs)


def test_outputs_dp_cannot_gather_are_refused(cpu_primitives):
    class Counts(Probe):
        def forward(self, x: Tensor) -> Tensor:
            return (x > 0).sum()

    with pytest.raises(TypeError, match=r"0-dim torch.int64 tensor.*Fix: "):
        parallel(Counts(), [CPU, CPU])(torch.randn(4, 4))


class WithExtras(Probe):
    """A module holding networks forward does not use (an EMA copy, a discriminator) and a metric."""

    def __init__(self, dp_modules: tuple[str, ...] | None = None, use: str = "") -> None:
        super().__init__()
        self.ema = nn.Linear(4, 3)
        self.discriminator = nn.Linear(3, 1)
        self.mean_output = MeanMetric()
        self.use = use
        if dp_modules is not None:
            self.dp_modules = dp_modules

    def forward(self, x: Tensor) -> Tensor:
        if self.use == "log":
            self.log("x", x.mean())
        elif self.use:
            getattr(self, self.use)(x)
        return self.net(x)


def test_only_the_modules_forward_uses_are_replicated(cpu_primitives):
    network = len(list(Probe().net.parameters()))
    everything = network + 4  # the EMA copy and the discriminator: weight and bias each
    parallel(WithExtras(), [CPU, CPU])(torch.randn(4, 4))  # by default: every child but metrics
    parallel(WithExtras(dp_modules=("net",)), [CPU, CPU])(torch.randn(4, 4))
    assert cpu_primitives == [everything, network]


REFUSALS = [
    (("net",), "ema", "self.ema was used inside forward, but the module's dp_modules does not list it"),
    (None, "mean_output", "self.mean_output \\(a torchmetrics metric\\) was used inside forward"),
    (None, "log", "self.log was called inside forward"),
    (("net", "teacher"), "", "dp_modules must list names of its child modules"),
]


def check_refusal(devices: list[torch.device], dp_modules: tuple[str, ...] | None, use: str, error: str) -> None:
    with pytest.raises((RuntimeError, ValueError), match=f"{error}.*Fix: "):
        parallel(WithExtras(dp_modules, use), devices)(torch.randn(4, 4, device=devices[0]))


@pytest.mark.parametrize(("dp_modules", "use", "error"), REFUSALS)
def test_what_replicas_must_not_use_is_refused_with_a_fix(cpu_primitives, dp_modules, use, error):
    check_refusal([CPU, CPU], dp_modules, use, error)


def check_batchnorm(devices: list[torch.device]) -> None:
    torch.manual_seed(0)
    single, model = nn.BatchNorm1d(4).to(devices[0]), parallel(nn.BatchNorm1d(4), devices)
    x = torch.randn(8, 4, device=devices[0]) * 3 + 1
    model(x)
    single(x[:4])  # replica 0 updates the module's own buffers in place; the other replicas' updates are lost
    torch.testing.assert_close(model.running_mean, single.running_mean)
    torch.testing.assert_close(model.running_var, single.running_var)
    assert model.num_batches_tracked == 1


def test_batchnorm_running_statistics_come_from_replica_zero(cpu_primitives):
    check_batchnorm([CPU, CPU])


# -- in Lightning's loop -----------------------------------------------------------------------------------------


@pytest.fixture
def two_cpu_devices(cpu_primitives, monkeypatch) -> DataParallelStrategy:
    """A dp strategy over two CPU "devices" (on a CPU it normally runs as one device), parallel forward on."""
    monkeypatch.setattr(DataParallelStrategy, "parallel_forward_active", property(lambda self: True))
    monkeypatch.setattr(
        DataParallelStrategy, "setup_environment", L.pytorch.strategies.ParallelStrategy.setup_environment
    )
    return DataParallelStrategy(parallel_devices=[CPU, CPU])


def train(strategy: Any, threads: set[int] | None = None) -> TinyClassifier:
    L.seed_everything(0)
    model = TinyClassifier()
    if threads is not None:  # hooks are shared with the replicas: record the threads the network ran in
        model.net.register_forward_hook(lambda *_: threads.add(threading.get_ident()))
    data = TinyData(train_size=256, val_size=64, batch_size=32)
    # fp64: in fp32, AdamW turns the rounding differences of a split batch into ~1e-5 differences in 6 steps
    trainer = L.Trainer(accelerator="cpu", devices=1, strategy=strategy, max_steps=6, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=2, precision="64-true")  # fmt: skip
    trainer.fit(model, data)
    return model


def test_a_forward_on_the_instance_is_what_calling_that_module_runs_and_deleting_it_gives_the_class_s_back():
    """What dp's replicas and its parallel forward rely on (and compile and pipeline: each replaces the user's
    ``forward`` on the instance)."""
    module, other, x = nn.Linear(2, 2), nn.Linear(2, 2), torch.ones(1, 2)
    module.forward = lambda inputs: inputs * 7
    assert torch.equal(module(x), x * 7) and "forward" in vars(module)
    assert "forward" not in vars(other) and other(x).shape == (1, 2)
    del module.forward
    assert "forward" not in vars(module) and not torch.equal(module(x), x * 7)


def test_dp_in_lightnings_loop_trains_like_one_device(two_cpu_devices):
    threads: set[int] = set()
    dp_model = train(two_cpu_devices, threads)
    assert len(threads) >= 2 and threading.main_thread().ident not in threads  # forwards ran in replica threads
    assert "forward" not in dp_model.__dict__  # the strategy removed its forward at teardown
    single = train("auto")
    assert list(dp_model.state_dict()) == list(single.state_dict())  # checkpoints keep single-device keys
    for key, value in single.state_dict().items():
        torch.testing.assert_close(dp_model.state_dict()[key], value, rtol=1e-10, atol=1e-12)


class ManualProbe(Probe):
    """Manual optimization with an in-place op in forward (``Probe.forward``), validated by fit and validate."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: list[Tensor], batch_idx: int) -> None:
        optimizer = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward(nn.functional.cross_entropy(self(batch[0]), batch[1]))
        optimizer.step()

    def validation_step(self, batch: list[Tensor], batch_idx: int) -> None:
        self.log("val/loss", nn.functional.cross_entropy(self(batch[0]), batch[1]))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.5)


def fit_manual(strategy: Any, accelerator: str = "cpu") -> tuple[ManualProbe, dict]:
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4, dtype=torch.float64), torch.randint(0, 3, (64,)))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    model = ManualProbe().double()
    trainer = L.Trainer(accelerator=accelerator, devices=1, strategy=strategy, max_epochs=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(model, loader, loader)  # fit validates under no_grad
    return model, trainer.validate(model, loader, verbose=False)[0]  # validate under inference mode


def check_manual_optimization(strategy: DataParallelStrategy, accelerator: str) -> None:
    dp_model, dp_metrics = fit_manual(strategy, accelerator)
    single, metrics = fit_manual("auto", accelerator)
    replica_calls = dp_model.replica_calls()
    # training (grad), fit's validation (no_grad) and trainer.validate (inference mode), each in the replicas
    assert {(call.grad, call.inference) for call in replica_calls} == {(True, False), (False, False), (False, True)}
    torch.testing.assert_close(dp_metrics["val/loss"], metrics["val/loss"])
    for key, value in single.state_dict().items():
        torch.testing.assert_close(dp_model.state_dict()[key], value, rtol=1e-12, atol=1e-14)


def test_dp_supports_manual_optimization_and_inference_mode_validation(two_cpu_devices):
    check_manual_optimization(two_cpu_devices, "cpu")
