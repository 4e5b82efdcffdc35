"""The strategy benchmark: one device, ``dp``, ``ddp``, ``ddp_spawn`` (and, when named, ``fsdp2`` and
``tensor_parallel``) against bare Lightning and plain PyTorch.

A tool about the template, kept beside the package a project imports (``src/``), as Lightning keeps its
``benchmarks/`` outside its package: run it from the repository root, ``python -m benchmarks --quick`` (about two
minutes); ``docs/benchmarks.md`` has the commands, the results and the project's targets. The template rows launch
the real ``python -m src.cli fit`` with a timing callback (``timing.py``); the baselines (``plain.py``,
``bare.py``) are built by the same CLI from the same flags (``workloads.py``): a plain PyTorch loop, plain DDP
started with ``torch.multiprocessing.spawn``, and bare Lightning (a minimal LightningModule and a plain
``L.Trainer``). ``python -m benchmarks --model=PKG.Class --data=PKG.Class`` (or ``--config FILE``) measures a
user's own model the same way; it has no plain PyTorch rows (the plain loop re-implements the built-in workloads'
step). Nothing here imports the example workloads until one is built.
"""

from pathlib import Path

#: the repository root: the runs start there, and the built-in workloads' files are looked up from it
REPO = Path(__file__).resolve().parents[1]
