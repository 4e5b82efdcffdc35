"""``--compile``: the model's ``forward`` compiled with ``torch.compile``, for any LightningModule."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import (
    DDPStrategy,
    DeepSpeedStrategy,
    SingleDeviceStrategy,
    SingleDeviceXLAStrategy,
    Strategy,
    XLAStrategy,
)

from multigpu.compat import compiled_by_torch
from multigpu.errors import ConfigurationError, notice

#: subclasses of supported strategies that copy or shard the module in ways a compiled forward does not survive
_REFUSED_SUBCLASSES = (DeepSpeedStrategy, XLAStrategy, SingleDeviceXLAStrategy)


def compile_refusal(strategy: Strategy | type[Strategy], given: str = "this strategy") -> str | None:
    """Why ``--compile`` cannot run under this strategy (an object, or its class before the launch), or None."""
    kind = strategy if isinstance(strategy, type) else type(strategy)
    name = kind.__name__
    if issubclass(kind, (SingleDeviceStrategy, DDPStrategy)) and not issubclass(kind, _REFUSED_SUBCLASSES):
        return None
    why = {
        "DataParallelStrategy": "dp copies the module onto every GPU at each step and runs the class's eager forward"
        " on each copy in place of the module's forward, so a compiled forward would never run",
        "PipelineStrategy": "pipeline trains by running the modules the model's pipeline_stage returns, stage by"
        " stage, and evaluates through them in place of the module's forward, so a compiled forward would never run",
    }.get(name, f"{name} shards or wraps the module itself, which the template's compile does not support")
    return (
        f"--compile=true does not work with {given}: {why}. Fix: train with --trainer.strategy=ddp (or"
        " ddp_spawn, or a single device) to compile, or drop --compile to keep this strategy."
    )


class CompileModel(Callback):
    """Compiles the LightningModule's ``forward`` (what ``self(x)`` in the steps runs) with ``torch.compile``.

    Only ``forward``, set on the instance, so the checkpoint's keys are unchanged (``docs/best_practices.md``); in
    ``setup``, after the launch, so ``ddp_spawn`` never pickles a compiled function.

    Args:
        mode: ``torch.compile``'s mode: ``default``, ``reduce-overhead`` (CUDA graphs) or ``max-autotune``.
        fullgraph: Fail instead of falling back to eager Python at a graph break.
        dynamic: Compile for dynamic shapes (None: let torch decide after a shape changes).
        backend: ``torch.compile``'s backend: ``inductor`` (generated kernels), or ``aot_eager`` / ``eager`` to
            tell a compiler problem from a graph-capture one.
    """

    def __init__(
        self,
        mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default",
        fullgraph: bool = False,
        dynamic: bool | None = None,
        backend: str = "inductor",
    ) -> None:
        self.mode = mode
        self.fullgraph = fullgraph
        self.dynamic = dynamic
        self.backend = backend
        self._compiled: Callable[..., Any] | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        refusal = compile_refusal(trainer.strategy)
        if refusal is not None:
            raise ConfigurationError(refusal, every_rank=True)
        if compiled_by_torch(pl_module):
            return  # compiled for an earlier stage of the same module (or by the user): never compile twice
        notice(
            f"compiling {type(pl_module).__name__}.forward with torch.compile (backend {self.backend}):"
            " the first steps of each stage run slower while it compiles"
        )
        options = {"mode": self.mode} if self.backend == "inductor" else {}
        self._compiled = torch.compile(
            pl_module.forward, fullgraph=self.fullgraph, dynamic=self.dynamic, backend=self.backend, **options
        )
        pl_module.forward = self._compiled

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # the eager forward again, so the module pickles (ddp_spawn's next stage, torch.save)
        if self._compiled is not None and vars(pl_module).get("forward") is self._compiled:
            del pl_module.forward
        self._compiled = None
