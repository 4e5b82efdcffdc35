"""The strategy benchmark: one device, ``dp``, ``ddp`` and ``ddp_spawn`` against plain PyTorch, measured.

``python -m src.bench --quick`` runs the whole comparison in about a minute; ``docs/benchmarks.md`` has the
commands and results. The template rows launch the real ``python -m src.cli fit`` with a timing callback
(``src/bench/timing.py``); the baselines are a plain PyTorch loop and plain DDP started with
``torch.multiprocessing.spawn`` on the same network, data and optimizer (``src/bench/plain.py``).
"""
