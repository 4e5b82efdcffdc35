"""``python -m src.consolidate DIR OUT.ckpt``: the command of ``src/checkpoints/consolidate.py``, kept short."""

from src.checkpoints.consolidate import consolidate, main

__all__ = ["consolidate", "main"]

if __name__ == "__main__":
    raise SystemExit(main())
