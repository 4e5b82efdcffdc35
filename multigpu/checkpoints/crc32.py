"""``torch.save`` without CRC-32s: torch.load never checks them, and a background write takes their CPU time from
training."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

_crc32_off = {"writes": 0, "before": True}
_crc32_lock = threading.Lock()


@contextlib.contextmanager
def without_crc32() -> Iterator[None]:
    """Within the block, ``torch.save`` writes no CRC-32s (torch's switch is global: other threads' saves neither)."""
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
