"""Turn a sharded checkpoint (a folder written under ``fsdp2`` or ``tensor_parallel``) into one ``.ckpt`` file.

Usage::

    python -m src.consolidate runs/gpt/checkpoints/last.ckpt gpt.ckpt

The folder holds one shard file per rank (``torch.distributed.checkpoint``) and ``meta.pt``, Lightning's loop
and callback state. The single file is what a one-device or ddp run writes: the whole ``state_dict``, and
optimizer states keyed by parameter position as ``torch.optim`` saves them, so ``validate``/``test``/``predict``
on one device, or a ddp run (``--ckpt_path=gpt.ckpt``) read it. It needs the whole model and optimizer state in
host memory, once.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

#: the file ``ModelParallelStrategy`` writes next to the shards (Lightning's ``_METADATA_FILENAME``)
METADATA_FILE = "meta.pt"


def is_sharded_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a sharded checkpoint folder (shards plus ``meta.pt``)."""
    path = Path(path)
    return path.is_dir() and (path / METADATA_FILE).is_file() and (path / ".metadata").is_file()


def _optimizer_state_by_position(state: dict[str, Any]) -> dict[str, Any]:
    """``torch.distributed.checkpoint`` keys optimizer state by parameter name; ``Optimizer.load_state_dict``
    wants each parameter's position in the optimizer's groups, in order."""
    names = [name for group in state["param_groups"] for name in group["params"]]
    if not names or isinstance(names[0], int):
        return state
    position = {name: index for index, name in enumerate(names)}
    return {
        "state": {position[name]: value for name, value in state.get("state", {}).items()},
        "param_groups": [
            {**group, "params": [position[name] for name in group["params"]]} for group in state["param_groups"]
        ],
    }


def load_sharded_checkpoint(folder: str | Path) -> dict[str, Any]:
    """The whole checkpoint of a sharded folder, in the single-file layout (in this process, no process group)."""
    folder = Path(folder)
    if not is_sharded_checkpoint(folder):
        raise FileNotFoundError(
            f"{folder} is not a sharded checkpoint folder (shards, .metadata and {METADATA_FILE}). Fix: pass the"
            " folder a run under --trainer.strategy=fsdp2 or tensor_parallel saved, e.g. runs/NAME/checkpoints/"
            "last.ckpt."
        )
    with tempfile.TemporaryDirectory() as scratch:
        flat = Path(scratch) / "shards.pt"
        dcp_to_torch_save(folder, flat)  # torch's own converter: every shard read and joined
        checkpoint: dict[str, Any] = torch.load(flat, map_location="cpu", weights_only=False)
    checkpoint.update(torch.load(folder / METADATA_FILE, map_location="cpu", weights_only=False))
    optimizer_keys = sorted((k for k in checkpoint if re.fullmatch(r"optimizer_\d+", k)), key=lambda k: int(k[10:]))
    if optimizer_keys:
        checkpoint["optimizer_states"] = [_optimizer_state_by_position(checkpoint.pop(k)) for k in optimizer_keys]
    return checkpoint


def consolidate(folder: str | Path, output: str | Path) -> Path:
    """Write the single-file checkpoint of sharded ``folder`` to ``output`` (atomically); return ``output``."""
    from src.checkpoint_io import atomic_torch_save

    output = Path(output)
    atomic_torch_save(load_sharded_checkpoint(folder), output)
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m src.consolidate",
        description="Write one .ckpt file from a sharded checkpoint folder (fsdp2, tensor_parallel).",
    )
    parser.add_argument("folder", type=Path, help="the sharded checkpoint, e.g. runs/gpt/checkpoints/last.ckpt")
    parser.add_argument("output", type=Path, help="the single file to write, e.g. gpt.ckpt")
    args = parser.parse_args(argv)
    if args.output.resolve() == args.folder.resolve():
        parser.error("OUTPUT must differ from FOLDER: the folder is read while the file is written.")
    try:
        consolidate(args.folder, args.output)
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
