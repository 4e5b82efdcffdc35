"""The command line: defaults, config round trips, env vars, any model/data class (bad input: test_errors.py)."""

import builtins
import io
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.strategies import StrategyRegistry

from multigpu.compat import collective_timeout
from multigpu.strategies.model_parallel import ClipAcrossMeshes
from tests.cli import CLI, DEFAULT_CONFIG, main
from tests.conftest import REPO, TINY, cli_env, last_value, read_metrics


def print_config(capsys, *args: str) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *args, "--print_config"])
    assert exit_info.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


def test_the_imports_run_without_garbage_collection_which_resumes_as_it_was():
    """Every process of a run imports ``multigpu.run.cli`` first: the collector is off while torch and Lightning are
    imported, their objects are frozen out of later collections, and collection resumes only if it was on."""
    probe = (
        "import gc, runpy\n"
        "import multigpu.run.cli\n"
        "print(gc.isenabled(), gc.get_freeze_count())\n"
        "gc.disable()\n"
        "runpy.run_path(multigpu.run.cli.__file__, run_name='again')\n"
        "print(gc.isenabled())\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=cli_env(), capture_output=True, text=True)
    enabled, frozen, enabled_when_off_before = done.stdout.split()
    assert (enabled, enabled_when_off_before) == ("True", "False"), done.stderr[-2000:]
    assert int(frozen) > 100_000  # torch's, Lightning's and the template's objects


# -- configuration ------------------------------------------------------------------------------------------


def test_print_config_round_trips(tmp_path, capsys):
    first = print_config(capsys, *TINY, "--model.init_args.hidden=12", "--trainer.max_steps=7")
    saved = tmp_path / "resolved.yaml"
    saved.write_text(yaml.safe_dump(first))
    assert print_config(capsys, "--config", str(saved)) == first
    assert first["model"]["class_path"] == "tests.fixtures.workload.TinyClassifier"
    assert first["model"]["init_args"]["hidden"] == 12 and first["trainer"]["max_steps"] == 7


def test_configs_compose_in_order_and_flags_win(tmp_path, capsys):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("trainer:\n  max_steps: 11\n  log_every_n_steps: 3\n")
    b.write_text("trainer:\n  max_steps: 22\n")
    config = print_config(capsys, *TINY, "--config", str(a), "--config", str(b))
    assert config["trainer"]["max_steps"] == 22 and config["trainer"]["log_every_n_steps"] == 3
    config = print_config(capsys, *TINY, "--config", str(b), "--config", str(a), "--trainer.log_every_n_steps=5")
    assert config["trainer"]["max_steps"] == 11 and config["trainer"]["log_every_n_steps"] == 5


def test_environment_variables_set_any_option(capsys, monkeypatch):
    monkeypatch.setenv("PL_FIT__TRAINER__MAX_STEPS", "33")
    # a class-path group (model, data) is set as a whole, in YAML or JSON
    monkeypatch.setenv("PL_FIT__DATA", "{class_path: tests.fixtures.workload.TinyData, init_args: {batch_size: 64}}")
    config = print_config(capsys)
    assert config["trainer"]["max_steps"] == 33
    assert config["data"]["class_path"] == "tests.fixtures.workload.TinyData"
    assert config["data"]["init_args"]["batch_size"] == 64
    # the environment comes after configs/default.yaml also where the arguments change its classes
    monkeypatch.delenv("PL_FIT__DATA")
    monkeypatch.setenv("PL_FIT__TRAINER__MAX_EPOCHS", "5")  # configs/default.yaml: 2
    config = print_config(capsys, *TINY_CLASSES)
    assert config["trainer"]["max_epochs"] == 5 and config["trainer"]["max_steps"] == 33
    assert config["seed_everything"] == 42  # the rest of configs/default.yaml
    assert config["model"]["init_args"]["optimizer"]["init_args"]["lr"] == 0.001  # TinyClassifier's own


TINY_CLASSES = ["--model=tests.fixtures.workload.TinyClassifier", "--data=tests.fixtures.workload.TinyData"]


@pytest.mark.parametrize("how", ["flags", "config-file", "short-name"])
def test_other_classes_start_from_their_own_defaults_in_one_parse(how, tmp_path, capsys, monkeypatch):
    classes = tmp_path / "classes.yaml"  # a config file naming both classes
    classes.write_text(
        "model:\n  class_path: tests.fixtures.workload.TinyClassifier\ndata: tests.fixtures.workload.TinyData\n"
    )
    chosen = {
        "flags": TINY_CLASSES,
        "config-file": ["--config", str(classes)],
        "short-name": ["--model=TinyClassifier", TINY_CLASSES[1]],  # resolved by the parser: parsed twice
    }[how]
    parses, reads = [], []
    parse_arguments, read_text = LightningCLI.parse_arguments, Path.read_text

    def counted_parse(self, parser, args):
        parses.append(args)
        return parse_arguments(self, parser, args)

    def counted_read(self, *args, **kwargs):
        reads.extend([self] if self.name == DEFAULT_CONFIG.name else [])
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(LightningCLI, "parse_arguments", counted_parse)
    monkeypatch.setattr(Path, "read_text", counted_read)
    config = print_config(capsys, *chosen)
    assert len(parses) == (2 if how == "short-name" else 1)
    assert len(reads) <= 1  # the engine's own read; the parser then reads none of configs/default.yaml
    # TinyClassifier's own learning rate, not configs/default.yaml's AdamW section (lr 0.003), which it shares
    assert config["model"]["init_args"]["optimizer"]["init_args"]["lr"] == 0.001
    assert config["data"]["class_path"] == "tests.fixtures.workload.TinyData"


class Parsed(Exception):
    """Raised by ``ParseOnly`` once the arguments are parsed, before anything is built."""


class ParseOnly(CLI):
    """The command line up to its parse, keeping the parsers it built (in ``built``, of the class)."""

    built: list = []

    def add_arguments_to_parser(self, parser) -> None:
        ParseOnly.built.append(parser)
        super().add_arguments_to_parser(parser)

    def before_instantiate_classes(self) -> None:
        raise Parsed(self)


def class_named(section) -> str:
    """The class path a config section names, in any form jsonargparse reads: ``model: pkg.Model``, or a mapping
    with ``class_path`` (block or flow style, with or without ``init_args``)."""
    return section["class_path"] if isinstance(section, dict) else section


def default_config_in(form: str, tmp_path: Path) -> Path:
    """The project's configs/default.yaml as it is, or with its model named in another valid form."""
    if form == "as the project has it":
        return DEFAULT_CONFIG
    config = yaml.safe_load(DEFAULT_CONFIG.read_text())
    model = class_named(config.pop("model"))
    named = {"flow mapping": f"model: {{class_path: {model}}}\n", "block mapping": f"model:\n  class_path: {model}\n"}
    path = tmp_path / "configs" / DEFAULT_CONFIG.name
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(config, sort_keys=False) + named[form])
    return path


@pytest.mark.parametrize("form", ["as the project has it", "flow mapping", "block mapping"])
def test_a_run_builds_its_subcommands_parser_alone_and_reads_the_default_config(form, capsys, monkeypatch, tmp_path):
    default_config = default_config_in(form, tmp_path)
    monkeypatch.setattr(ParseOnly, "default_config", default_config)
    default = yaml.safe_load(default_config.read_text())  # what the run must find in it
    opened, real_open = [], builtins.open

    def counted_open(file, *args, **kwargs):
        opened.extend([file] if Path(str(file)).name == DEFAULT_CONFIG.name else [])
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counted_open)  # jsonargparse's reads
    monkeypatch.setattr(io, "open", counted_open)  # pathlib's
    ParseOnly.built.clear()
    with pytest.raises(Parsed) as parsed:
        # a run directory of its own: the project's runs/default may hold the README's first run
        ParseOnly(["fit", "--trainer.max_steps=3", f"--trainer.default_root_dir={tmp_path / 'run'}"])
    cli = parsed.value.args[0]
    # jsonargparse reads configs/default.yaml for the subcommand's arguments and again when the main parser merges
    # the environment (a few milliseconds each); no other reader
    assert len(ParseOnly.built) == 1 and 1 <= len(opened) <= 2
    named, resolved = class_named(default["model"]), cli.config.fit.model.class_path
    # a class path as it is, or a short name (`model: MyModel`) as the parser resolved it
    assert resolved == named or ("." not in named and resolved.endswith(f".{named}"))
    assert cli.config.fit.trainer.max_steps == 3
    assert cli.config.fit.trainer.max_epochs == default["trainer"]["max_epochs"]  # read from configs/default.yaml
    # the main parser's help lists every subcommand: each one's parser is built for it
    ParseOnly.built.clear()
    with pytest.raises(SystemExit):
        ParseOnly(["--help"])
    assert len(ParseOnly.built) == 5 and "{fit,validate,test,predict,tune}" in capsys.readouterr().out


def test_help_lists_model_data_and_optimizer_options(capsys):
    with pytest.raises(SystemExit):
        main(["fit", *TINY, "--model.help", "tests.fixtures.workload.TinyClassifier"])
    out = capsys.readouterr().out
    assert "--model.hidden" in out and "--model.optimizer" in out and "Optimizer class and options" in out
    with pytest.raises(SystemExit):
        main(["fit", *TINY, "--help"])
    out = capsys.readouterr().out
    for option in ("--trainer.strategy", "--trainer.precision", "--checkpoint.monitor", "--preemption.signal_name"):
        assert option in out


CUSTOM_MODULE = textwrap.dedent(
    '''
    """A model and data module that exist only in this test."""
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset


    class LineFit(L.LightningModule):
        def __init__(self, lr: float = 0.1):
            super().__init__()
            self.lr = lr
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train/mse", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val/loss", torch.nn.functional.mse_loss(self.layer(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr)


    class LineData(L.LightningDataModule):
        def __init__(self, slope: float = 3.0, batch_size: int = 16):
            super().__init__()
            self.slope, self.batch_size = slope, batch_size

        def _loader(self):
            x = torch.linspace(-1, 1, 64).unsqueeze(1)
            return DataLoader(TensorDataset(x, self.slope * x), batch_size=self.batch_size)

        def train_dataloader(self):
            return self._loader()

        def val_dataloader(self):
            return self._loader()
    '''
)


def test_any_importable_model_and_data_module_can_be_trained(tmp_path, monkeypatch):
    (tmp_path / "my_pkg").mkdir()
    (tmp_path / "my_pkg" / "__init__.py").write_text(CUSTOM_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))  # importable as a user's package is, from the path
    run_dir = tmp_path / "run"
    main(
        [
            "fit",
            "--model=my_pkg.LineFit",
            "--data=my_pkg.LineData",
            "--data.init_args.slope=2.5",
            "--trainer.accelerator=cpu",
            "--trainer.max_epochs=30",
            "--progress_bar=none",
            f"--trainer.default_root_dir={run_dir}",
        ]
    )
    rows = read_metrics(run_dir)
    assert last_value(rows, "val/loss") < 0.05  # it learned y = 2.5 x
    saved = yaml.safe_load((run_dir / "logs" / "version_0" / "config.yaml").read_text())
    assert saved["model"]["class_path"] == "my_pkg.LineFit"
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    sys.modules.pop("my_pkg", None)


def test_resumed_run_reuses_its_directory_and_keeps_earlier_logs(tmp_path):
    run_dir = tmp_path / "run"
    common = [*TINY, f"--trainer.default_root_dir={run_dir}", "--trainer.limit_val_batches=2", "--progress_bar=none"]
    main(["fit", *common, "--trainer.max_steps=6"])
    first_metrics = (run_dir / "logs" / "version_0" / "metrics.csv").read_bytes()
    main(["fit", *common, "--trainer.max_steps=12", "--ckpt_path=last"])
    assert (run_dir / "logs" / "version_0" / "metrics.csv").read_bytes() == first_metrics
    assert (run_dir / "logs" / "version_1" / "config.yaml").is_file()
    import torch

    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 12


class WithTags(CLI):
    """A project's command line with an option of its own, added as Lightning's docs show (no ``super()``), and a
    linked argument: the contract of docs/engine.md, "Extending the command line"."""

    seen: dict = {}

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument("--tags", type=list[str], default=[], help="labels of this run")
        parser.link_arguments("trainer.max_steps", "model.init_args.hidden")

    def before_fit(self) -> None:
        WithTags.seen = {"tags": self.config.fit.tags, "hidden": self.model.hparams.hidden}


def test_a_project_subclass_adds_an_option_and_keeps_every_option_of_the_engine(tmp_path):
    from multigpu import run_cli

    run_dir = tmp_path / "run"
    args = [*TINY, f"--trainer.default_root_dir={run_dir}", "--trainer.max_steps=3", "--progress_bar=none"]
    # --checkpoint.* and --callbacks_off are the engine's: they are there although the subclass calls no super()
    run_cli(["fit", *args, "--tags=[a,b]", "--checkpoint.save_top_k=0", "--callbacks_off=[run_plan]"], WithTags)
    assert WithTags.seen == {"tags": ["a", "b"], "hidden": 3}
    assert (run_dir / "checkpoints" / "last.ckpt").is_file() and not (run_dir / "run_plan.json").exists()
    with pytest.raises(SystemExit) as refused:  # a wrong value of the project's option: jsonargparse's error
        run_cli(["fit", *args, "--tags=7"], WithTags)
    assert refused.value.code == 2


def test_cli_builds_the_objects_without_running_for_notebooks_and_scripts():
    from tests.cli import CLI
    from tests.fixtures.workload import TinyClassifier, TinyData

    cli = CLI(args=[*TINY, "--trainer.max_steps=3", "--data.init_args.batch_size=64"], run=False)
    assert isinstance(cli.model, TinyClassifier) and isinstance(cli.datamodule, TinyData)
    assert cli.trainer.max_steps == 3 and cli.datamodule.batch_size == 64


# -- strategies given by name and as a class -------------------------------------------------------------------

STRATEGY_CLASSES = [
    "lightning.pytorch.strategies.DDPStrategy",
    "lightning.pytorch.strategies.ModelParallelStrategy",
    "multigpu.strategies.FSDP2Strategy",  # fsdp2's class
    "multigpu.strategies.TensorParallelStrategy",  # tensor_parallel's class
]


@pytest.mark.parametrize("class_path", STRATEGY_CLASSES)
def test_a_strategy_given_as_a_class_in_yaml_keeps_its_own_timeout(tmp_path, class_path):
    config = tmp_path / "strategy.yaml"
    config.write_text(f"trainer:\n  strategy:\n    class_path: {class_path}\n    init_args:\n      timeout: 0:01:00\n")
    # two CPU processes: the strategy is built, the processes start only at fit
    args = [*TINY, "--trainer.devices=2", "--config", str(config), "--collective_timeout=42"]
    cli = CLI(args=args, run=False)
    assert type(cli.trainer.strategy).__name__ == class_path.rpartition(".")[2] and cli.trainer.world_size == 2
    assert collective_timeout(cli.trainer.strategy) == timedelta(seconds=60)


def test_a_strategy_class_on_the_command_line_keeps_its_settings_and_gets_the_clipping_across_meshes():
    model_parallel = "lightning.pytorch.strategies.ModelParallelStrategy"
    args = [f"--trainer.strategy.class_path={model_parallel}", "--trainer.strategy.init_args.timeout=0:01:00"]
    cli = CLI(args=[*TINY, "--trainer.devices=2", *args], run=False)
    assert collective_timeout(cli.trainer.strategy) == timedelta(seconds=60)
    assert sum(isinstance(c, ClipAcrossMeshes) for c in cli.trainer.callbacks) == 1
    # its import path alone is the class with its own defaults (jsonargparse keeps it as a string, a name)
    cli = CLI(args=[*TINY, "--trainer.devices=2", f"--trainer.strategy={model_parallel}"], run=False)
    assert type(cli.trainer.strategy).__name__ == "ModelParallelStrategy"
    assert collective_timeout(cli.trainer.strategy) == default_pg_timeout
    assert any(isinstance(c, ClipAcrossMeshes) for c in cli.trainer.callbacks)
    # the template's classes clip across meshes themselves
    cli = CLI(args=[*TINY, "--trainer.devices=2", "--trainer.strategy=tensor_parallel"], run=False)
    assert not any(isinstance(c, ClipAcrossMeshes) for c in cli.trainer.callbacks)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_collective_timeout_null_leaves_lightnings_default_to_a_strategy_by_name(strategy):
    args = [*TINY, "--trainer.devices=2", f"--trainer.strategy={strategy}"]
    cli = CLI(args=[*args, "--collective_timeout=null"], run=False)
    assert collective_timeout(cli.trainer.strategy) == default_pg_timeout  # 30 minutes
    cli = CLI(args=[*args, "--collective_timeout=60"], run=False)
    assert collective_timeout(cli.trainer.strategy) == timedelta(seconds=60)
    # the options reach the one strategy the Trainer builds: the registry keeps Lightning's own
    assert StrategyRegistry[strategy]["init_params"] == ({"start_method": "popen"} if strategy == "ddp" else {})


class Built(Exception):
    """Raised by ``OptionsChangedAfterFacts`` once the Trainer is built, before the subcommand runs."""


class OptionsChangedAfterFacts(CLI):
    """Changes every option a step after the facts could read, as soon as the facts are derived."""

    def take_run(self) -> None:
        options = self.chosen()
        changed = {"callbacks_off": [], "progress_bar": "plain", "batch_size_per_process": True}
        for key, value in {**changed, "collective_timeout": 7.0, "ckpt_path": "missing.ckpt"}.items():
            options[key] = value
        options.data.init_args.batch_size = 33  # two processes cannot share it: check_before_launch would refuse
        super().take_run()

    def before_fit(self) -> None:
        raise Built(self)


def test_no_step_after_the_facts_reads_the_options(tmp_path):
    """The checks, the run directory, the checkpoint, the callbacks and the Trainer's settings follow the facts."""
    with pytest.raises(Built) as built:
        OptionsChangedAfterFacts(args=[
            "fit", *TINY, "--trainer.accelerator=cpu", "--trainer.strategy=ddp_spawn", "--trainer.devices=2",
            "--callbacks_off=[throughput,run_plan]", "--progress_bar=none", "--collective_timeout=42",
            f"--trainer.default_root_dir={tmp_path / 'run'}",
        ])  # fmt: skip
    cli = built.value.args[0]
    options, facts = cli.chosen(), cli.facts
    assert (options.collective_timeout, options.ckpt_path, options.progress_bar) == (7.0, "missing.ckpt", "plain")
    assert (facts.collective_timeout, facts.ckpt_path_option, facts.data_batch_size) == (42.0, None, 32)
    assert cli.resumed is None  # the facts' --ckpt_path (none), not the changed one that does not exist
    assert collective_timeout(cli.trainer.strategy).total_seconds() == 42
    kinds = {type(callback).__name__ for callback in cli.trainer.callbacks}
    assert not {"SpeedMonitor", "RunPlan"} & kinds and cli.trainer.progress_bar_callback is None
    loaders = next(callback for callback in cli.trainer.callbacks if type(callback).__name__ == "EngineLoaders")
    assert loaders.per_process is False
    assert cli.datamodule.batch_size == 33  # the objects are built from the options: building is no step's decision
