"""The strategy benchmark: one device, ``dp``, ``ddp`` and ``ddp_spawn`` against bare Lightning and plain PyTorch.

``python -m src.bench --quick`` runs the whole comparison in about two minutes; ``docs/benchmarks.md`` has the
commands and results. The template rows launch the real ``python -m src.cli fit`` with a timing callback
(``src/bench/timing.py``); the baselines (``src/bench/plain.py``, ``src/bench/bare.py``) are built by the same CLI
from the same flags (``src/bench/workloads.py``): a plain PyTorch loop, plain DDP started with
``torch.multiprocessing.spawn``, and bare Lightning (a minimal LightningModule and a plain ``L.Trainer``).
``python -m src.bench --model=PKG.Class --data=PKG.Class`` (or ``--config FILE``) measures a user's own model the
same way, with the user's LightningModule and data module in a plain ``L.Trainer`` as bare Lightning; it has no
plain PyTorch rows (the plain loop re-implements the built-in workloads' step). Nothing here imports the example
workloads until one is built.
"""
