"""``strategy="pipeline"``: the model's layers in stages over processes (``strategy.py`` says how it runs).

- ``options``: ``--pipeline.*`` (``PipelineOptions``) and the checks of a split before launch;
- ``stages``: a process's part of the model, its stages sharded and the other stages' layers replaced;
- ``exchange``: what the processes of a pipeline send each other outside torch's schedules;
- ``strategy``: ``PipelineStrategy``, registered as ``pipeline``.
"""

from multigpu.strategies.pipeline.options import PipelineOptions, bubble_fraction, check_pipeline, check_stages
from multigpu.strategies.pipeline.strategy import PipelineStrategy

__all__ = [
    "PipelineOptions",
    "PipelineStrategy",
    "bubble_fraction",
    "check_pipeline",
    "check_stages",
]
