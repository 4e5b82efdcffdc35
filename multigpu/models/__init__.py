"""Base classes of a project's models: ``TemplateModule`` (optimizer and scheduler from the command line) and
``Classifier`` (its metrics)."""

from multigpu.models.base import Classifier, TemplateModule, WeightedMean, at_least_fp32

__all__ = ["Classifier", "TemplateModule", "WeightedMean", "at_least_fp32"]
