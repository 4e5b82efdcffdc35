"""The benchmark on a user's own model (``--model``/``--data``, ``--config``), and without the example workloads: it
runs this repository's project (``python -m src.cli``), whose examples a user's copy deletes."""

from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from benchmarks.runner import NO_PLAIN_BASELINE
from benchmarks.workloads import build_cli, named, user_workload
from tests import prewarmed
from tests.conftest import REPO, TINY_CONFIG, cli_env
from tests.fixtures.workload import gaussian_clusters

TINY_MODEL = "tests.fixtures.workload.TinyClassifier"
TINY_DATA = "tests.fixtures.workload.TinyData"
#: what a user's copy of the template lacks once the examples are deleted
EXAMPLE_MODULES = ("src.models.image_classifier", "src.models.gpt", "src.data.images", "src.data.text")
EXAMPLE_PATHS = ("src/models/image_classifier.py", "src/models/gpt.py", "src/data/images.py", "src/data/text.py")

#: runs `python -m benchmarks ARGS` with every example module unimportable, whether or not its file exists
BLOCKED_RUN = """
import importlib.abc, runpy, sys

class NoExamples(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in {blocked!r}:
            raise ImportError(f"{{name}}: the examples were removed")
        return None

sys.meta_path.insert(0, NoExamples())
import benchmarks.bare, benchmarks.plain, benchmarks.plots, benchmarks.report, benchmarks.runner, benchmarks.workloads
sys.argv = ["python -m benchmarks", *sys.argv[1:]]
runpy.run_module("benchmarks", run_name="__main__")
"""


class PerProcessData(L.LightningDataModule):
    """A plain LightningDataModule: its ``batch_size`` is per process, as Lightning's own convention has it."""

    def __init__(self, batch_size: int = 16) -> None:
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(gaussian_clusters(64, 16, 4, seed=0, split=0), batch_size=self.batch_size)


def test_bench_imports_and_prints_its_help_without_the_example_modules():
    """The benchmark's modules and `--help` import none of the examples (a user's copy may have deleted them)."""
    script = BLOCKED_RUN.format(blocked=set(EXAMPLE_MODULES))
    result = prewarmed.run(
        [sys.executable, "-c", script, "--help"], cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--model PKG.Class" in result.stdout and "--config FILE" in result.stdout


def _copy_without_examples(target: Path) -> Path:
    """The repository's code and configs, as a user's copy is once the example workloads are deleted."""
    ignore = shutil.ignore_patterns("__pycache__")
    for folder in ("src", "benchmarks", "configs"):
        shutil.copytree(REPO / folder, target / folder, ignore=ignore)
    for path in EXAMPLE_PATHS:
        (target / path).unlink(missing_ok=True)  # a copy made it yours has none of them already
    shutil.rmtree(target / "configs" / "experiment", ignore_errors=True)
    return target


#: ``benchmarks.__main__.entry`` called with each argument list in one process (one start-up instead of one per
#: command): prints each call's exit status and stderr as JSON
ENTRIES = """
import contextlib, io, json, sys
from benchmarks.__main__ import entry

results = []
for args in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            code = entry(args)
        except SystemExit as stop:  # --help
            code = stop.code
    results.append({"code": code, "stderr": err.getvalue(), "stdout": out.getvalue()})
print(json.dumps(results))
"""


def test_without_the_examples_bench_says_they_were_removed_and_how_to_name_a_model(tmp_path):
    copy = _copy_without_examples(tmp_path / "project")
    env = cli_env(PYTHONPATH=str(copy))  # the copy alone: nothing from this repository is importable
    calls = [["--help"], [], ["--quick"], ["--workload=gpt"]]
    out = f"--out={tmp_path / 'out'}"
    command = [sys.executable, "-c", ENTRIES, json.dumps([[*args, out] for args in calls])]
    ran = prewarmed.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-3000:]
    helped, *refused, named_removed = json.loads(ran.stdout.strip().splitlines()[-1])
    assert helped["code"] == 0 and "--model PKG.Class" in helped["stdout"], helped
    for result in refused:
        assert result["code"] == 2, result
        message = result["stderr"].strip()
        assert "\n" not in message  # one paragraph
        assert "built-in workloads" in message and "were removed" in message and "src/models/gpt.py" in message
        assert "Fix:" in message and "--model=PKG.Class --data=PKG.Class" in message and "--config FILE" in message
    assert named_removed["code"] == 2 and "--workload gpt" in named_removed["stderr"]
    assert "configs/experiment/gpt.yaml" in named_removed["stderr"] and "Fix:" in named_removed["stderr"]
    assert not (tmp_path / "out").exists()  # nothing was run


def test_a_user_config_builds_its_own_model_and_data_not_the_default_configs():
    """``--config`` naming other classes than configs/default.yaml: their own defaults, none of the image's."""
    cli = build_cli(user_workload(None, None, [str(TINY_CONFIG)]), quick=True)
    workload = named(user_workload(None, None, [str(TINY_CONFIG)]), cli)
    assert workload.name == "TinyClassifier" and not workload.builtin and not workload.batch_per_process
    # the tiny data module's own sizes and the config's batch; the image data module's would be 128 and 5000
    assert cli.datamodule.batch_size == 32 and cli.datamodule.sizes["val"] == 128
    assert cli.model.configure_optimizers().defaults["lr"] == 0.01


def test_a_per_process_data_module_gets_the_global_batch_split_over_the_processes():
    """A plain LightningDataModule's batch_size is per process: each row gets global batch / processes."""
    flags = (TINY_MODEL, f"{__name__}.PerProcessData", None)
    cli = build_cli(user_workload(*flags), quick=True)
    workload = named(user_workload(*flags), cli)
    assert workload.batch_per_process and cli.datamodule.batch_size == 16
    assert workload.data_batch_size(32, processes=2) == 16 and workload.data_batch_size(32, processes=1) == 32
    assert torch.is_tensor(next(iter(cli.datamodule.train_dataloader()))[0])


def test_a_data_module_without_batch_size_is_refused_with_the_fix(tmp_path, capsys):
    from benchmarks.__main__ import entry

    boring = "lightning.pytorch.demos.boring_classes.BoringDataModule"  # takes no batch_size
    code = entry(["--quick", f"--model={TINY_MODEL}", f"--data={boring}", f"--out={tmp_path / 'out'}"])
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and "BoringDataModule has no batch_size argument" in message and "Fix:" in message
    assert not (tmp_path / "out").exists()  # nothing was run


def _read_rows(out: Path) -> dict[str, dict[str, str]]:
    with open(out / "results.csv") as handle:
        return {row["strategy"]: row for row in csv.DictReader(handle)}


@pytest.mark.slow
@pytest.mark.extended
def test_quick_benchmark_of_a_user_model(tmp_path):
    """single, dp, ddp and bare Lightning measured on the user's model given as classes, every multi-process row
    on 2 processes, with the model state each rank holds; plain PyTorch says n/a, and so does tensor_parallel (the
    model has no configure_model plan). (A model named by ``--config`` builds the same workload:
    test_a_user_config_builds_its_own_model_and_data_not_the_default_configs.)"""
    workload, devices = ["--model", TINY_MODEL, "--data", TINY_DATA], 2
    command = [sys.executable, "-m", "benchmarks", "--quick", *workload, "--strategies=single,dp,ddp,tensor_parallel"]
    command += [f"--devices={devices}", "--steps=3", "--warmup=1", "--startup-repeats=0", "--no-plots"]
    result = prewarmed.run(
        [*command, f"--out={tmp_path}"], cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]

    rows = _read_rows(tmp_path)
    measured = {"single", "dp", "ddp", "bare-lightning", "bare-lightning-ddp"}
    plain = {"plain-loop", "plain-ddp"}
    assert set(rows) == measured | plain | {"tensor_parallel"}
    assert rows["tensor_parallel"]["status"].startswith("n/a: TinyClassifier has no configure_model hook")
    assert rows["tensor_parallel"]["samples_per_s"] == ""  # refused, not run
    # every rank of these rows holds the whole model, its gradients and AdamW's two moments
    net = build_cli(user_workload(TINY_MODEL, TINY_DATA, None), quick=True).model
    parameters_mb = sum(p.numel() * p.element_size() for p in net.parameters()) / 1e6
    for strategy in measured:
        assert float(rows[strategy]["parameters_mb_per_rank"]) == pytest.approx(parameters_mb, rel=1e-6)
        assert float(rows[strategy]["state_mb_per_rank"]) == pytest.approx(4 * parameters_mb, rel=1e-6)
    for strategy in measured:
        row = rows[strategy]
        assert row["workload"] == "TinyClassifier" and row["status"] == "ok", row
        assert float(row["samples_per_s"]) > 0 and row["tokens_per_s"] == ""  # samples/s only for a user's model
    assert int(rows["ddp"]["processes"]) == devices and int(rows["ddp"]["per_process_batch"]) == 32 // devices
    assert rows["ddp"]["same_loss_as_bare"] == "True"
    for strategy in plain:
        assert rows[strategy]["status"] == NO_PLAIN_BASELINE and rows[strategy]["samples_per_s"] == ""
    # bare Lightning trains the user's own module and data: the same losses as the template's rows
    assert rows["single"]["same_loss_as_bare"] == "True"
    assert rows["single"]["plain_key"] == "" and rows["single"]["overhead_vs_bare_ms_per_step"] != ""

    report = (tmp_path / "results.md").read_text()
    assert report.count(NO_PLAIN_BASELINE) == len(plain) and "| TinyClassifier | bare Lightning |" in report
    assert f"workload TinyClassifier: {TINY_MODEL} on {TINY_DATA}" in report
    # the figures, without verdicts: the project's targets are stated in docs/benchmarks.md only
    assert "the template over bare Lightning" in report and "the target" not in report
