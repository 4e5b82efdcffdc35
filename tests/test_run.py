"""One run of the command line (multigpu/run.py), put together in the order it happens: the facts derived once, the
checks before anything is taken, the callbacks in the order of the one list, held as built through a fit."""

from __future__ import annotations

from multigpu.cli import TemplateCLI, run_cli
from tests.conftest import TINY


def test_the_trainer_holds_the_callbacks_in_the_order_of_the_one_list_and_nothing_moves_during_a_fit(tmp_path):
    args = [*TINY, "--trainer.enable_model_summary=true", "--progress_bar=plain", "--trainer.max_time=00:00:01:00"]
    cli = TemplateCLI(args=[*args, "--trainer.callbacks+=tests.helpers.Pace"], run=False)
    held = [type(callback).__name__ for callback in cli.trainer.callbacks]
    assert held == [
        "Pace",  # yours first
        "SpeedMonitor",  # before the bar, which shows the interval it measured
        "PlainProgressBar",
        "ModelSummary",
        "EngineLoaders",
        "ExactContinuation",
        "RandomState",
        "RunTimer",
        "PreemptionCheckpoint",
        "StragglerReport",
        "RunPlan",
        "NonFiniteLossGuard",
        "PrecisionBeforeRestore",
        "Float64Metrics",
        "StackDumps",  # before StopOtherRanksOnError: the other ranks' stacks are taken before they are killed
        "StopOtherRanksOnError",
        "UnshareSpawnedTensors",
        "DestroyProcessGroupAtExit",
        "SaveConfigCallback",  # LightningCLI's, which saves config.yaml
        "RunCheckpoint",  # Lightning moves a ModelCheckpoint last
    ]
    run_dir = tmp_path / "run"
    fitted = TemplateCLI(args=["fit", *args, "--trainer.max_steps=2", f"--trainer.default_root_dir={run_dir}"])
    assert [type(callback).__name__ for callback in fitted.trainer.callbacks] == held[1:]  # as built, after the fit


def test_the_facts_of_a_resumed_run_name_its_checkpoint_classes_and_processes(tmp_path):
    run_dir = tmp_path / "run"
    common = ["fit", *TINY, "--trainer.limit_val_batches=0", f"--trainer.default_root_dir={run_dir}"]
    first = TemplateCLI(args=[*common, "--trainer.max_steps=2"])
    assert first.facts.checkpoint is None and first.facts.run_dir == run_dir
    resumed = TemplateCLI(args=[*common, "--trainer.max_steps=3", "--ckpt_path=last"])
    facts = resumed.facts
    assert facts.checkpoint == run_dir / "checkpoints" / "last.ckpt"
    assert (facts.subcommand, facts.accelerator, facts.devices, facts.processes) == ("fit", "cpu", 1, 1)
    assert facts.model_class == "tests.fixtures.workload.TinyClassifier"
    assert facts.data_class == "tests.fixtures.workload.TinyData"
    assert resumed.trainer.global_step == 3  # it resumed from step 2


def test_a_refused_option_is_refused_before_the_run_directory_is_taken_or_anything_built(tmp_path, capsys):
    run_dir = tmp_path / "new"
    try:
        run_cli(["fit", *TINY, "--trainer.devices=0", f"--trainer.default_root_dir={run_dir}"], TemplateCLI)
    except SystemExit as stop:
        assert stop.code == 2
    else:
        raise AssertionError("--trainer.devices=0 was not refused")
    assert "--trainer.devices must be at least 1" in capsys.readouterr().err
    assert not run_dir.exists()  # no lock, no logs, no checkpoints: nothing was taken


def test_a_subclass_hooks_run_where_the_run_puts_them_and_instantiate_classes_is_refused(tmp_path):
    import pytest

    seen: list[str] = []

    class Hooked(TemplateCLI):
        def before_instantiate_classes(self) -> None:
            seen.append(f"before, run directory held: {(self.facts.run_dir / '.run.lock').is_file()}")

        def after_instantiate_classes(self) -> None:
            seen.append(f"after, Trainer of {self.trainer.max_steps} steps")

        def fit(self, **kwargs) -> None:
            seen.append("fit")
            super().fit(**kwargs)

    run_dir = tmp_path / "run"
    cli = Hooked(args=["fit", *TINY, "--trainer.max_steps=2", f"--trainer.default_root_dir={run_dir}"])
    assert seen == ["before, run directory held: True", "after, Trainer of 2 steps", "fit"]
    assert cli.trainer.global_step == 2
    with pytest.raises(TypeError, match="instantiate_classes is never called"):

        class Skipped(TemplateCLI):
            def instantiate_classes(self) -> None: ...


def test_lightningclis_own_steps_run_after_the_run_is_taken_the_checkpoints_options_the_seed_and_the_hooks(tmp_path):
    import torch

    run_dir = tmp_path / "run"
    common = [*TINY, "--trainer.limit_val_batches=0", f"--trainer.default_root_dir={run_dir}"]
    TemplateCLI(args=["fit", *common, "--model.init_args.hidden=8", "--trainer.max_steps=1"])
    seen: list[tuple] = []

    class Hooked(TemplateCLI):
        def before_instantiate_classes(self) -> None:
            options = self.chosen()
            seen.append(("before", options.model.init_args.hidden, options.seed_everything, torch.initial_seed()))

        def before_validate(self) -> None:
            seen.append(("before_validate", self.trainer.validating))

    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    torch.manual_seed(0)
    cli = Hooked(args=["validate", *common, f"--ckpt_path={checkpoint}", "--seed_everything=7"])
    # the checkpoint's model options replaced tiny.yaml's (hidden 32) and the seed was set, before anything was built
    assert seen[0] == ("before", 8, 7, 7)
    assert cli.facts.checkpoint == checkpoint and cli.model.hparams.hidden == 8
    assert cli.model.hparams.get("_instantiator")  # the parsed options kept, for load_from_checkpoint
    assert seen[1:] == [("before_validate", False)]  # LightningCLI's hook around the subcommand, which then ran
    assert cli.trainer.validating is False and cli.trainer.state.fn == "validate"
