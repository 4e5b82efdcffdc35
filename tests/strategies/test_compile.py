"""``--compile`` (multigpu/strategies/compile.py): torch.compile on the model's forward, for any LightningModule."""

from __future__ import annotations

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, SingleDeviceStrategy
from torch import Tensor, nn
from torch.utils.data import TensorDataset

from multigpu.data.base import GlobalBatchDataModule
from multigpu.facts import RunFacts
from multigpu.run.checks import check_compile
from multigpu.strategies import DataParallelStrategy
from multigpu.strategies.compile import compile_refusal
from tests.cli import TemplateCLI, main
from tests.conftest import TINY, load_state, relative_difference


class TinyRegression(L.LightningModule):
    """A user's module that is not a TemplateModule: two linear layers, SGD, forward called through ``self(x)``."""

    def __init__(self, features: int = 8, hidden: int = 16) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: list[Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: list[Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", F.mse_loss(self(x), y), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


class TinyRegressionData(GlobalBatchDataModule):
    """y = sum(x): 64 training and 32 validation samples (float64, as the tests train in 64-true)."""

    def __init__(self, batch_size: int = 16, features: int = 8) -> None:
        super().__init__(batch_size=batch_size)
        self.features = features

    def _samples(self, size: int, seed: int) -> TensorDataset:
        x = torch.randn(size, self.features, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        return TensorDataset(x, x.sum(dim=1, keepdim=True))

    def setup(self, stage: str | None = None) -> None:
        self.train_set, self.val_set = self._samples(64, seed=0), self._samples(32, seed=1)


TINY_USER = [
    "--model=tests.strategies.test_compile.TinyRegression",
    "--data=tests.strategies.test_compile.TinyRegressionData",
    "--trainer.accelerator=cpu",
    "--trainer.precision=64-true",  # compiled and eager agree to rounding, which fp64 keeps far below 1e-10
    "--trainer.enable_model_summary=false",
    "--trainer.max_steps=6",
    "--trainer.max_epochs=10",
    "--trainer.limit_val_batches=1",
    "--progress_bar=none",
]


@pytest.mark.slow  # about 14 s with an empty inductor cache
def test_compiled_fit_trains_like_eager_with_the_same_checkpoint_keys_and_resumes_either_way(tmp_path, capfd):
    main(["fit", *TINY_USER, f"--trainer.default_root_dir={tmp_path / 'eager'}"])
    capfd.readouterr()
    main(["fit", *TINY_USER, "--compile=true", f"--trainer.default_root_dir={tmp_path / 'compiled'}"])
    assert "compiling TinyRegression.forward with torch.compile (backend inductor)" in "".join(capfd.readouterr())

    eager = load_state(tmp_path / "eager" / "checkpoints" / "last.ckpt")
    compiled = load_state(tmp_path / "compiled" / "checkpoints" / "last.ckpt")
    assert list(compiled) == list(eager) and not any("_orig_mod" in key for key in compiled)
    L.seed_everything(42)  # the CLI's seed, before it builds the model: the initial weights of both runs
    assert relative_difference(eager, TinyRegression().double().state_dict()) > 1e-3  # it trained
    assert relative_difference(eager, compiled) < 1e-10

    # a checkpoint written with compile resumes without it, and one written without it resumes with it
    for run, flags in (("compiled", []), ("eager", ["--compile=true"])):
        main(["fit", *TINY_USER, "--trainer.max_steps=8", "--ckpt_path=last", *flags,
              f"--trainer.default_root_dir={tmp_path / run}"])  # fmt: skip
        assert torch.load(tmp_path / run / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 8
    resumed = [load_state(tmp_path / run / "checkpoints" / "last.ckpt") for run in ("compiled", "eager")]
    assert relative_difference(*resumed) < 1e-10


@pytest.mark.parametrize(
    ("strategy", "why"),
    [
        (["--trainer.strategy=dp"], "--trainer.strategy=dp: dp copies the module"),
        (["--trainer.strategy=fsdp2", "--trainer.devices=2"], "--trainer.strategy=fsdp2: FSDP2Strategy shards"),
        (["--trainer.strategy=pipeline", "--trainer.devices=2"], "--trainer.strategy=pipeline: pipeline trains by"),
        (
            ["--trainer.strategy.class_path=lightning.pytorch.strategies.ModelParallelStrategy", "--trainer.devices=2"],
            "--trainer.strategy.class_path=lightning.pytorch.strategies.ModelParallelStrategy: ModelParallelStrategy",
        ),
    ],
)
def test_an_unsupported_strategy_is_refused_before_launch_in_one_paragraph_with_exit_status_2(
    tmp_path, capsys, monkeypatch, strategy, why
):
    def built(*args: object, **kwargs: object) -> None:
        raise AssertionError("the objects were built: the refusal came after the checks before launch")

    monkeypatch.setattr(TemplateCLI, "instantiate_classes", built)
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as stopped:
        main(
            ["fit", *TINY, *strategy, "--compile=true", "--progress_bar=none", f"--trainer.default_root_dir={run_dir}"]
        )
    assert stopped.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith(f"error: --compile=true does not work with {why}")
    assert "Fix: train with --trainer.strategy=ddp (or ddp_spawn, or a single device)" in error[0]
    assert not run_dir.exists()


def test_supported_strategies_are_single_device_and_the_ddp_family():
    ddp_class = {"class_path": "lightning.pytorch.strategies.DDPStrategy"}
    for supported in ("auto", "ddp", "ddp_spawn", "single_device", ddp_class):
        check_compile(RunFacts.of({"strategy": supported}))  # passes the check before launch
    cpu = torch.device("cpu")
    assert compile_refusal(SingleDeviceStrategy(cpu)) is None
    assert compile_refusal(DDPStrategy()) is None
    assert compile_refusal(DDPStrategy(start_method="spawn")) is None
    assert "dp copies the module" in compile_refusal(DataParallelStrategy(parallel_devices=[cpu, cpu]))
    assert "FSDPStrategy shards or wraps the module" in compile_refusal(FSDPStrategy())


@pytest.mark.slow
def test_compiled_ddp_spawn_trains_like_one_eager_device(tmp_path, run_cli):
    main(["fit", *TINY_USER, f"--trainer.default_root_dir={tmp_path / 'eager'}"])
    # aot_eager: the same graph capture and autograd split as inductor, without its code generation (ddp compiles
    # with inductor: tests/examples/test_image.py)
    result = run_cli(
        "fit", *TINY_USER, "--trainer.strategy=ddp_spawn", "--trainer.devices=2",
        "--trainer.callbacks+=multigpu.strategies.compile.CompileModel", "--trainer.callbacks.backend=aot_eager",
        f"--trainer.default_root_dir={tmp_path / 'ddp_spawn'}",
    )  # fmt: skip
    assert "compiling TinyRegression.forward with torch.compile (backend aot_eager)" in result.stdout + result.stderr
    eager = load_state(tmp_path / "eager" / "checkpoints" / "last.ckpt")
    compiled = load_state(tmp_path / "ddp_spawn" / "checkpoints" / "last.ckpt")
    assert list(compiled) == list(eager)
    assert relative_difference(eager, compiled) < 1e-10
