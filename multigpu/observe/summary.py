"""The model summary at the start of ``fit``, without FLOPs that were never counted."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichModelSummary
from lightning.pytorch.utilities.model_summary import get_formatted_model_size, get_human_readable_count

from multigpu.hooks.readers import module_flops

_RIGHT_ALIGNED = ("Params", "Params per Device", "FLOPs", "In sizes", "Out sizes")


class ModelSummary(RichModelSummary):
    """Lightning's Rich model summary, with FLOPs only where known: counted from an ``example_input_array``, or
    declared by the module (``flops_per_sample``, ``flops_per_batch``), never a column of zeros."""

    _declared: tuple[str, float] | None = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            self._declared = module_flops(pl_module)
        super().on_fit_start(trainer, pl_module)

    def summarize(  # type: ignore[override]  # Lightning's is a staticmethod; this one reads the declared FLOPs
        self,
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        from rich import get_console
        from rich.table import Table

        columns = [(name, values) for name, values in summary_data if name != "FLOPs" or total_flops > 0]
        table = Table(header_style=summarize_kwargs.get("header_style", "bold magenta"))
        for name, _ in columns:
            table.add_column(
                name,
                justify="right" if name in _RIGHT_ALIGNED else "left",
                style="dim" if name == " " else None,
                no_wrap=name == "Name",
            )
        for row in zip(*(values for _, values in columns), strict=True):
            table.add_row(*row)

        lines = [
            ("Trainable params", get_human_readable_count(int(trainable_parameters))),
            ("Non-trainable params", get_human_readable_count(int(total_parameters - trainable_parameters))),
            ("Total params", get_human_readable_count(int(total_parameters))),
            ("Total estimated model params size (MB)", get_formatted_model_size(model_size)),
            ("Modules in train mode", str(total_training_modes["train"])),
            ("Modules in eval mode", str(total_training_modes["eval"])),
        ]
        if total_flops > 0:
            lines.append(("Total FLOPs", get_human_readable_count(total_flops)))
        elif self._declared is not None:
            name, value = self._declared
            unit = "sample" if name == "flops_per_sample" else "micro-batch"
            lines.append((f"Training FLOPs per {unit} (the model's {name})", get_human_readable_count(int(value))))
        console = get_console()
        console.print(table)
        for label, value in lines:
            console.print(f"[bold]{label}[/]: {value}")
