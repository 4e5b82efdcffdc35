"""This project's models. Put yours here: any ``LightningModule`` works; subclass the engine's ``TemplateModule``
(``from multigpu import TemplateModule``) for optimizers chosen on the command line."""

from __future__ import annotations

import importlib
from typing import Any

#: the examples, imported when first named (``--model=src.models.CausalLanguageModel``): a run of your own model
#: does not load them
EXAMPLES = {
    "GPT": "src.models.gpt",
    "CausalLanguageModel": "src.models.gpt",
    "CompactResNet": "src.models.image_classifier",
    "ImageClassifier": "src.models.image_classifier",
}

__all__ = ["GPT", "CausalLanguageModel", "CompactResNet", "ImageClassifier"]


def __getattr__(name: str) -> Any:
    if name in EXAMPLES:  # kept as the package's own name once imported: later lookups do not come here
        found = globals()[name] = getattr(importlib.import_module(EXAMPLES[name]), name)
        return found
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
