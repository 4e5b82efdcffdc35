"""The ``tune`` subcommand: the largest micro-batch one device holds and a learning rate, written as a config.

Lightning's finders run on one device only: the learning rate found at the micro-batch is scaled to the global batch."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import lightning as L
import yaml
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.tuner import Tuner

from multigpu.checkpoints.files import with_atomic_io
from multigpu.command import prog
from multigpu.data.base import GlobalBatchDataModule
from multigpu.errors import ConfigurationError
from multigpu.hooks import HasBatchSize
from multigpu.models.base import TemplateModule
from multigpu.tuning.scaling import LrScaling, global_batch_size, scaled_lr

TUNED_CONFIG_NAME = "tuned.yaml"


@dataclass
class TuneResult:
    micro_batch: int
    batch_size: int  # the value written to --data.init_args.batch_size
    global_batch: int
    lr_suggestion: float | None  # the LR finder's, at micro_batch on one device
    lr: float | None  # scaled to global_batch
    config_path: Path


class Trainer(L.Trainer):
    """Lightning's ``Trainer`` with a ``tune`` method, which LightningCLI runs as the ``tune`` subcommand."""

    # named Trainer because messages about --trainer options name the class; built for `tune` alone

    def tune(
        self,
        model: L.LightningModule,
        datamodule: L.LightningDataModule | None = None,
        batch_size_mode: Literal["power", "binsearch"] = "power",
        init_batch_size: int = 2,
        max_batch_size: int = 8192,
        steps_per_trial: int = 3,
        lr_find_steps: int = 100,
        min_lr: float = 1e-8,
        max_lr: float = 1.0,
        lr_scaling: LrScaling = "sqrt",
        tuned_config: str | None = None,
    ) -> TuneResult:
        """Find the largest per-device micro-batch and a learning rate; write them as a config for ``fit --config``.

        Args:
            model: The model to tune (from ``--model``).
            datamodule: The data module whose ``batch_size`` is searched (from ``--data``).
            batch_size_mode: ``power`` doubles the micro-batch until out of memory; ``binsearch`` then bisects.
            init_batch_size: The micro-batch the search starts from.
            max_batch_size: Stop doubling here (a CPU rarely runs out of memory; the dataset size also stops it).
            steps_per_trial: Training steps run at each tried size.
            lr_find_steps: Steps of Lightning's LR range test (0: skip the learning rate).
            min_lr: Lowest learning rate the range test tries.
            max_lr: Highest learning rate the range test tries.
            lr_scaling: The rate carried to the global batch: ``sqrt`` (Adam-type), ``linear`` (SGD), ``none``.
            tuned_config: Where to write the config; default ``<run dir>/tuned.yaml``.
        """
        holder = datamodule if isinstance(datamodule, HasBatchSize) else model
        if not isinstance(holder, HasBatchSize):
            raise ConfigurationError(
                f"tune searches a `batch_size` argument, and neither --data ({type(datamodule).__name__}) nor --model"
                f" ({type(model).__name__}) has one. Fix: give your data module a `batch_size: int` argument and use"
                " it in train_dataloader()."
            )
        devices = self.num_devices * self.num_nodes
        accumulate = self.accumulate_grad_batches
        # Lightning's search runs its first trial on the loader built before it sets init_val: start there
        holder.batch_size = init_batch_size
        with tempfile.TemporaryDirectory(prefix="tune-") as scratch:
            micro = Tuner(self._single_device_trainer(scratch)).scale_batch_size(
                model,
                datamodule=datamodule,
                mode=batch_size_mode,
                steps_per_trial=steps_per_trial,
                init_val=init_batch_size,
                max_val=max_batch_size,
            )
            if not micro:
                raise ConfigurationError(
                    f"tune found no micro-batch that fits on one {self.strategy.root_device.type} device (Lightning's"
                    " batch-size finder does not run under --trainer.fast_dev_run). Fix: drop fast_dev_run; if"
                    " memory is the problem, shrink the model or lower --trainer.precision."
                )
            lr_suggestion = None
            if lr_find_steps > 0:
                # a fresh Trainer: the finders leave loop state behind (each restores the initial weights)
                finder = Tuner(self._single_device_trainer(scratch)).lr_find(
                    model,
                    datamodule=datamodule,
                    min_lr=min_lr,
                    max_lr=max_lr,
                    num_training=lr_find_steps,
                    update_attr=False,
                )
                lr_suggestion = finder.suggestion() if finder is not None else None
        is_global = isinstance(datamodule, GlobalBatchDataModule)
        global_batch = global_batch_size(micro, devices, accumulate)
        lr = None if lr_suggestion is None else scaled_lr(lr_suggestion, micro, global_batch, lr_scaling)
        path = Path(tuned_config or Path(self.default_root_dir) / TUNED_CONFIG_NAME)
        result = TuneResult(micro, global_batch if is_global else micro, global_batch, lr_suggestion, lr, path)
        lines = self._summary(result, batch_size_mode, max_batch_size, steps_per_trial, lr_scaling, devices)
        if lr is not None and _lr_key(model) is None:
            lines.append("(the model has no optimizer or lr argument: set this learning rate in your code)")
        if self.is_global_zero:
            _write_config(path, result, model, datamodule is holder, lines)
        _print_summary(lines, path)
        return result

    def _single_device_trainer(self, root_dir: str) -> L.Trainer:
        """One device of the kind this Trainer was given, at its precision, writing only in ``root_dir``."""
        device = self.strategy.root_device
        return L.Trainer(
            accelerator=device.type,
            devices=[device.index] if device.index is not None else 1,
            precision=self.precision,
            plugins=with_atomic_io(None),
            gradient_clip_val=self.gradient_clip_val,
            gradient_clip_algorithm=self.gradient_clip_algorithm,
            default_root_dir=root_dir,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )

    def _summary(
        self, result: TuneResult, mode: str, max_batch_size: int, steps: int, rule: str, devices: int
    ) -> list[str]:
        cap = f"; stopped at --max_batch_size={max_batch_size}, no out-of-memory error below it"
        cap = cap if result.micro_batch >= max_batch_size else ""
        lines = [
            f"measured on one {self.strategy.root_device.type} device at precision {self.precision}, for"
            f" {type(self.strategy).__name__} on {devices} device(s) x {self.accumulate_grad_batches} accumulated"
            " micro-batch(es)",
            f"micro-batch per device: {result.micro_batch} ({mode} search, {steps} steps per tried size{cap})",
            f"global batch: {result.global_batch} = {result.micro_batch} x {devices} device(s)"
            f" x {self.accumulate_grad_batches} accumulation",
        ]
        if result.batch_size != result.global_batch:
            lines.append(f"batch_size written: {result.batch_size} (this data module's batch_size is per process)")
        if result.lr_suggestion is None:
            lines.append("learning rate: not measured (LR finder skipped or without a suggestion)")
        else:
            lines.append(
                f"learning rate: {result.lr:.3g} = LR finder's suggestion at batch {result.micro_batch},"
                f" {result.lr_suggestion:.3g}, {rule}-scaled to batch {result.global_batch}"
            )
        return lines


def _lr_key(model: L.LightningModule) -> list[str] | None:
    if isinstance(model, TemplateModule):
        return ["model", "init_args", "optimizer", "init_args", "lr"]
    for name in ("lr", "learning_rate"):
        if name in model.hparams:
            return ["model", "init_args", name]
    return None


def _write_config(path: Path, result: TuneResult, model: L.LightningModule, in_data: bool, lines: list[str]) -> None:
    config: dict[str, Any] = {}
    values = [(["data" if in_data else "model", "init_args", "batch_size"], result.batch_size)]
    lr_key = _lr_key(model)
    if result.lr is not None and lr_key is not None:
        values.append((lr_key, float(f"{result.lr:.3g}")))
    for keys, value in values:
        node = config
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
    header = "".join(f"# {line}\n" for line in [f"Written by `{prog()} tune`:", *lines])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + yaml.safe_dump(config, sort_keys=False))


@rank_zero_only
def _print_summary(lines: list[str], path: Path) -> None:
    print("Tuned:", *(f"  {line}" for line in lines), sep="\n")
    print(f"Wrote {path}. Train with it (flags after --config still win):")
    print(f"  {prog()} fit <the options given to tune> --config {path}", flush=True)
