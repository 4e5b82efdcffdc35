"""``python -m multigpu.consolidate DIR OUT.ckpt``: one ``.ckpt`` file from a folder of shards."""

from multigpu.checkpoints.consolidate import consolidate, main

__all__ = ["consolidate", "main"]

if __name__ == "__main__":
    raise SystemExit(main())
