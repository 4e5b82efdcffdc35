"""A stopped and resumed fp32 run ends with the same weights as an uninterrupted one, dropout on (fp64 and every
stop point: tests/faults/test_preemption.py; the examples' learning tests are in tests/examples/)."""

import pytest
import torch

from tests.cli import main
from tests.conftest import TINY, load_state


@pytest.mark.slow
def test_stopped_and_resumed_fp32_run_ends_with_the_same_weights(tmp_path):
    """Stop at step 11 (mid-epoch, via the preemption signal), resume, compare at step 40 (2.5 epochs): exact."""
    common = [*TINY, "--trainer.precision=32-true", "--trainer.max_steps=40", "--progress_bar=none",
              "--trainer.val_check_interval=8", "--model.init_args.dropout=0.2"]  # fmt: skip
    main(["fit", *common, f"--trainer.default_root_dir={tmp_path / 'straight'}"])
    stopped = tmp_path / "stopped"
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *common, f"--trainer.default_root_dir={stopped}",
              "--trainer.callbacks+=tests.helpers.SignalAtStep", "--trainer.callbacks.step=11"])  # fmt: skip
    assert exit_info.value.code == 75
    assert torch.load(stopped / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 11
    main(["fit", *common, f"--trainer.default_root_dir={stopped}", "--ckpt_path=last"])
    straight = load_state(tmp_path / "straight" / "checkpoints" / "last.ckpt")
    resumed = load_state(stopped / "checkpoints" / "last.ckpt")
    for key in straight:  # tolerance: none, the same operations on the same data in the same order
        assert torch.equal(straight[key], resumed[key]), key
