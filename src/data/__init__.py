"""This project's data modules. Put yours here: subclass the engine's ``GlobalBatchDataModule``
(``from multigpu import GlobalBatchDataModule``) to keep the global batch semantics."""

from __future__ import annotations

import importlib
from typing import Any

#: the examples, imported when first named (``--data=src.data.TextDataModule``): a run of your own data module
#: does not load them
EXAMPLES = {
    "CIFAR10DataModule": "src.data.images",
    "TextDataModule": "src.data.text",
}

__all__ = ["CIFAR10DataModule", "TextDataModule"]


def __getattr__(name: str) -> Any:
    if name in EXAMPLES:  # kept as the package's own name once imported: later lookups do not come here
        found = globals()[name] = getattr(importlib.import_module(EXAMPLES[name]), name)
        return found
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
