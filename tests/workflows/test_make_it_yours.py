"""``python scripts/make_it_yours.py`` on a copy of the project with a user's package: the examples go, and the
user's model trains, lints, measures, and its tests import and pass a smoke subset there (README "Make it yours",
step 1)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from tests import prewarmed
from tests.conftest import REPO

USER_PACKAGE = textwrap.dedent(
    '''
    """A user's project, written outside the template: a plain LightningModule and LightningDataModule."""

    import lightning as L
    import torch
    from torch import Tensor, nn
    from torch.utils.data import DataLoader, TensorDataset


    class Regressor(L.LightningModule):
        """A small network fitting a linear map."""

        def __init__(self, hidden: int = 16, lr: float = 0.05) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 1))

        def forward(self, x: Tensor) -> Tensor:
            return self.net(x)

        def training_step(self, batch: list[Tensor], batch_idx: int) -> Tensor:
            x, y = batch
            loss = nn.functional.mse_loss(self(x), y)
            self.log("train/mse", loss)
            return loss

        def validation_step(self, batch: list[Tensor], batch_idx: int) -> None:
            x, y = batch
            self.log("val/loss", nn.functional.mse_loss(self(x), y))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


    class RegressionData(L.LightningDataModule):
        """Noisy-free linear targets of random inputs; the last 64 samples validate."""

        def __init__(self, batch_size: int = 16, size: int = 256) -> None:
            super().__init__()
            self.batch_size = batch_size
            self.size = size

        def setup(self, stage: str) -> None:
            x = torch.randn(self.size, 4, generator=torch.Generator().manual_seed(0))
            y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
            self.train_set = TensorDataset(x[:-64], y[:-64])
            self.val_set = TensorDataset(x[-64:], y[-64:])

        def train_dataloader(self) -> DataLoader:
            return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

        def val_dataloader(self) -> DataLoader:
            return DataLoader(self.val_set, batch_size=self.batch_size)
    '''
).lstrip()
EXAMPLES = [
    "src/models/image_classifier.py",
    "src/models/gpt.py",
    "src/data/images.py",
    "src/data/text.py",
    "src/data/corpus.py",
    "configs/experiment",
    "tests/examples",
    "tests/workflows/test_make_it_yours.py",
]


def copy_project(target: Path) -> Path:
    """The project's files as a clone would have them: tracked and not ignored (none of .venv, runs, caches)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: everything but what runs leave behind
        skipped = {".git", ".venv", "venv", "runs", "data", "wandb", "lightning_logs"}

        def ignore(folder: str, names: list[str]) -> list[str]:
            top = Path(folder) == REPO
            return [n for n in names if (top and n in skipped) or n in ("__pycache__", ".pytest_cache", ".ruff_cache")]

        return Path(shutil.copytree(REPO, target, ignore=ignore))
    for relative in filter(None, listed.split("\0")):
        if (REPO / relative).is_file():
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / relative, target / relative)
    return target


def run(copy: Path, *command: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """A command in the copy, which alone is on the path (the installed template points at this checkout)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PL_", "WANDB_"))}
    env.update(PYTHONPATH=str(copy), WANDB_MODE="offline", PYTHONWARNINGS="ignore::DeprecationWarning")
    return prewarmed.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_make_it_yours_leaves_a_project_that_trains_lints_and_passes_its_tests(tmp_path):
    copy = copy_project(tmp_path / "project")
    (copy / "my_project").mkdir()
    (copy / "my_project" / "__init__.py").write_text(USER_PACKAGE)
    script = [sys.executable, "scripts/make_it_yours.py"]
    model, data = "--model=my_project.Regressor", "--data=my_project.RegressionData"

    # a class of the examples cannot stay the default once they are gone: refused, nothing changed
    before = tree(copy)
    refused = run(copy, *script, "--model=src.models.ImageClassifier", data)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.startswith("error: --model=src.models.ImageClassifier cannot be imported")
    assert "nothing was changed" in refused.stderr and "Fix:" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert tree(copy) == before

    done = run(copy, *script, model, data)
    assert done.returncode == 0, done.stdout + done.stderr
    for relative in EXAMPLES:
        assert not (copy / relative).exists(), relative
        assert f"removed  {relative}" in done.stdout, done.stdout
    assert "changed  configs/default.yaml" in done.stdout and "changed  README.md" in done.stdout
    # where `src` resolves in the copy (the installed template points at this checkout); finding the module's file
    # imports only the package's one-line __init__, not torch
    locate = "import importlib.util as u; print(u.find_spec('src.models').origin)"
    source = run(copy, sys.executable, "-c", locate)
    assert source.stdout.strip() == str(copy / "src" / "models" / "__init__.py"), source.stderr
    default = yaml.safe_load((copy / "configs" / "default.yaml").read_text())
    assert default["model"] == {"class_path": "my_project.Regressor"}
    assert default["data"] == {"class_path": "my_project.RegressionData"}
    assert default["trainer"]["max_epochs"] == 2 and default["checkpoint"]["monitor"] == "val/loss"
    for text in (copy / "README.md").read_text(), (copy / "slurm" / "README.md").read_text():
        assert "<!--" not in text and "configs/experiment" not in text and "image_classifier" not in text
    for script_name in ("gpu.sbatch", "multi_node.sbatch"):  # their default config is now configs/default.yaml
        sbatch = (copy / "slurm" / script_name).read_text()
        assert 'CONFIG="${CONFIG-}"' in sbatch and "experiment" not in sbatch
        assert run(copy, "bash", "-n", f"slurm/{script_name}").returncode == 0

    again = run(copy, *script, model, data)
    assert again.returncode == 2 and "the examples are already removed" in again.stderr, again.stderr

    fit = run(copy, sys.executable, "-m", "src.cli", "fit", "--trainer.max_steps=4", "--progress_bar=none")
    assert fit.returncode == 0, fit.stdout[-3000:] + fit.stderr[-3000:]
    run_dir = copy / "runs" / "default"
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 4
    saved = yaml.safe_load((run_dir / "logs" / "version_0" / "config.yaml").read_text())
    assert saved["model"]["class_path"] == "my_project.Regressor"
    shutil.rmtree(copy / "runs")

    # the benchmark, whose built-in workloads were the examples: it says so, and measures the user's classes
    bench = [sys.executable, "-m", "benchmarks", "--quick", "--startup-repeats=0", "--no-plots"]
    alone = run(copy, *bench)
    assert alone.returncode == 2 and "were removed" in alone.stderr and "--model=PKG.Class" in alone.stderr
    assert f"python -m benchmarks --quick {model} {data}" in done.stdout
    out = tmp_path / "bench"
    measured = run(copy, *bench, model, data, "--strategies=single", "--steps=2", "--warmup=1", f"--out={out}")
    assert measured.returncode == 0, measured.stdout[-3000:] + measured.stderr[-3000:]
    rows = {row["strategy"]: row for row in json.loads((out / "results.json").read_text())["rows"]}
    assert {rows[s]["status"] for s in ("single", "bare-lightning")} == {"ok"} and rows["single"]["samples_per_s"] > 0
    assert rows["single"]["workload"] == "Regressor" and rows["plain-loop"]["status"].startswith("n/a")

    lint = run(copy, sys.executable, "-m", "ruff", "check", ".")
    assert lint.returncode == 0, lint.stdout + lint.stderr

    # every test left in the copy still imports (pytest collects them all: none needs a removed example), and a
    # smoke subset passes there; the whole fast suite runs in this checkout, where the same files are. One process
    # (-n0): pytest-xdist's workers would take longer to start than the subset takes to run
    smoke = "test_cli.py or test_architecture.py or test_sampling.py"
    tests = run(copy, sys.executable, "-m", "pytest", "tests", "-m", "not slow and not slurm", "-k", smoke, "-q",
                "-n0", "-p", "no:cacheprovider")  # fmt: skip
    assert tests.returncode == 0, tests.stdout[-6000:] + tests.stderr[-3000:]
    summary = tests.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "error" not in summary and "deselected" in summary, tests.stdout[-3000:]
