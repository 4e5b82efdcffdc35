"""multigpu/callbacks/process_group.py: every rank destroys its process group at exit, once, after the run."""

from __future__ import annotations

import sys
import textwrap

from tests import prewarmed
from tests.conftest import REPO, cli_env

SCRIPT = textwrap.dedent(
    """
    import sys
    import torch.distributed as dist
    from multigpu.callbacks.process_group import DestroyProcessGroupAtExit

    dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}", rank=0, world_size=1)
    destroy = dist.destroy_process_group

    def counted():
        print("destroyed", flush=True)
        destroy()
        print("initialized after:", dist.is_initialized(), flush=True)

    dist.destroy_process_group = counted
    callback = DestroyProcessGroupAtExit()
    callback.setup(None, None, "fit")
    callback.setup(None, None, "validate")  # a second run in the same process: still destroyed once
    print("run ends", flush=True)
    """
)


def test_the_process_group_is_destroyed_once_at_exit_after_the_run(tmp_path):
    result = prewarmed.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "store")],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["run ends", "destroyed", "initialized after: False"]
