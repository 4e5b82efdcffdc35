"""The example workloads' tests (the image classifier and the GPT): their small settings and a fake CIFAR-10.

Everything under tests/examples/ belongs to the examples (src/models/image_classifier.py, src/models/gpt.py,
src/data/images.py, text.py, corpus.py, configs/experiment/): deleting them means deleting this folder too.
"""

from __future__ import annotations

import pickle
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from multigpu.testing import Project
from tests import prewarmed
from tests.conftest import REPO, cli_env, cli_runner

#: the examples' command line: this repository's project, as its users run it
CLI_MODULE = "src.cli"

#: the examples' presets
EXPERIMENTS = REPO / "configs" / "experiment"

# The examples' own settings, so that a project's configs/default.yaml (its own model, seed, trainer options)
# changes none of these runs: the image tests start from the image preset, the GPT tests name all they rely on.

#: a small but complete image workload: a few seconds per run on a 2-core CPU
TINY_IMAGE = [
    "--config",
    str(EXPERIMENTS / "image_synthetic.yaml"),
    "--trainer.accelerator=cpu",
    "--trainer.enable_model_summary=false",
    "--model.init_args.widths=[8,16]",
    "--data.init_args.synthetic_train_size=512",
    "--data.init_args.synthetic_val_size=128",
    "--data.init_args.batch_size=32",
]
#: the small GPT and its data, as configs/experiment/gpt.yaml is shrunk by the tests that start from it
TINY_GPT_MODEL = [
    "--trainer.accelerator=cpu",
    "--trainer.enable_model_summary=false",
    "--model=src.models.CausalLanguageModel",
    "--model.init_args.n_layer=2",
    "--model.init_args.n_head=2",
    "--model.init_args.n_embd=32",
    "--model.init_args.block_size=32",
    "--data=src.data.TextDataModule",
    "--data.init_args.block_size=32",
    "--data.init_args.corpus_chars=40000",
    "--data.init_args.batch_size=16",
    "--checkpoint.monitor=val/loss",
    "--checkpoint.mode=min",
]
#: the small GPT with the seed and trainer settings of its tests: 2 epochs at most, no clipping, no accumulation
TINY_GPT = [
    *TINY_GPT_MODEL,
    "--seed_everything=42",
    "--trainer.max_epochs=2",
    "--trainer.max_steps=-1",
    "--trainer.gradient_clip_val=null",
    "--trainer.accumulate_grad_batches=1",
]


def write_cifar10(root: Path, per_file: int = 20) -> Path:
    """Write CIFAR-10's python format (pickled dicts of bytes keys) with ``per_file`` random images per batch."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    for offset, name in enumerate([f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]):
        data = torch.randint(0, 256, (per_file, 3072), generator=g, dtype=torch.uint8).numpy()
        labels = [(offset * per_file + i) % 10 for i in range(per_file)]
        with open(folder / name, "wb") as handle:
            pickle.dump({b"data": data, b"labels": labels, b"batch_label": name.encode()}, handle)
    return folder


@pytest.fixture
def run_cli() -> Callable[..., subprocess.CompletedProcess]:
    """``python -m src.cli ARGS`` in a subprocess (``tests.conftest.cli_runner``)."""
    return cli_runner(CLI_MODULE)


@pytest.fixture
def project(tmp_path: Path, project_args: list[str]) -> Project:
    """The engine's ``project`` fixture on this repository's project (``python -m src.cli``)."""
    return Project(REPO, tmp_path, project_args, cli=CLI_MODULE, env=cli_env(), runner=prewarmed.run)
