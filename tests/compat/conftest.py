"""The fixture the compatibility seam's tests share: a real one-process group."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch.distributed as dist


@pytest.fixture
def one_process_group(tmp_path) -> Iterator[None]:
    """A real (gloo, one process) default process group, as under ddp."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
