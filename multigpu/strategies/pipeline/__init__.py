"""``strategy="pipeline"``: ``options`` (settings and checks), ``stages``, ``exchange``, ``strategy``."""

from multigpu.strategies.pipeline.options import PipelineOptions, bubble_fraction, check_pipeline, check_stages
from multigpu.strategies.pipeline.strategy import PipelineStrategy

__all__ = [
    "PipelineOptions",
    "PipelineStrategy",
    "bubble_fraction",
    "check_pipeline",
    "check_stages",
]
