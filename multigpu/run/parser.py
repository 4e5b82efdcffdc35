"""The engine's options on top of LightningCLI's, ``--config``'s help, and a parser whose errors are one paragraph."""

from __future__ import annotations

import re
import sys
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal, NoReturn

import yaml
from jsonargparse import ActionConfigFile, Namespace
from lightning.pytorch.cli import LightningArgumentParser

from multigpu.checkpoints.resume import checkpoint_dir
from multigpu.command import prog
from multigpu.errors import debug_mode
from multigpu.facts.argv import load_config_file, yaml_problem
from multigpu.run.trainer import CALLBACK_OPTIONS, COLLECTIVE_TIMEOUT_S, OPTIONAL_CALLBACKS
from multigpu.strategies.pipeline import PipelineOptions

#: each parser's defaults during one parse: jsonargparse computes a subcommand's twice, reading the config each time
_defaults_of_this_parse: ContextVar[dict[int, tuple[Any, Namespace]] | None] = ContextVar("defaults", default=None)
#: the whole command's arguments: a subcommand's parser, given only its share, judges its errors by them
_arguments_of_this_parse: ContextVar[list[str]] = ContextVar("arguments", default=[])  # noqa: B039


class TemplateArgumentParser(LightningArgumentParser):
    """LightningCLI's parser with short errors: the message and where to look, not the 150-line usage."""

    #: the project's default config: an error about a key no argument gave is about it
    default_config: Path | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # `--trainer.max_epoch` must not silently mean max_epochs
        self.reads_defaults = bool(kwargs.get("default_config_files"))
        super().__init__(*args, **kwargs)

    def parse_args(self, args: Any = None, *rest: Any, **kwargs: Any) -> Namespace:
        if _defaults_of_this_parse.get() is not None:
            return super().parse_args(args, *rest, **kwargs)
        listed = isinstance(args, (list, tuple, type(None)))
        _arguments_of_this_parse.set([str(a) for a in (sys.argv[1:] if args is None else args)] if listed else [])
        # jsonargparse reports a YAML syntax error without the file's name
        problem = yaml_problem(sys.argv[1:] if args is None else args)
        if problem is not None and self.exit_on_error and not debug_mode():
            sys.stderr.write(f"error: {problem}\n")
            self.exit(2)
        token = _defaults_of_this_parse.set({})
        try:
            return super().parse_args(args, *rest, **kwargs)
        finally:
            _defaults_of_this_parse.reset(token)

    def get_defaults(self, skip_validation: bool = False, **kwargs: Any) -> Namespace:
        """jsonargparse's defaults, the default config files read once per parse."""
        computed = _defaults_of_this_parse.get()
        if computed is None or not self.reads_defaults:
            return super().get_defaults(skip_validation, **kwargs)
        if id(self) not in computed:  # the parser is kept with its defaults, so that its id is not reused
            computed[id(self)] = (self, super().get_defaults(skip_validation, **kwargs))
        return computed[id(self)][1].clone()

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error or debug_mode():
            super().error(message, ex)
        message = " ".join(message.split())
        in_default = self.default_config_key(message)
        if in_default is not None:  # jsonargparse names the key, not the file it read it from
            sys.stderr.write(
                f"error: {self.default_config}: {message}\nFix: correct {in_default!r} in {self.default_config} (read"
                f" first by every subcommand); `{prog()} fit --help` lists every option.\n"
            )
            self.exit(2)
        sys.stderr.write(
            f"error: {message}\nFix: correct that option. `{prog()} fit --help` (or validate, test, predict, tune)"
            " lists every option; `--model.help CLASS` and `--data.help CLASS` a model's or data module's.\n"
        )
        self.exit(2)

    def default_config_key(self, message: str) -> str | None:
        """The key the error ``message`` names where the default config sets it and no argument does."""
        if self.default_config is None or not self.default_config.is_file():
            return None
        try:
            keys = set(flat_keys(load_config_file(str(self.default_config))))
        except (OSError, yaml.YAMLError):
            return None
        for key in re.findall(r"['\"]([\w.]+)['\"]", message):
            given = any(a.lstrip("-").startswith(key) for a in _arguments_of_this_parse.get())
            if key in keys and not given:
                return key
        return None


def flat_keys(config: Any, prefix: str = "") -> list[str]:
    if not isinstance(config, dict):
        return []
    keys = []
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        keys += [dotted, *flat_keys(value, dotted + ".")]
    return keys


def add_template_options(parser: LightningArgumentParser) -> None:
    """The options the template adds to every subcommand (docs/command_line.md, \"The options the engine adds\")."""
    # instantiated by the parser, put in order by `run_callbacks`, not appended by LightningCLI
    for key, callback_class in CALLBACK_OPTIONS.items():
        parser.add_class_arguments(callback_class, key, fail_untyped=False, instantiate=True, sub_configs=True)
    parser.set_defaults(
        {
            "checkpoint.monitor": "val/loss",
            "checkpoint.mode": "min",
            "checkpoint.save_last": True,
            "checkpoint.filename": "best-{step}",
            "checkpoint.auto_insert_metric_name": False,
            "checkpoint.enable_version_counter": False,  # a resumed run overwrites its own last.ckpt
        }
    )
    parser.link_arguments("trainer.default_root_dir", "checkpoint.dirpath", compute_fn=checkpoint_dir)
    parser.add_argument(
        "--callbacks_off",
        type=list[Literal[OPTIONAL_CALLBACKS]],  # type: ignore[valid-type]
        default=[],
        help="The template's optional callbacks to leave out of this run, e.g. [throughput,run_plan]; every"
        " callback the template adds is listed in multigpu/run/trainer.py (run_callbacks).",
    )
    parser.add_argument(
        "--progress_bar",
        type=Literal["auto", "rich", "plain", "none"],
        default="auto",
        help="Progress output: auto (Rich on a terminal, plain lines otherwise), rich, plain or none.",
    )
    parser.add_argument(
        "--compile",
        type=bool,
        default=False,
        help="Compile the model's forward with torch.compile (multigpu/strategies/compile.py): single device, ddp and"
        " ddp_spawn (other strategies are refused before launch); checkpoints keep their keys. For a mode or"
        " backend, add multigpu.strategies.compile.CompileModel to --trainer.callbacks instead.",
    )
    parser.add_argument(
        "--batch_size_per_process",
        type=bool,
        default=False,
        help="What the batch_size of a training DataLoader that a data module or model returns means: false (the"
        " default), the global batch of one optimizer step over all processes and accumulated micro-batches, as"
        " GlobalBatchDataModule's --data.batch_size; true, each process's micro-batch (Lightning's meaning, so the"
        " global batch grows with the device count). docs/engine.md, 'Your own DataLoader'.",
    )
    parser.add_class_arguments(PipelineOptions, "pipeline")
    parser.add_argument(
        "--collective_timeout",
        type=float | None,
        default=COLLECTIVE_TIMEOUT_S,
        help="Seconds a collective of several processes waits for the other ranks before the job fails, so that a"
        " stuck or dead rank cannot hang the job; for a strategy given by name (ddp, ddp_spawn, fsdp2,"
        " tensor_parallel, and auto with several processes). null leaves Lightning's own default (30 minutes). A"
        " strategy given as a class (class_path, with its init_args) keeps its own timeout. Raise it if rank 0"
        " alone does long work (a download). The ranks' start (until all have joined) waits 30 minutes however"
        " short this is.",
    )


def add_config_option(parser: LightningArgumentParser) -> None:
    """``--config``, with a help that says how files and flags combine."""
    parser.add_argument(
        "-c",
        "--config",
        action=ActionConfigFile,
        help="Path to a YAML (or JSON) config file; give it several times to combine files. Arguments apply in"
        " order and a later one wins: a --config file overrides the flags given before it, a flag overrides the"
        " files before it. Put --config files first and flags after them.",
    )
