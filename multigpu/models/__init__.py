"""Base classes of a project's models."""

from multigpu.models.base import Classifier, TemplateModule, WeightedMean, at_least_fp32

__all__ = ["Classifier", "TemplateModule", "WeightedMean", "at_least_fp32"]
