"""Models. Put yours here: any ``LightningModule`` works; subclass ``TemplateModule`` for CLI-chosen optimizers."""

from __future__ import annotations

import importlib
from typing import Any

from src.models.base import Classifier, TemplateModule

#: the examples, imported when first named (``--model=src.models.CausalLanguageModel``): a run of your own model
#: does not load them
EXAMPLES = {
    "GPT": "src.models.gpt",
    "CausalLanguageModel": "src.models.gpt",
    "CompactResNet": "src.models.image_classifier",
    "ImageClassifier": "src.models.image_classifier",
}

__all__ = ["GPT", "CausalLanguageModel", "Classifier", "CompactResNet", "ImageClassifier", "TemplateModule"]


def __getattr__(name: str) -> Any:
    if name in EXAMPLES:  # kept as the package's own name once imported: later lookups do not come here
        found = globals()[name] = getattr(importlib.import_module(EXAMPLES[name]), name)
        return found
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
