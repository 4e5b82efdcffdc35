"""``python -m multigpu.consolidate DIR OUT.ckpt`` (multigpu/checkpoints/consolidate.py): a folder that is no sharded
checkpoint
is refused. The consolidation of a trained fsdp2 run is tested in tests/strategies/test_model_parallel.py, on that
module's shared runs."""

from __future__ import annotations

from multigpu.checkpoints.consolidate import main as consolidate_main


def test_consolidate_refuses_a_folder_that_is_no_checkpoint(tmp_path, capsys):
    assert consolidate_main([str(tmp_path), str(tmp_path / "out.ckpt")]) == 2
    error = capsys.readouterr().err
    assert "not a complete sharded checkpoint" in error and "Fix:" in error
    assert not (tmp_path / "out.ckpt").exists()
