"""What a user expects and gets told: BatchNorm statistics under several processes, the order in which arguments
apply, presets on a machine that cannot run them, and what ``--compile`` compiles."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

from multigpu.errors import ConfigurationError
from multigpu.observe.run_plan import batch_norm_note
from multigpu.run.checks import check_sync_batchnorm
from multigpu.strategies import DataParallelStrategy
from multigpu.strategies.compile import CompileModel
from tests.cli import main
from tests.conftest import REPO, TINY, load_state, relative_difference
from tests.fixtures.batchnorm import BatchNormClassifier
from tests.fixtures.workload import TinyClassifier

BATCH_NORM = "--model=tests.fixtures.batchnorm.BatchNormClassifier"
CPU = torch.device("cpu")
TWO_GPUS = [torch.device("cuda", 0), torch.device("cuda", 1)]  # constructed only: no GPU is touched
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens on a machine without a GPU")


def plan_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "logs" / "version_0" / "run_plan.json").read_text())


def error_line(capsys: pytest.CaptureFixture[str], args: list[str]) -> str:
    """Run ``fit ARGS``, which must stop with exit status 2; return its one ``error:`` line."""
    with pytest.raises(SystemExit) as stopped:
        main(["fit", *args])
    assert stopped.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, errors
    assert "Fix: " in errors[0] and "Traceback" not in errors[0]
    return errors[0]


# -- BatchNorm: said, not silently different -------------------------------------------------------------------


@pytest.mark.slow  # about 40 s: a ddp run with 2 processes
def test_batchnorm_under_ddp_is_reported_and_does_train_another_model(tmp_path, run_cli, capsys):
    common = [*TINY, BATCH_NORM, "--trainer.precision=64-true", "--trainer.max_steps=8", "--progress_bar=none"]
    main(["fit", *common, f"--trainer.default_root_dir={tmp_path / 'one'}"])
    one_printed = capsys.readouterr().out
    ddp = run_cli(
        "fit",
        *common,
        "--trainer.strategy=ddp",
        "--trainer.devices=2",
        f"--trainer.default_root_dir={tmp_path / 'ddp'}",
    )

    said = plan_of(tmp_path / "ddp")["batch_norm"]
    assert said.startswith("1 BatchNorm layer(s) normalise each process's micro-batch of 16 samples, not the 32")
    assert "this run does not train the same model as one device" in said
    assert "Fix: --trainer.sync_batchnorm=true (it needs GPUs;" in said
    assert any(line.split()[:1] == ["batch_norm"] and said in line for line in ddp.stdout.splitlines())

    one = plan_of(tmp_path / "one")["batch_norm"]
    assert one == "1 BatchNorm layer(s), statistics over each batch of 32 samples, as on one device"
    assert "does not train" not in one_printed and one in one_printed

    # what the plan says is true: the same data, seed and global batch end in other weights (without BatchNorm the
    # two agree to 1e-10 in fp64, tests/strategies/test_same_model.py)
    one_state, ddp_state = (
        {key: value for key, value in load_state(tmp_path / run / "checkpoints" / "last.ckpt").items() if "net." in key}
        for run in ("one", "ddp")
    )
    assert relative_difference(one_state, ddp_state) > 1e-6
    assert not torch.equal(one_state["net.1.running_mean"], ddp_state["net.1.running_mean"])


def test_plan_without_batchnorm_says_nothing_and_names_each_case():
    ddp_cpu = SimpleNamespace(world_size=2, strategy=SimpleNamespace(root_device=CPU))
    assert batch_norm_note(ddp_cpu, TinyClassifier(), 16) is None

    ddp_gpu = SimpleNamespace(world_size=4, strategy=SimpleNamespace(root_device=torch.device("cuda", 0)))
    note = batch_norm_note(ddp_gpu, BatchNormClassifier(), 8)
    assert "micro-batch of 8 samples, not the 32 one device normalises" in note
    assert note.endswith("Fix: --trainer.sync_batchnorm=true")

    synced = torch.nn.SyncBatchNorm.convert_sync_batchnorm(BatchNormClassifier())
    assert batch_norm_note(ddp_gpu, synced, 8) == (
        "1 BatchNorm layer(s), synchronised over the 4 processes (--trainer.sync_batchnorm=true), as on one device"
    )

    dp = SimpleNamespace(world_size=1, strategy=DataParallelStrategy(parallel_devices=TWO_GPUS))
    note = batch_norm_note(dp, BatchNormClassifier(), 32)
    assert "normalise each GPU's chunk of the batch (about 16 of 32 samples)" in note
    assert "only the first GPU's chunk updates the running statistics" in note
    assert "--trainer.sync_batchnorm does not apply under dp" in note
    assert note.endswith("Fix: --trainer.strategy=ddp --trainer.sync_batchnorm=true")

    dp_on_cpu = SimpleNamespace(world_size=1, strategy=DataParallelStrategy(parallel_devices=[CPU, CPU]))
    assert batch_norm_note(dp_on_cpu, BatchNormClassifier(), 32).endswith("as on one device")


def test_sync_batchnorm_on_cpu_processes_is_refused_before_launch(tmp_path, capsys):
    error = error_line(capsys, [*TINY, BATCH_NORM, "--trainer.strategy=ddp", "--trainer.devices=2",
                                "--trainer.sync_batchnorm=true", f"--trainer.default_root_dir={tmp_path}"])  # fmt: skip
    assert error.startswith("error: --trainer.sync_batchnorm=true cannot run on CPU processes: torch's SyncBatchNorm")
    assert "BatchNormClassifier has 1 BatchNorm layer(s), e.g. net.1" in error
    assert "Fix: drop --trainer.sync_batchnorm" in error and "--trainer.devices=1" in error
    assert not tmp_path.exists() or not any(tmp_path.iterdir())  # nothing written, no process started


def test_sync_batchnorm_in_one_cpu_process_trains_the_one_device_model(tmp_path):
    # one process has no other to synchronise with: Lightning leaves BatchNorm as it is, which is exact
    main(["fit", *TINY, BATCH_NORM, "--trainer.sync_batchnorm=true", "--trainer.max_steps=2", "--progress_bar=none",
          f"--trainer.default_root_dir={tmp_path}"])  # fmt: skip
    assert plan_of(tmp_path)["batch_norm"].endswith("as on one device")
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 2


def test_sync_batchnorm_is_checked_only_where_it_would_fail_or_be_ignored():
    dp = SimpleNamespace(strategy=DataParallelStrategy(parallel_devices=TWO_GPUS))
    with pytest.raises(ConfigurationError, match=re.escape("has no effect under --trainer.strategy=dp: it")):
        check_sync_batchnorm(BatchNormClassifier(), dp, True)
    ddp_cpu = SimpleNamespace(strategy=DDPStrategy(parallel_devices=[CPU, CPU]))
    with pytest.raises(ConfigurationError, match="cannot run on CPU processes"):
        check_sync_batchnorm(BatchNormClassifier(), ddp_cpu, True)
    check_sync_batchnorm(TinyClassifier(), ddp_cpu, True)  # nothing to synchronise: runs as without the flag
    check_sync_batchnorm(BatchNormClassifier(), ddp_cpu, False)
    check_sync_batchnorm(BatchNormClassifier(), SimpleNamespace(strategy=SingleDeviceStrategy(CPU)), True)


# -- arguments apply in order, a later one wins ------------------------------------------------------------------


def resolved(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    with pytest.raises(SystemExit) as stopped:
        main(["fit", *args, "--print_config"])
    assert stopped.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


def test_a_later_config_overrides_an_earlier_flag_and_a_later_flag_overrides_a_config(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)
    before = resolved(capsys, "--trainer.accelerator=cpu", "--config", "configs/trainer/dp.yaml")["trainer"]
    assert (before["accelerator"], before["devices"], before["strategy"]) == ("gpu", -1, "dp")
    after = resolved(capsys, "--config", "configs/trainer/dp.yaml", "--trainer.accelerator=cpu")["trainer"]
    assert (after["accelerator"], after["devices"], after["strategy"]) == ("cpu", -1, "dp")

    # environment variables come before every argument: a --config file overrides them too
    monkeypatch.setenv("PL_FIT__TRAINER__MAX_STEPS", "33")
    assert resolved(capsys)["trainer"]["max_steps"] == 33
    steps_file = tmp_path / "steps.yaml"
    steps_file.write_text("trainer:\n  max_steps: 600\n")
    assert resolved(capsys, "--config", str(steps_file))["trainer"]["max_steps"] == 600


def test_help_says_how_config_files_combine_with_flags(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "a --config file overrides the flags given before it" in text
    assert "Put --config files first and flags after them." in text


def test_a_flag_overridden_by_a_later_preset_is_named_in_the_error(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    error = error_line(capsys, ["--trainer.accelerator=cpu", "--config", "configs/trainer/dp.yaml"])
    assert error.startswith("error: --trainer.accelerator=gpu (set by configs/trainer/dp.yaml, with devices: -1 and")
    assert "overrides the earlier --trainer.accelerator=cpu: arguments apply in order and a later one wins" in error


# -- every trainer preset on this machine: it runs, or one paragraph says why not and what to do -----------------

QUICK = ["--trainer.max_steps=2", "--trainer.limit_val_batches=1", "--progress_bar=none"]
#: what each preset does on a machine without a GPU; the ones that need a GPU fail before anything starts
PRESETS_WITHOUT_A_GPU = {
    "cpu.yaml": "runs",
    "ddp_cpu.yaml": "runs",  # two processes: tests/workflows/test_configs.py trains with it
    "gpu.yaml": "needs a GPU",
    "dp.yaml": "needs a GPU",
    "ddp.yaml": "needs a GPU",
    "ddp_spawn.yaml": "needs a GPU",
    "multinode.yaml": "needs a GPU",
}


def test_every_trainer_preset_is_covered():
    assert {path.name for path in (REPO / "configs" / "trainer").glob("*.yaml")} == set(PRESETS_WITHOUT_A_GPU)


@NO_GPU
@pytest.mark.parametrize("preset", [name for name, outcome in PRESETS_WITHOUT_A_GPU.items() if outcome != "runs"])
def test_gpu_presets_name_themselves_and_the_fix(preset, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    path = f"configs/trainer/{preset}"
    error = error_line(capsys, [*TINY, "--config", path, *QUICK, f"--trainer.default_root_dir={tmp_path / 'run'}"])
    values = yaml.safe_load((REPO / path).read_text())["trainer"]
    assert error.startswith(f"error: --trainer.accelerator=gpu (set by {path}, with devices: {values['devices']}")
    assert "but PyTorch sees no CUDA GPU on this machine" in error
    assert f"Fix: leave out --config {path} to train on the CPU" in error
    assert not (tmp_path / "run").exists()


@NO_GPU
@pytest.mark.parametrize(
    ("preset", "fix"),
    [
        ("dp.yaml", "--trainer.devices=1 after --config configs/trainer/dp.yaml (one CPU process; dp on the CPU"),
        ("ddp.yaml", "--trainer.devices=2 after --config configs/trainer/ddp.yaml (two CPU processes"),
        ("ddp_spawn.yaml", "--trainer.devices=2 after --config configs/trainer/ddp_spawn.yaml (two CPU processes"),
    ],
)
def test_all_gpus_presets_on_the_cpu_ask_for_a_count(preset, fix, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    path = f"configs/trainer/{preset}"
    error = error_line(capsys, [*TINY, "--config", path, "--trainer.accelerator=cpu", *QUICK,
                                f"--trainer.default_root_dir={tmp_path / 'run'}"])  # fmt: skip
    assert error.startswith(f"error: --trainer.devices=-1 (set by {path}) means all GPUs, but the run is on the CPU")
    assert f"Fix: pass {fix}" in error
    assert not (tmp_path / "run").exists()


@NO_GPU
def test_the_fix_the_dp_preset_error_names_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    main(["fit", *TINY, "--config", "configs/trainer/dp.yaml", "--trainer.accelerator=cpu", "--trainer.devices=1",
          *QUICK, f"--trainer.default_root_dir={tmp_path}"])  # fmt: skip
    assert plan_of(tmp_path)["strategy"] == "DataParallelStrategy"
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 2


def test_the_gpu_preset_with_the_cpu_after_it_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    main(["fit", *TINY, "--config", "configs/trainer/gpu.yaml", "--trainer.accelerator=cpu", *QUICK,
          f"--trainer.default_root_dir={tmp_path}"])  # fmt: skip
    assert plan_of(tmp_path)["accelerator"] == "CPUAccelerator"


def test_the_cpu_preset_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    main(["fit", *TINY, "--config", "configs/trainer/cpu.yaml", *QUICK, f"--trainer.default_root_dir={tmp_path}"])
    assert plan_of(tmp_path)["world_size"] == 1


def test_several_nodes_without_a_launcher_are_refused_instead_of_waiting_forever(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    for name in ("NODE_RANK", "MASTER_ADDR", "SLURM_NTASKS", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    args = ["--config", "configs/trainer/multinode.yaml", "--trainer.accelerator=cpu", "--trainer.devices=1", *QUICK]
    error = error_line(capsys, [*TINY, *args, f"--trainer.default_root_dir={tmp_path / 'run'}"])
    assert error.startswith("error: --trainer.num_nodes=2 (set by configs/trainer/multinode.yaml) needs the command")
    assert "Fix: submit slurm/multi_node.sbatch" in error and "--trainer.num_nodes=1" in error
    assert not (tmp_path / "run").exists()


# -- --compile compiles the model's forward, and only that --------------------------------------------------------


def test_compile_puts_a_compiled_forward_on_the_module_and_takes_it_back():
    model = TinyClassifier()
    trainer = SimpleNamespace(strategy=SingleDeviceStrategy(CPU))
    callback = CompileModel(backend="eager")
    callback.setup(trainer, model, "fit")
    assert "forward" in model.__dict__ and model._compiled_call_impl is None  # the call itself (and a step) is not
    features = torch.randn(4, 16)
    assert torch.equal(model(features), type(model).forward(model, features))
    callback.setup(trainer, model, "fit")  # a second stage does not compile the compiled function again
    callback.teardown(trainer, model, "fit")
    assert "forward" not in model.__dict__


# under ddp, with inductor, over training and validation: tests/examples/test_image.py and test_gpt_model_parallel.py
