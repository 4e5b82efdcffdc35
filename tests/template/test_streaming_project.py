"""The stub project as a user makes it their own: its data replaced by LitData's, written as LitData's README writes
it (``litdata.optimize`` into chunks, ``StreamingDataset(dir, shuffle=True, drop_last=True)`` in a
``StreamingDataLoader`` with one worker), its model by an ordinary small Lightning model with dropout, its tests'
arguments and refusal by theirs. Then the project's own test command runs its four proofs through
``python -m src.cli fit``: it trains, a stopped run resumes bit for bit, a bad option gets one paragraph; and the
proof that ddp trains the one-process model fails, because LitData shares its samples out by the number of
processes, and says so."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.template.conftest import run

pytestmark = [pytest.mark.xdist_group("template"), pytest.mark.extended, pytest.mark.slow]

DATA = '''"""The project's data: samples written into LitData chunks, streamed by LitData's own loader."""

from __future__ import annotations

import lightning as L
import torch
from litdata import StreamingDataLoader, StreamingDataset, optimize

from multigpu import ConfigurationError

FEATURES = 4


def make_sample(index: int) -> dict:
    x = torch.randn(FEATURES, generator=torch.Generator().manual_seed(index))
    return {"index": index, "x": x, "y": x.sum().sin().reshape(1)}


def write(output_dir: str, samples: int = 64) -> None:
    """Write the chunks once, before training: ``python -c "from src.data.data import write; write('chunks')"``."""
    optimize(fn=make_sample, inputs=list(range(samples)), output_dir=output_dir, chunk_bytes="2KB", num_workers=1)


class Data(L.LightningDataModule):
    def __init__(self, input_dir: str = "chunks", batch_size: int = 4, num_workers: int = 1) -> None:
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage: str | None = None) -> None:
        if self.hparams.batch_size < 1:
            raise ConfigurationError(
                f"--data.init_args.batch_size={self.hparams.batch_size} is no batch. Fix: e.g. --data.batch_size=4."
            )

    def train_dataloader(self) -> StreamingDataLoader:
        dataset = StreamingDataset(self.hparams.input_dir, shuffle=True, drop_last=True)
        return StreamingDataLoader(dataset, batch_size=self.hparams.batch_size, num_workers=self.hparams.num_workers)
'''

MODEL = '''"""The project's model: a small regression network with dropout."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn


class Model(L.LightningModule):
    def __init__(self, features: int = 4, hidden: int = 16, dropout: float = 0.0, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.Tanh(), nn.Dropout(dropout), nn.Linear(hidden, 1))

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = F.mse_loss(self.net(batch["x"].to(self.dtype)), batch["y"].to(self.dtype))
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
'''

CONFTEST = """import pytest


@pytest.fixture
def project_args() -> list[str]:
    return ["--data.input_dir={chunks}", "--data.batch_size=4", "--model.hidden=16"]
"""

#: the project's four proofs (its tests/test_model.py, as the template wrote them)
PROOFS = {
    "test_it_trains": "passed",
    "test_ddp_on_two_processes_trains_the_one_process_model": "failed",
    "test_a_stopped_run_resumes_exactly": "passed",
    "test_a_bad_option_gets_one_paragraph": "passed",
}


@pytest.fixture
def streaming_project(projects: dict[str, Path], tmp_path: Path) -> Path:
    """The stub project copied, its data, model, tests' arguments and refusal replaced; its chunks written."""
    pytest.importorskip("litdata", reason="needs LitData: pip install --no-deps litdata (docs/data.md)")
    root = tmp_path / "my-stream"
    shutil.copytree(projects["stub"], root, ignore=shutil.ignore_patterns("runs", "__pycache__"))
    (root / "src" / "data" / "data.py").write_text(DATA)
    (root / "src" / "models" / "model.py").write_text(MODEL)
    (root / "tests" / "conftest.py").write_text(CONFTEST.format(chunks=root / "chunks"))
    proofs = root / "tests" / "test_model.py"
    refusal = 'project.assert_refuses("--data.batch_size=0", option="--data.init_args.batch_size=0")'
    proofs.write_text(re.sub(r"project\.assert_refuses\(.*\)", refusal, proofs.read_text()))
    run(sys.executable, "-c", "from src.data.data import write; write('chunks')", cwd=root)
    return root


def test_a_project_streaming_litdata_passes_its_proofs_but_the_ddp_one_which_names_litdatas_sharding(
    streaming_project: Path,
) -> None:
    tests = run(sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "tests/test_model.py",
                cwd=streaming_project, check=False, timeout=900)  # fmt: skip
    output = tests.stdout + tests.stderr
    found = re.findall(r"^(PASSED|FAILED) tests/test_model\.py::(\w+)", output, re.MULTILINE)
    outcomes = {name: outcome.lower() for outcome, name in found}
    assert outcomes == PROOFS, output[-6000:]
    # the reason: LitData's sharding by the number of processes, not a bare weight difference
    reason = " ".join(line for line in output.splitlines() if line.startswith("E "))
    assert "LitData" in reason and "number" in reason, output[-6000:]
