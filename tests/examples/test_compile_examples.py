"""``--compile=true`` on the example workloads under ddp: the forward is compiled, and nothing recompiles."""

from __future__ import annotations

import pytest
import torch

from tests.examples.conftest import EXPERIMENTS, TINY_GPT_MODEL, TINY_IMAGE

WORKLOADS = {
    # the ResNet's steps update torchmetrics objects: a compiled step recompiled on each update until torch's limit
    "image": ("ImageClassifier", TINY_IMAGE),
    "gpt": ("CausalLanguageModel", ["--config", str(EXPERIMENTS / "gpt.yaml"), *TINY_GPT_MODEL]),
}


@pytest.mark.slow  # about a minute each: inductor compiles in 2 processes
@pytest.mark.parametrize("workload", WORKLOADS)
def test_ddp_compile_of_an_example_prints_no_recompile_warning(workload, tmp_path, run_cli):
    model, args = WORKLOADS[workload]
    result = run_cli(
        "fit", *args, "--compile=true", "--trainer.max_steps=12", "--trainer.val_check_interval=6",
        "--trainer.limit_val_batches=4", "--trainer.strategy=ddp", "--trainer.devices=2", "--progress_bar=none",
        f"--trainer.default_root_dir={tmp_path}",
    )  # fmt: skip
    assert f"compiling {model}.forward with torch.compile (backend inductor)" in result.stderr
    assert "recompile" not in result.stderr.lower()
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 12
