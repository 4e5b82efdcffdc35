"""Checkpoints, in one package: what a run writes, what it resumes from, and how to read one anywhere.

- ``files.py``: single-file checkpoints written atomically (``AtomicCheckpointIO``), a second name of one (a hard
  link: ``best-<step>.ckpt`` and ``last.ckpt`` of one save), and what "intact" means.
- ``background.py``: those writes on a background thread from a host copy of the state (``BackgroundCheckpointIO``,
  ``--checkpoint.async_save``), one writer at a time.
- ``sharded.py``: the folders of shards ``fsdp2`` / ``tensor_parallel`` write, replaced atomically, read whole.
- ``safe.py``: reading what a command did not write without running code: a file with ``weights_only``, a folder
  of shards checked whole (its index unpickled with torch's metadata classes only) before torch reads it.
- ``resume.py``: ``--ckpt_path`` resolved (``last``, a damaged newest file) and read once for the checks.
- ``consolidate.py``: ``python -m multigpu.consolidate DIR OUT.ckpt``, one file from a folder of shards.

What goes into a checkpoint besides Lightning's own state is the callbacks' (``multigpu/callbacks/``: the position
in the epoch, each rank's random-number generators, the best checkpoint so far).
"""
