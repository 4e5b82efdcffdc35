"""Models. Put yours here: any ``LightningModule`` works; subclass ``TemplateModule`` for CLI-chosen optimizers."""

from src.models.base import Classifier, TemplateModule
from src.models.gpt import GPT, CausalLanguageModel
from src.models.image_classifier import CompactResNet, ImageClassifier

__all__ = ["GPT", "CausalLanguageModel", "Classifier", "CompactResNet", "ImageClassifier", "TemplateModule"]
