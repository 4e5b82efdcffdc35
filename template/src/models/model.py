"""The project's model: a small classifier that trains as it is on the generated data of ``src/data/data.py``.

Replace it with yours where ``REPLACE`` says. Any ``LightningModule`` works (``configs/default.yaml`` names the
class); ``Classifier`` brings the steps, the per-stage metrics (``train/loss``, ``val/loss``, ``val/acc``,
``val/acc_best``, ``test/*``) and the optimizer and LR scheduler as command-line options. For another kind of
model subclass ``TemplateModule`` (the optimizer options only) and write ``training_step`` and the others.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from multigpu import Classifier


class Model(Classifier):
    """A two-layer perceptron over feature vectors (REPLACE: your network and its options).

    Args:
        features: Size of one input vector (the data module's ``features``).
        hidden: Width of the hidden layer.
        classes: Number of classes (the data module's ``classes``).
        dropout: Dropout probability after the hidden layer.
        **kwargs: The optimizer and LR scheduler: ``--model.optimizer=SGD --model.optimizer.lr=0.1``.
    """

    def __init__(
        self, features: int = 20, hidden: int = 64, classes: int = 5, dropout: float = 0.0, **kwargs: Any
    ) -> None:
        super().__init__(classes, **kwargs)
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])  # a checkpoint rebuilds the model from them
        # REPLACE: the network from a batch of inputs to class logits; Classifier calls it through self(inputs)
        self.net = nn.Sequential(
            nn.Linear(features, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, classes)
        )

    def flops_per_sample(self) -> int:
        """Forward and backward FLOPs of one sample, for the logged TFLOP/s and MFU (optional: without it the
        throughput is in samples per second only)."""
        return 6 * sum(module.weight.numel() for module in self.net if isinstance(module, nn.Linear))
