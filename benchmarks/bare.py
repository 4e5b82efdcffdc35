"""The bare-Lightning baseline: the workload's model trained by a plain ``L.Trainer``, without the template.

It separates Lightning's cost from the template's: the network, data module, optimizer, scheduler, gradient
clipping, seed and precision are the template's (built by its CLI, ``benchmarks/workloads.py``); the Trainer has
Lightning's defaults except for what a fair baseline must turn off (``BARE_TRAINER_OFF``) and none of the
template's callbacks, CLI checks or strategies. For a built-in workload the LightningModule is a forward and a
loss around the example's network, with no metrics and no ``self.log``; for a user's model (``--model``,
``--data``, ``--config``) it is the user's own LightningModule and data module, as they would train them in a
script of their own, at the same global batch and number of steps. Started by
``python -m benchmarks.plain --mode lightning``; with ``--devices`` > 1 it runs Lightning's ``ddp``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import lightning as L
import torch.nn.functional as F
from torch import Tensor, nn

from benchmarks.timing import StepTimer
from benchmarks.workloads import build_cli, workload_from_args

#: Trainer options the baseline sets away from Lightning's defaults: no logger, no checkpoints, no progress bar
#: (the template rows run validation-free too, and write their checkpoint after the timed window)
BARE_TRAINER_OFF: dict[str, Any] = {
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "limit_val_batches": 0,
    "num_sanity_val_steps": 0,
}


class BareLightningModule(L.LightningModule):
    """A network and its loss: what a LightningModule needs at least, nothing the template adds.

    Args:
        net: The network (the template model's ``.net``).
        configure_optimizers: Returns what ``configure_optimizers`` returns (the template model's own method).
    """

    def __init__(self, net: nn.Module, configure_optimizers: Callable[[], Any]) -> None:
        super().__init__()
        self.net = net
        self._configure_optimizers = configure_optimizers

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """Cross-entropy of one batch ``(inputs, targets)``, as the plain loop computes it."""
        inputs, targets = batch
        logits = self.net(inputs).float()
        return F.cross_entropy(logits.flatten(0, -2) if logits.ndim > 2 else logits, targets.flatten())

    def configure_optimizers(self) -> Any:
        """The template model's optimizer and scheduler, over the same parameters (those of ``net``)."""
        return self._configure_optimizers()


def train_bare_lightning(args: argparse.Namespace) -> None:
    """Train ``args.steps`` optimizer steps with ``L.Trainer``; each rank writes its step times to ``args.out``."""
    import torch

    torch.set_num_threads(args.threads)
    workload = workload_from_args(args)
    cli = build_cli(workload, args.quick, args.data_batch_size or args.batch_size)
    module: L.LightningModule = (
        BareLightningModule(cli.model.net, cli.model.configure_optimizers) if workload.builtin else cli.model
    )
    trainer = L.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        precision=args.precision,
        max_steps=args.steps,
        max_epochs=-1,
        # the options of the step's math that the template's Trainer was given: the same in both rows
        gradient_clip_val=cli.trainer.gradient_clip_val,
        gradient_clip_algorithm=cli.trainer.gradient_clip_algorithm,
        accumulate_grad_batches=cli.trainer.accumulate_grad_batches,
        callbacks=[StepTimer(args.out)],
        default_root_dir=str(args.out) + ".run",
        **BARE_TRAINER_OFF,
    )
    trainer.fit(module, datamodule=cli.datamodule)
