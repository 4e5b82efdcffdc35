"""Turn a sharded checkpoint (a folder written under ``fsdp2`` or ``tensor_parallel``) into one ``.ckpt`` file.

Usage::

    python -m multigpu.consolidate runs/NAME/checkpoints/last.ckpt model.ckpt

(a project re-exports it as its own ``python -m <package>.consolidate``; usage and errors name the one that runs)

The file is what a one-device or ddp run writes (the whole ``state_dict``, optimizer states keyed by parameter
position, the loops' state), so any strategy, any script and ``torch.load`` read it. The runs themselves need no
conversion: ``validate``/``test``/``predict`` and ddp read a sharded folder directly, and ``fsdp2`` /
``tensor_parallel`` resume from it. Consolidating needs the whole model and optimizer state in host memory.

The folder is checked before any of it is read (``multigpu/checkpoints/safe.py``): one from elsewhere runs no code; one
that holds more than tensors and torch's checkpoint metadata, or is incomplete, is refused in one paragraph (exit
status 2).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from multigpu.checkpoints.files import atomic_torch_save
from multigpu.checkpoints.sharded import load_sharded_checkpoint
from multigpu.command import running_program
from multigpu.errors import ConfigurationError
from multigpu.errors.reporting import report


def consolidate(folder: str | Path, output: str | Path) -> Path:
    """Write the single-file checkpoint of sharded ``folder`` to ``output`` (atomically); return ``output``."""
    output = Path(output)
    atomic_torch_save(load_sharded_checkpoint(folder), output)
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=running_program(main, default="python -m multigpu.consolidate"),
        description="Write one .ckpt file from a sharded checkpoint folder (fsdp2, tensor_parallel, pipeline).",
    )
    parser.add_argument("folder", type=Path, help="the sharded checkpoint, e.g. runs/NAME/checkpoints/last.ckpt")
    parser.add_argument("output", type=Path, help="the single file to write, e.g. model.ckpt")
    args = parser.parse_args(argv)
    if args.output.resolve() == args.folder.resolve():
        parser.error("OUTPUT must differ from FOLDER: the folder is read while the file is written.")
    try:
        consolidate(args.folder, args.output)
    except ConfigurationError as error:  # a folder that is incomplete, damaged or holds more than tensors
        return report(error)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
