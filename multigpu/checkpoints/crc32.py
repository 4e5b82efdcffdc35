"""Checkpoints written without CRC-32s: torch's archives hold a CRC-32 of each member, which torch.load never
checks (a flipped bit loads as a wrong value either way), and computing them is CPU time a background write takes
from training where the cores are busy."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

#: the engine's writes under way without CRC-32s, and torch's setting before the first of them
_crc32_off = {"writes": 0, "before": True}
_crc32_lock = threading.Lock()


@contextlib.contextmanager
def without_crc32() -> Iterator[None]:
    """Within the block, ``torch.save`` writes no CRC-32 of the archive's members. torch.load never checks them, and
    computing them took 60 ms of CPU per 124 MiB checkpoint, which a background write takes from training where the
    cores are busy (``scripts/checkpoint_stall.py``: 1.48x the run without checkpoints with them, 1.30x without).
    torch's switch is global: a ``torch.save`` of another thread while an engine write is under way writes none
    either; the setting before the first write comes back after the last."""
    with _crc32_lock:
        if _crc32_off["writes"] == 0:
            _crc32_off["before"] = torch.serialization.get_crc32_options()
            torch.serialization.set_crc32_options(False)
        _crc32_off["writes"] += 1
    try:
        yield
    finally:
        with _crc32_lock:
            _crc32_off["writes"] -= 1
            if _crc32_off["writes"] == 0:
                torch.serialization.set_crc32_options(_crc32_off["before"])
