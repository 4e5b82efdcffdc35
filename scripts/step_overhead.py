"""Where a training step's time goes outside the network: each callback's hooks, Lightning calling them, the model's
metric updates and logging. One process, in-process timers, so the figures do not depend on run-to-run noise.

    python scripts/step_overhead.py --workload image --batch-size 4 --steps 600

Builds the benchmark's workload with the template's CLI (``CLI(run=False)``: the default callbacks, the
CSV logger, the plain progress bar, ``configs/default.yaml``), wraps every ``on_*`` hook of every callback in a
timer, and trains. After ``--warmup`` steps it counts, per optimizer step: the time inside each callback's hooks;
Lightning's cost of calling a callback hook (its dispatch loop timed on a hook no callback overrides, once per
callback and hook); and the model's ``training_step`` minus its ``model_step`` (forward and loss), which is the
template model's metric updates and ``self.log``. The step time itself is printed for scale.
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.callbacks import Callback  # noqa: E402

from benchmarks.workloads import WORKLOADS, cli_flags  # noqa: E402
from src.cli import CLI  # noqa: E402

#: the callback hooks Lightning calls on every optimizer step of automatic optimization
STEP_HOOKS = (
    "on_train_batch_start",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
    "on_train_batch_end",
)


class Meter(Callback):
    """Holds the timers; starts counting after the warm-up steps."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.seconds: dict[str, float] = defaultdict(float)
        self.counting = False
        self.started = 0.0
        self.steps = 0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        if trainer.global_step == self.warmup and not self.counting:
            self.counting, self.started = True, time.perf_counter()
            self.seconds.clear()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.steps = trainer.global_step - self.warmup
        self.seconds["(the whole step)"] = time.perf_counter() - self.started

    def timed(self, label: str, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                if self.counting:
                    self.seconds[label] += time.perf_counter() - start

        return wrapper


def dispatch_seconds(trainer: L.Trainer, calls: int = 2000) -> float:
    """Lightning's cost of calling one hook on every callback of the trainer, per call of the hook."""
    # private, and used here only to measure it: the loop Lightning runs for every callback hook it calls
    from lightning.pytorch.trainer.call import _call_callback_hooks

    start = time.perf_counter()
    for _ in range(calls):
        _call_callback_hooks(trainer, "on_predict_epoch_end")  # a no-op in all of them
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="image", choices=sorted(WORKLOADS))
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=600, help="timed steps, after the warm-up")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--quick", action=argparse.BooleanOptionalAction, default=True, help="the --quick models")
    args = parser.parse_args()
    torch.set_num_threads(1)

    flags = cli_flags(WORKLOADS[args.workload], args.quick, {"data.init_args.batch_size": args.batch_size})
    run_dir = tempfile.mkdtemp(prefix="step_overhead_")
    trainer_flags = [
        "--trainer.accelerator=cpu", "--trainer.devices=1", f"--trainer.max_steps={args.warmup + args.steps}",
        "--trainer.max_epochs=-1", "--trainer.limit_val_batches=0", "--trainer.num_sanity_val_steps=0",
        f"--trainer.default_root_dir={run_dir}", "--progress_bar=plain",
    ]  # fmt: skip
    cli = CLI(args=[*flags, *trainer_flags], run=False)
    trainer, model = cli.trainer, cli.model
    meter = Meter(args.warmup)
    callbacks = list(trainer.callbacks)
    for callback in callbacks:
        for hook in STEP_HOOKS:
            setattr(callback, hook, meter.timed(type(callback).__name__, getattr(callback, hook)))
    model.training_step = meter.timed("model: training_step", model.training_step)  # type: ignore[method-assign]
    model.model_step = meter.timed("model: forward + loss", model.model_step)  # type: ignore[attr-defined]
    trainer.callbacks.append(meter)
    trainer.fit(model, datamodule=cli.datamodule)

    per_step = {label: 1000 * seconds / meter.steps for label, seconds in meter.seconds.items()}
    dispatch = 1000 * dispatch_seconds(trainer) * len(STEP_HOOKS) * len(callbacks) / (len(callbacks) + 1)
    metrics = per_step.pop("model: training_step") - per_step.pop("model: forward + loss")
    print(f"\n{args.workload}, global batch {args.batch_size}, {meter.steps} timed steps, one CPU process")
    print(f"  {'the whole step':44s} {per_step.pop('(the whole step)'):7.3f} ms")
    print(f"  {'model: metric updates and self.log':44s} {metrics:7.3f} ms")
    print(f"  {f'Lightning calling the hooks of {len(callbacks)} callbacks':44s} {dispatch:7.3f} ms")
    for label, milliseconds in sorted(per_step.items(), key=lambda item: -item[1]):
        print(f"  {f'callback {label}':44s} {milliseconds:7.3f} ms")


if __name__ == "__main__":
    main()
