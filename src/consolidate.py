"""``python -m src.consolidate DIR OUT.ckpt``: the engine's ``python -m multigpu.consolidate``, under this project."""

from multigpu.consolidate import consolidate, main

__all__ = ["consolidate", "main"]

if __name__ == "__main__":
    raise SystemExit(main())
